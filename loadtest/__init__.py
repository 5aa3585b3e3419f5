"""Load generator for OpenAI-compatible streaming servers, with vLLM's benchmark metrics.

Run `python -m loadtest --help`; loadtest/README.md describes the options, the metric
definitions, the output files and how to point it at this project's server.
"""
