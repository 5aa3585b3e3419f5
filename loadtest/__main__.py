"""Entry point of `python -m loadtest` (the benchmark) and `python -m loadtest soak` (hours of
mixed traffic with the server's resources sampled); see loadtest/README.md."""

import sys

if sys.argv[1:2] == ["soak"]:
    from loadtest.soak import main as soak_main

    sys.exit(soak_main(sys.argv[2:]))

from loadtest.cli import main  # noqa: E402 - only when it is not the soak

sys.exit(main())
