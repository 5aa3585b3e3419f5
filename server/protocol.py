"""Request bodies of the OpenAI API (and vLLM's extensions) as strict pydantic models.

Unknown fields are rejected (extra="forbid"), and so are known OpenAI fields this server does
not implement, unless they carry their neutral value (tools=[], response_format text, ...):
a request is never served with part of it silently ignored. Types are strict, and the body
itself was parsed by `server.json_body` (valid Unicode, no duplicate keys, bounded size). Range checks of the sampling
fields live in `common.validation`, shared with the engine.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# name -> is the value neutral (same as not sending the field)?
_NEUTRAL = {
    "tools": lambda v: v in (None, []),
    "tool_choice": lambda v: v in (None, "none"),
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none"),
    "parallel_tool_calls": lambda v: v is None or isinstance(v, bool),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "modalities": lambda v: v in (None, ["text"]),
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "store": lambda v: v in (None, False),
    "metadata": lambda v: v in (None, {}),
    "service_tier": lambda v: v in (None, "auto", "default"),
    "echo": lambda v: v in (None, False),
    "suffix": lambda v: v in (None, ""),
    "best_of": lambda v: v in (None, 1),
}


class StrictModel(BaseModel):
    # strict: JSON types are not coerced ("yes" is no boolean, false no token id, "4" no
    # integer); an integer is still a number where a float is expected.
    model_config = ConfigDict(extra="forbid", strict=True)


class UnsupportedFieldsCheck(StrictModel):
    """Rejects the known-but-unsupported fields listed in `unsupported`, by name."""

    unsupported: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _reject_unsupported(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        present = [name for name in cls.unsupported if name in data]
        for name in present:
            if not _NEUTRAL[name](data[name]):
                raise PydanticCustomError("unsupported_field", "{field} is not supported by this server",
                                          {"field": name})
        return {k: v for k, v in data.items() if k not in present} if present else data


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessageIn(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)  # vLLM's joining of text parts


class StreamOptions(StrictModel):
    include_usage: bool = False


class SamplingFields(UnsupportedFieldsCheck):
    """Fields both generation endpoints share (OpenAI's, then vLLM's extensions)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None  # None: 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for the caller's own abuse tracking; no effect here
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


class ChatCompletionRequest(SamplingFields):
    unsupported: ClassVar[tuple[str, ...]] = (
        "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "response_format", "modalities",
        "audio", "prediction", "web_search_options", "reasoning_effort", "store", "metadata", "service_tier")
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    add_generation_prompt: bool = True


class CompletionRequest(SamplingFields):
    unsupported: ClassVar[tuple[str, ...]] = ("echo", "suffix", "best_of", "store", "metadata", "service_tier")
    # One prompt or a batch: text, or token ids.
    prompt: str | Annotated[list[str], Field(min_length=1)] | Annotated[list[int], Field(min_length=1)] \
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    logprobs: int | None = None


class TokenizeBody(StrictModel):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeBody(StrictModel):
    model: str | None = None
    tokens: list[int]
