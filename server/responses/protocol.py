"""Request bodies of /v1/responses, as strict pydantic models.

Input items are told apart by `type` (a message may leave it out, as the SDKs' "easy" messages
do). Items this server wrote itself and a client sends back (output messages, reasoning items,
function calls with their `id` and `status`) may carry fields that only describe them (status,
annotations, logprobs, ids); those are accepted and not used. Features that would change the
answer and are not implemented (background runs, item references, hosted tools, conversations,
stored prompts) are refused with a 400 naming the field, never ignored.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from server.ignored_fields import IgnoredOpenAIFields
from server.protocol import _NEUTRAL, StrictModel, UnsupportedFieldsCheck, text_or_list

_TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"

# Fields of OpenAI's request that have no effect here: accepted with any value, as vLLM does.
_NEUTRAL.update({
    "background": lambda v: v in (None, False),
    "conversation": lambda v: v is None,
    "prompt": lambda v: v is None,
    "max_tool_calls": lambda v: v is None,
    "top_logprobs": lambda v: v in (None, 0),
    "truncation": lambda v: v in (None, "disabled"),
    "include": lambda v: v is None or (isinstance(v, list)
                                       and all(i == "reasoning.encrypted_content" for i in v)),
    "context_management": lambda v: v is None,
})


class InputText(StrictModel):
    type: Literal["input_text"]
    text: str


class OutputText(StrictModel):
    """A part of an assistant message sent back; its annotations and logprobs are not used."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["output_text"]
    text: str


class Refusal(StrictModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["refusal"]
    refusal: str


def _by_type(default: str | None = None):
    def tag_of(value: Any) -> str | None:
        tag = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return f"type[{tag}]" if isinstance(tag, str) else None

    return Discriminator(tag_of, custom_error_type="invalid_tag:type",
                         custom_error_message="not one of the supported types")


ContentPart = Annotated[
    Annotated[InputText, Tag("type[input_text]")] | Annotated[OutputText, Tag("type[output_text]")]
    | Annotated[Refusal, Tag("type[refusal]")], _by_type()]


class MessageItem(StrictModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: text_or_list(list[ContentPart])  # type: ignore[valid-type]
    id: str | None = None  # an output message sent back
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in self.content)


class FunctionCallItem(StrictModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(StrictModel):
    type: Literal["function_call_output"]
    call_id: str
    output: text_or_list(list[InputText])  # type: ignore[valid-type]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningItem(StrictModel):
    """A reasoning item sent back: not shown to the model again (chat templates drop earlier
    turns' reasoning)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["reasoning"]


InputItem = Annotated[
    Annotated[MessageItem, Tag("type[message]")] | Annotated[FunctionCallItem, Tag("type[function_call]")]
    | Annotated[FunctionCallOutputItem, Tag("type[function_call_output]")]
    | Annotated[ReasoningItem, Tag("type[reasoning]")], _by_type("message")]


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=_TOOL_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(StrictModel):
    type: Literal["function"]
    name: str


class TextFormatText(StrictModel):
    type: Literal["text"]


class TextFormatJsonObject(StrictModel):
    type: Literal["json_object"]


class TextFormatJsonSchema(StrictModel):
    type: Literal["json_schema"]
    name: Annotated[str, Field(pattern=_TOOL_NAME)]
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[
    Annotated[TextFormatText, Tag("type[text]")] | Annotated[TextFormatJsonObject, Tag("type[json_object]")]
    | Annotated[TextFormatJsonSchema, Tag("type[json_schema]")], _by_type()]


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # no effect on a local model


class ReasoningConfig(StrictModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # no summaries are written
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(StrictModel):
    include_obfuscation: bool | None = None  # no obfuscation padding is sent


class ResponsesRequest(UnsupportedFieldsCheck, IgnoredOpenAIFields):
    unsupported: ClassVar[tuple[str, ...]] = (
        "background", "conversation", "prompt", "max_tool_calls", "top_logprobs", "truncation", "include",
        "context_management")
    model: str | None = None
    input: text_or_list(Annotated[list[InputItem], Field(min_length=1)])  # type: ignore[valid-type]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: passed to the chat template
    metadata: dict[str, str] | None = None  # echoed back
    # vLLM's sampling extensions
    top_k: int | None = None
    seed: int | None = None
