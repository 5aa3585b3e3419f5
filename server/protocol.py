"""Request bodies of the OpenAI API (and vLLM's extensions) as strict pydantic models.

Unknown fields are rejected (extra="forbid"), and so are known OpenAI fields this server does
not implement, unless they carry their neutral value (functions=[], modalities ["text"], ...):
a request is never served with part of it silently ignored. The OpenAI fields that have no
effect on a local server (`user`, `store`, `metadata`, ...) are accepted and ignored, as vLLM
does (`server.ignored_fields`). Types are strict, and the body
itself was parsed by `server.json_body` (valid Unicode, no duplicate keys, bounded size). Range checks of the sampling
fields live in `common.validation`, shared with the engine.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from server.ignored_fields import IgnoredOpenAIFields

# name -> is the value neutral (same as not sending the field)?
_NEUTRAL = {
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none"),
    "modalities": lambda v: v in (None, ["text"]),
    "audio": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "moderation": lambda v: v is None,
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


class ToolCallFunction(StrictModel):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCallIn(StrictModel):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


def _tagged(tag_field: str, field: str):
    """A discriminated union on `tag_field`; each member's tag is "<field>[<value>]", so that error
    locations name the field and the members stay out of `param` (parts with "[" are dropped)."""
    def tag_of(value: Any) -> str | None:
        tag = value.get(tag_field) if isinstance(value, dict) else getattr(value, tag_field, None)
        return f"{field}[{tag}]" if isinstance(tag, str) else None

    # the error type names the tag field (a context dict would make the type unhashable)
    return Discriminator(tag_of, custom_error_type=f"invalid_tag:{tag_field}",
                         custom_error_message="not one of the allowed values")


def text_or_list(list_type: Any) -> Any:
    """`str | list_type`, told apart by the JSON type, so a refusal names the list's own field
    (`input[0].type`) rather than saying the value is no string."""
    def tag_of(value: Any) -> str:
        return "str" if isinstance(value, str) else "list[items]"

    return Annotated[Annotated[str, Tag("str")] | Annotated[list_type, Tag("list[items]")],
                     Discriminator(tag_of)]


class _Message(StrictModel):
    name: str | None = None

    def text(self) -> str:
        content = getattr(self, "content", None)
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "\n".join(part.text for part in content)  # vLLM's joining of text parts


class SystemMessage(_Message):
    role: Literal["system", "developer"]
    content: str | list[TextPart]


class UserMessage(_Message):
    role: Literal["user"]
    content: str | list[TextPart]


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None  # None: a turn of tool calls only
    tool_calls: list[ToolCallIn] | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str  # the call it answers


ChatMessageIn = Annotated[
    Annotated[SystemMessage, Tag("role[system]")] | Annotated[SystemMessage, Tag("role[developer]")]
    | Annotated[UserMessage, Tag("role[user]")] | Annotated[AssistantMessage, Tag("role[assistant]")]
    | Annotated[ToolMessage, Tag("role[tool]")], _tagged("role", "role")]


_TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names


class FunctionDefinition(StrictModel):
    name: Annotated[str, Field(pattern=_TOOL_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class ToolIn(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(StrictModel):
    name: Annotated[str, Field(pattern=_TOOL_NAME)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # None: any JSON
    strict: bool | None = None


class TextFormat(StrictModel):
    type: Literal["text"]


class JsonObjectFormat(StrictModel):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(StrictModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("type[text]")] | Annotated[JsonObjectFormat, Tag("type[json_object]")]
    | Annotated[JsonSchemaResponseFormat, Tag("type[json_schema]")], _tagged("type", "type")]

_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputsParams(StrictModel):
    """vLLM's `structured_outputs` extension: exactly one of these, not null."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})

    json_: dict[str, Any] | str | SkipJsonSchema[None] = Field(None, alias="json")  # a schema (or its text)
    regex: str | SkipJsonSchema[None] = None
    choice: Annotated[list[str], Field(min_length=1)] | SkipJsonSchema[None] = None
    grammar: str | SkipJsonSchema[None] = None  # EBNF (xgrammar's dialect)
    json_object: bool | SkipJsonSchema[None] = None  # false: no constraint
    structural_tag: str | SkipJsonSchema[None] = None  # an xgrammar structural tag, as JSON text

    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if len(data) != 1:
                raise PydanticCustomError("structured_outputs", "give exactly one of json, regex, choice, grammar, "
                                          "json_object, structural_tag")
            (key, value), = data.items()
            if key in _STRUCTURED_KINDS and value is None:
                raise PydanticCustomError("structured_outputs", "{key} must not be null", {"key": key})
        return data


class StreamOptions(StrictModel):
    include_usage: bool = False
    # OpenAI pads its stream chunks against length side channels; over a local link: no effect
    include_obfuscation: bool | None = Field(None, description="Accepted and ignored (no padding is added)",
                                             json_schema_extra={"x-ignored": True})


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
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # An extension: logits (so greedy and seeded outputs) that do not depend on the other requests
    # in the engine's batch (the server's --batch-invariant gives it to every request)
    batch_invariant: bool = False
    # An extension: the response carries a `trace` of the first choice's way through the server,
    # stop by stop (shapes and times; server/trace.py); refused unless --enable-trace is set
    trace: bool = False

    # ---- the fields vllm-router adds to every request it forwards (docs/scale-out.md) ----
    no_stop_trim: bool = False  # SGLang's name of include_stop_str_in_output; either one keeps the stop string
    return_hidden_states: bool = False  # false only: this server returns no hidden states

    @field_validator("return_hidden_states")
    @classmethod
    def _no_hidden_states(cls, value: bool) -> bool:
        if value:
            raise PydanticCustomError("unsupported_field", "{field} is not supported by this server",
                                      {"field": "return_hidden_states"})
        return value


class ChatCompletionRequest(SamplingFields, IgnoredOpenAIFields):
    unsupported: ClassVar[tuple[str, ...]] = (
        "functions", "function_call", "modalities", "audio", "web_search_options", "moderation")
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    prompt_logprobs: int | None = None  # vLLM's: the prompt tokens' logprobs, and k alternatives each
    add_generation_prompt: bool = True
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # ---- vllm-router's chat fields ----
    # The last (assistant) message is left open and the model continues it (vLLM's meaning)
    continue_final_message: bool = False
    # The reasoning switches (vLLM's include_reasoning, SGLang's separate_reasoning and
    # stream_reasoning): with --reasoning-parser, include_reasoning false leaves the reasoning
    # out of the answer; the others keep their defaults' meaning (reasoning separate and streamed)
    include_reasoning: bool = True
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    # vLLM's: the chat template's own variables (server/template_kwargs.py)
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


class CompletionRequest(SamplingFields, IgnoredOpenAIFields):
    unsupported: ClassVar[tuple[str, ...]] = ("suffix", "best_of")
    # One prompt or a batch: text, or token ids.
    prompt: str | Annotated[list[str], Field(min_length=1)] | Annotated[list[int], Field(min_length=1)] \
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    logprobs: int | None = None
    # The prompt before the completion (in `text`, and in `logprobs` with its tokens' logprobs, the
    # first null); with echo, max_tokens may be 0: the prompt alone
    echo: bool = False
    prompt_logprobs: int | None = None  # vLLM's: the prompt tokens' logprobs, and k alternatives each


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
