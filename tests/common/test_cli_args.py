"""The one dataclass -> argparse generator, as the server (with LLM_ variables) and the load test
(without) use it."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from common.cli_args import add_dataclass_args, dataclass_from_args, opt


def _pair(text: str) -> tuple[int, int]:
    a, b = text.split(",")
    return int(a), int(b)


@dataclass(frozen=True)
class Settings:
    size: int | None = opt(None, "a size")
    cache: bool = opt(True, "a negatable switch")
    verbose: bool = opt(False, "a plain switch", action="store_true")
    names: tuple[str, ...] = opt((), "repeatable", parse=str, action="append")
    pair: tuple[int, int] | None = opt(None, "parsed by its own function", parse=_pair)
    key: str | None = opt(None, "a secret", secret=True)


def parse(argv: list[str], env_prefix: str | None = "LLM_") -> tuple[Settings, str]:
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Settings, env_prefix=env_prefix)
    return dataclass_from_args(Settings, parser.parse_args(argv)), parser.format_help()


def test_flags_types_and_actions():
    s, _ = parse(["--size", "3", "--no-cache", "--verbose", "--names", "a", "--names", "b", "--pair", "1,2"])
    assert s == Settings(size=3, cache=False, verbose=True, names=("a", "b"), pair=(1, 2))
    assert parse([])[0] == Settings()


def test_environment_variables_only_with_a_prefix(monkeypatch):
    monkeypatch.setenv("LLM_SIZE", "7")
    monkeypatch.setenv("LLM_CACHE", "off")
    monkeypatch.setenv("LLM_KEY", "sk-hidden")
    s, help_text = parse([])
    assert (s.size, s.cache, s.key) == (7, False, "sk-hidden")
    assert "env LLM_SIZE; default 7" in help_text and "sk-hidden" not in help_text and "(set)" in help_text
    assert parse(["--size", "1"])[0].size == 1  # the flag wins over the variable
    s, help_text = parse([], env_prefix=None)
    assert s == Settings() and "env " not in help_text
    monkeypatch.setenv("LLM_CACHE", "maybe")
    with pytest.raises(ValueError, match="not a boolean"):
        parse([])


@dataclass(frozen=True)
class Listed:
    aliases: tuple[str, ...] = opt((), "one or more words", parse=str, nargs="+")


def test_a_list_flag_takes_several_words_and_its_variable_splits_on_spaces(monkeypatch):
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Listed)
    assert dataclass_from_args(Listed, parser.parse_args(["--aliases", "a", "b"])) == Listed(("a", "b"))
    monkeypatch.setenv("LLM_ALIASES", "x  y z")
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Listed)
    assert dataclass_from_args(Listed, parser.parse_args([])) == Listed(("x", "y", "z"))


def test_the_cors_flags_take_json_lists():
    from server.config import parse_args

    server, _ = parse_args(["--allowed-origins", '["https://a.example", "http://localhost:3000"]',
                            "--served-model-name", "a", "b"])
    assert server.allowed_origins == ("https://a.example", "http://localhost:3000")
    assert server.allowed_methods == ("*",) and server.served_model_name == ("a", "b")
    with pytest.raises(SystemExit):
        parse_args(["--allowed-origins", "https://a.example"])  # not JSON: argparse's usage error
