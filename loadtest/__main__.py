"""Entry point of `python -m loadtest`; see loadtest/README.md."""

import sys

from loadtest.cli import main

sys.exit(main())
