"""Generate argparse flags from frozen config dataclasses: one `--flag-name` per field.

A field declared with `opt(default, help, ...)` carries its help text and, where the annotation
alone does not say how, the parser of its command-line string (`parse=`) and extra argparse
settings (`choices=`, `metavar=`, `action="append"` or `"store_true"`). A bool field is
`--flag/--no-flag` unless it asks for `store_true`. With an environment prefix (the server's and
engine's `LLM_`), the variable PREFIX<FIELD> overrides the field default.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from typing import Any

ENV_PREFIX = "LLM_"


def opt(default: Any, help: str, *, parse: Callable[[str], Any] | None = None, secret: bool = False,
        **argparse_kwargs: Any) -> Any:
    """A dataclass field with what the CLI generator needs; `secret` hides a set value in --help."""
    return dataclasses.field(default=default, metadata={"help": help, "parse": parse, "secret": secret,
                                                        "argparse": argparse_kwargs})


def env_name(field_name: str, prefix: str = ENV_PREFIX) -> str:
    return prefix + field_name.upper()


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _scalar_type(annotation) -> type:
    """`int | None` -> int; plain types unchanged (annotations are strings under __future__)."""
    text = str(annotation)
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if text.startswith(name):
            return typ
    raise TypeError(f"unsupported config annotation {annotation!r}: give the field a parse function")


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (),
                       env_prefix: str | None = ENV_PREFIX) -> None:
    """One `--flag` per field of `cls` (but `skip`); env_prefix None: no environment variables."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        meta = f.metadata
        kwargs: dict[str, Any] = dict(meta.get("argparse", {}))
        parse = meta.get("parse") or _scalar_type(f.type)
        default: Any = f.default
        env = env_name(f.name, env_prefix) if env_prefix is not None else None
        if env is not None and os.environ.get(env) is not None:
            text = os.environ[env]
            if kwargs.get("nargs") in ("+", "*"):  # a list flag: the variable's words, each parsed
                default = tuple(parse(word) for word in text.split())
            else:
                default = _parse_bool(text) if parse is bool else parse(text)
        notes = [f"env {env}"] if env is not None else []
        if not (default is None or default is False or default == ()):
            notes.append(f"default {'(set)' if meta.get('secret') else default}")
        help_text = meta.get("help", "") + (f" ({'; '.join(notes)})" if notes else "")
        if parse is bool and "action" not in kwargs:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kwargs.get("action") != "store_true":
            kwargs["type"] = parse
        # argparse appends to the default itself: give it a fresh list (a tuple field gets it back
        # as a tuple from `dataclass_from_args`).
        kwargs["default"] = list(default) if kwargs.get("action") == "append" else default
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, help=help_text, **kwargs)


def dataclass_from_args(cls, args: argparse.Namespace, **overrides):
    """An instance of `cls` from the parsed flags (its fields only), with `overrides` on top."""
    values = {}
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if isinstance(f.default, tuple) and isinstance(value, list) else value
    values.update(overrides)
    return cls(**values)
