"""Request bodies of Anthropic's Messages API, as strict pydantic models.

`cache_control` on a block or tool is accepted and has no effect (the prefix cache needs no
hints); blocks this server cannot show the model (images, documents, search results) and
features it does not run (server tools, MCP servers, containers) are refused with a 400 naming
the field. Thinking blocks sent back in an assistant turn are accepted and dropped, as chat
templates drop earlier turns' reasoning.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from server.protocol import StrictModel, text_or_list

_TOOL_NAME = r"^[a-zA-Z0-9_-]{1,128}$"


def _by_type():
    def tag_of(value: Any) -> str | None:
        tag = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return f"type[{tag}]" if isinstance(tag, str) else None

    return Discriminator(tag_of, custom_error_type="invalid_tag:type",
                         custom_error_message="not one of the supported block types")


class CacheControl(StrictModel):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(StrictModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None  # a response's citations sent back; none are made here


class ToolUseBlock(StrictModel):
    # A response's block sent back as it came: fields that only describe it (caller, toolset_name,
    # ...) are not used.
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(StrictModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: text_or_list(list[TextBlock]) | None = None  # type: ignore[valid-type]
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "\n".join(b.text for b in self.content)


class ThinkingBlock(StrictModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["thinking", "redacted_thinking"]


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("type[text]")] | Annotated[ToolUseBlock, Tag("type[tool_use]")]
    | Annotated[ToolResultBlock, Tag("type[tool_result]")] | Annotated[ThinkingBlock, Tag("type[thinking]")]
    | Annotated[ThinkingBlock, Tag("type[redacted_thinking]")], _by_type()]


class Message(StrictModel):
    role: Literal["user", "assistant"]
    content: text_or_list(list[ContentBlock])  # type: ignore[valid-type]


class Tool(StrictModel):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(pattern=_TOOL_NAME)]
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingEnabled(StrictModel):
    type: Literal["enabled"]
    budget_tokens: int


class ThinkingDisabled(StrictModel):
    type: Literal["disabled"]


class ThinkingAdaptive(StrictModel):
    type: Literal["adaptive"]


Thinking = Annotated[
    Annotated[ThinkingEnabled, Tag("type[enabled]")] | Annotated[ThinkingDisabled, Tag("type[disabled]")]
    | Annotated[ThinkingAdaptive, Tag("type[adaptive]")], _by_type()]


class JsonOutputFormat(StrictModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # the template's reasoning_effort
    format: JsonOutputFormat | None = None  # structured outputs: the answer follows the schema


class Metadata(StrictModel):
    user_id: str | None = None  # no effect here


class CountTokensRequest(StrictModel):
    model: str  # required, as Anthropic's API has it
    messages: Annotated[list[Message], Field(min_length=1)]
    system: text_or_list(list[TextBlock]) | None = None  # type: ignore[valid-type]
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    metadata: Metadata | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # no effect here
    cache_control: CacheControl | None = None  # no effect here: the prefix cache needs no hints
    output_config: OutputConfig | None = None
