"""The one error for bad input, raised wherever a request is checked (server, worker, engine).

It carries the field to blame apart from the reason, so whoever turns it into an answer (an
OpenAI 400 body's `param`, a RequestRejected, an error delta) reads `param` instead of parsing
it back out of the text. `str()` stays "<param>: <message>", the form every message had before.
"""
from __future__ import annotations


class InvalidRequest(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message
