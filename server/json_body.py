"""Strict JSON request bodies: what Python's json module lets through, refused with a 4xx.

`json.loads` on bytes decodes with "surrogatepass" and accepts `"\\ud800"` escapes, so a lone
UTF-16 surrogate reaches the handlers as a str that cannot be encoded again (msgpack, the
tokenizer and the error body all fail on it: a 500). It also keeps the last of duplicate keys
silently, which lets a proxy that reads the first one and this server disagree about a request.
Here a body must be valid UTF-8, every string (keys included) valid Unicode, every object free
of duplicate keys, nested at most MAX_NESTING_DEPTH deep, and every array at most
MAX_ARRAY_ITEMS long. NaN, Infinity and 1e999 stay parseable on purpose: the field checks
refuse them with a 400 that names the field.

`StrictJSONRoute` puts this parser under FastAPI: its requests answer `json()` with it, and
FastAPI passes the HTTPException it raises straight to the error handlers.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from server.errors import BodyParseError

# Our deepest body is 4 levels (messages[0].content[0].text); 32 leaves room for any client.
MAX_NESTING_DEPTH = 32
# Longer than any prompt in token ids (128 Ki-token contexts) or any list of messages; a 32 MiB
# body could otherwise hold 16 million items, each one a Python object to validate.
MAX_ARRAY_ITEMS = 1 << 18


class _DuplicateKeys(dict):
    """An object that had a key twice; the walk reports it with the key's full path."""

    duplicate: str


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    marked = _DuplicateKeys(obj)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.duplicate = key
            break
        seen.add(key)
    return marked


_decoder = json.JSONDecoder(object_pairs_hook=_object_pairs)


MAX_PARAM_CHARS = 200  # of a path in an error: it is built from the client's keys


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _error(status: int, where: str, problem: str) -> BodyParseError:
    param = where[:MAX_PARAM_CHARS] or None
    return BodyParseError(status, f"{param or 'body'}: {problem}", param)


def _check_string(s: str, where: str, what: str = "a string") -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise _error(400, where, f"{what} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                                     "escape); strings must be valid Unicode") from None


_CHECKED = (str, dict, list)


def check_json_value(value: Any) -> None:
    """Walks the parsed body once (iteratively: no recursion limit) and raises BodyParseError
    for the first string, object or array that breaks the rules above."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)] if isinstance(value, _CHECKED) else []
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, str):
            _check_string(node, where)
            continue
        if depth > MAX_NESTING_DEPTH:
            raise _error(400, where, f"JSON nested deeper than {MAX_NESTING_DEPTH} levels")
        if isinstance(node, dict):
            for key in node:  # first: the paths below, and any error, are built from the keys
                _check_string(key, where, "a key")
            if isinstance(node, _DuplicateKeys):
                raise _error(400, _path(where, node.duplicate), "duplicate key in a JSON object; each key may "
                                                                "appear once")
            stack.extend((item, _path(where, key), depth + 1) for key, item in node.items()
                         if isinstance(item, _CHECKED))
        else:
            if len(node) > MAX_ARRAY_ITEMS:
                raise _error(413, where, f"array of {len(node)} items; at most {MAX_ARRAY_ITEMS} are allowed")
            # Numbers need no check: a long array of token ids costs one pass and no paths.
            stack.extend((item, _path(where, i), depth + 1) for i, item in enumerate(node)
                         if isinstance(item, _CHECKED))


def parse_json_body(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")  # strict: invalid bytes and encoded surrogates both fail
    except UnicodeDecodeError as exc:
        raise BodyParseError(400, f"the body is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = _decoder.decode(text)
    except RecursionError:
        raise _error(400, "", f"JSON nested deeper than {MAX_NESTING_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise BodyParseError(400, f"malformed JSON body: {exc.msg} at character {exc.pos}") from None
    except ValueError:  # Python's cap on integer digits (int_max_str_digits, 4300 by default)
        raise BodyParseError(400, "malformed JSON body: a number with too many digits") from None
    check_json_value(value)
    return value


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json_body(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An APIRoute whose handler reads JSON bodies with `parse_json_body`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
