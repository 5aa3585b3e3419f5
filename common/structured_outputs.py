"""Structured outputs: from a request's StructuredOutputs to an xgrammar grammar, one way for all.

The tokenizer worker compiles each grammar first (with a time limit: a schema that does not
compile, or compiles too slowly, is a 400 naming its field before anything reaches the engine);
the engine compiles it again off its loop, in a thread (`engine.structured`). Both go through
`compile_structured`, so what the worker accepted is what the engine runs. xgrammar caches
compiled grammars by their source, so a schema sent again costs a lookup.

JSON whitespace is bounded (`MAX_WHITESPACE` characters in a row): without it a model can loop
on spaces or newlines between two JSON tokens until max_tokens. xgrammar is imported lazily:
this module stays importable without it (and without torch).
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from common.errors import InvalidRequest
from common.messages import StructuredOutputs

if TYPE_CHECKING:
    import xgrammar

MAX_WHITESPACE = 16  # characters of JSON whitespace in a row: enough for indented output
# Cap of the compiler's cache of compiled grammars (token masks for 49k tokens are ~MBs each).
COMPILER_CACHE_BYTES = 512 * 2**20
MAX_CHOICES = 1024


def json_object_spec(param: str) -> StructuredOutputs:
    """{"type": "json_object"}: any JSON object (as OpenAI's JSON mode)."""
    return StructuredOutputs("json_object", '{"type": "object"}', param)


def json_schema_spec(schema: Any, param: str) -> StructuredOutputs:
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest(param, "a JSON schema must be an object (or true / false)")
    return StructuredOutputs("json", json.dumps(schema), param)


def choice_spec(choices: list[str], param: str) -> StructuredOutputs:
    if not choices:
        raise InvalidRequest(param, "needs at least one choice")
    if len(choices) > MAX_CHOICES:
        raise InvalidRequest(param, f"at most {MAX_CHOICES} choices")
    return StructuredOutputs("choice", json.dumps(choices), param)


def new_compiler(tokenizer, vocab_size: int, stop_token_ids: list[int]) -> xgrammar.GrammarCompiler:
    """A compiler for this tokenizer; `vocab_size` is the model's (it may pad the tokenizer's)."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    # one thread: compiles run beside the engine's forward passes on the same cores
    return xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=COMPILER_CACHE_BYTES)


def compile_structured(compiler: xgrammar.GrammarCompiler, so: StructuredOutputs) -> xgrammar.CompiledGrammar:
    """The compiled grammar; InvalidRequest (naming so.param) when the source is not valid."""
    try:
        if so.kind in ("json", "json_object"):
            # strict (vLLM's default): properties a schema does not list are not generated; JSON
            # mode has no properties to list, so it allows any
            return compiler.compile_json_schema(so.spec, any_whitespace=True, max_whitespace_cnt=MAX_WHITESPACE,
                                                strict_mode=so.kind == "json")
        if so.kind == "regex":
            return compiler.compile_regex(so.spec)
        if so.kind == "choice":
            return compiler.compile_grammar(choice_ebnf(json.loads(so.spec)))
        if so.kind == "grammar":
            return compiler.compile_grammar(so.spec)
        return compiler.compile_structural_tag(so.spec)
    except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's parse and schema errors
        raise InvalidRequest(so.param, f"does not compile: {_reason(exc)}") from None


def choice_ebnf(choices: list[str]) -> str:
    """root ::= "a" | "b" ...: one of the strings, exactly. JSON string escapes are EBNF's too."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


# xgrammar's messages start "[time] /project/cpp/file.cc:94: " and may hold "Check failed: (...) is
# false: ": the reader wants what follows.
_NOISE = re.compile(r"^\[[0-9:]+\] \S+:\d+: |Check failed: \(.*?\) is false: ")


def _reason(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return _NOISE.sub("", lines[0]).strip()[:500] if lines else type(exc).__name__
