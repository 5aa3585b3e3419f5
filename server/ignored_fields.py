"""OpenAI request fields that mean nothing to a local server: accepted, typed, and ignored.

They are about OpenAI's own service (storage of completions, billing tiers, abuse tracking, its
prompt cache's routing) or hints that only its models read (`verbosity`), or a latency hint whose
answer is the same without it (`prediction`). Clients send them as a matter of course (the
Agents SDK sends `store`, `metadata`, `verbosity` and the prompt-cache fields when they are set;
proxies forward `user` and `metadata`), and vLLM accepts them, so refusing them would break those
clients for nothing. Their types are still checked (a `store` of "yes" is a 400), and each is
marked in the OpenAPI document (`x-ignored`) with why it has no effect.

Fields whose effect this server cannot give are not here: they stay refused unless they carry
their neutral value (`server.protocol`: audio output, web search, moderation, `functions`).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


def ignored(why: str) -> Any:
    """A field that defaults to None, accepted and ignored, documented as such."""
    return Field(None, description=f"Accepted for compatibility with OpenAI's API and ignored: {why}.",
                 json_schema_extra={"x-ignored": True})


class IgnoredOpenAIFields(BaseModel):
    """Mixed into the generation endpoints' request models (which make it strict)."""

    user: str | None = ignored("an end-user id for OpenAI's abuse tracking and cache routing")
    store: bool | None = ignored("nothing is stored: every answer is returned once and kept nowhere")
    metadata: dict[str, str] | None = ignored("tags for completions stored at OpenAI; nothing is stored here")
    service_tier: str | None = ignored("OpenAI's billing and latency tiers; every request is served alike")
    safety_identifier: str | None = ignored("an end-user id for OpenAI's usage-policy checks")
    prompt_cache_key: str | None = ignored("routing to OpenAI's prompt cache; the prefix cache here matches "
                                           "prompts by their tokens")
    prompt_cache_retention: str | None = ignored("how long OpenAI keeps a cached prompt; the prefix cache here "
                                                 "keeps blocks until their memory is needed")
    prompt_cache_options: dict[str, Any] | None = ignored("breakpoints and lifetimes of OpenAI's prompt cache")
    verbosity: Literal["low", "medium", "high"] | None = ignored(
        "a length hint that only OpenAI's reasoning models read")
    prediction: dict[str, Any] | None = ignored(
        "predicted output, a latency hint: the answer is the same without it")
