"""Entry point: `python -m server`. Kept import-free at the top level: the spawned child
processes import this module again, and must not load the web stack."""

if __name__ == "__main__":
    import sys

    from server.cli import main

    sys.exit(main())
