"""The OpenAI-compatible HTTP server: `python -m server [MODEL]`."""
