"""Generate argparse flags (with environment-variable defaults) from frozen config dataclasses."""
from __future__ import annotations

import argparse
import dataclasses
import os

ENV_PREFIX = "LLM_"


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


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
    raise TypeError(f"unsupported config annotation {annotation!r}")


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One `--flag` per field; an environment variable LLM_<FIELD> overrides the field default."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        typ = _scalar_type(f.type)
        flag = "--" + f.name.replace("_", "-")
        env = os.environ.get(env_name(f.name))
        default = f.default
        if env is not None:
            default = _parse_bool(env) if typ is bool else typ(env)
        shown = "(set)" if f.metadata.get("secret") and default is not None else default
        help_text = f"{f.metadata.get('help', '')} (env {env_name(f.name)}; default {shown})"
        if typ is bool:
            parser.add_argument(flag, dest=f.name, default=default, help=help_text,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, dest=f.name, type=typ, default=default, help=help_text)


def dataclass_from_args(cls, args: argparse.Namespace, **overrides):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(overrides)
    return cls(**values)

