"""Cross-origin requests (CORS) for browser clients, with vLLM's flags; off unless origins are given.

A page on another origin may call the API only if the answer says so: Starlette's CORSMiddleware
answers the browser's preflight (OPTIONS with Access-Control-Request-Method) itself and adds the
Access-Control-Allow-* headers to every answer to an allowed origin. It is the outermost
middleware: a preflight carries no API key and must be answered before the key is checked, and
the 401 / 413 / 431 answers of the inner middleware need the headers too, or the page sees a
network error instead of the error body. Without --allowed-origins no CORS header is sent, and
browsers keep other origins out (vLLM allows every origin by default; a server that may hold an
API key does not open itself to every web page unless asked).
"""
from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware


def json_list(text: str) -> tuple[str, ...]:
    """A flag's JSON list of strings, as vLLM takes them: '["https://a.example", "http://localhost:3000"]'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not a JSON list of strings: {text!r}")
    return tuple(value)


def add_cors(app: FastAPI, origins: tuple[str, ...], methods: tuple[str, ...], headers: tuple[str, ...],
             allow_credentials: bool) -> None:
    """Add the middleware (call after every other middleware, so it runs first); nothing without origins."""
    if not origins:
        return
    app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=list(methods),
                       allow_headers=list(headers), allow_credentials=allow_credentials)
