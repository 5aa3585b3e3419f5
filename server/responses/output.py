"""A response's output items, built from the turn's events; streamed as OpenAI's events.

One builder serves both forms: fed the text piece by piece it returns the stream's events
(each output item opened with `response.output_item.added`, its text or arguments as deltas,
closed with its `...done` events), and its items at the end are the non-streamed response's
`output`, so the two agree by construction. Order of items: the reasoning item, then the message
(the answer text), then one `function_call` item per call.
"""
from __future__ import annotations

import time
import uuid

from common.messages import Usage
from server.responses.protocol import ResponsesRequest
from server.tool_parser import ToolCall
from server.turn_parser import TurnParser


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputBuilder:
    def __init__(self, parser: TurnParser):
        self.parser = parser
        self.items: list[dict] = []
        self._open: dict | None = None  # the item being written
        self._calls: dict[int, dict] = {}  # call index -> its item

    def feed(self, text: str) -> list[dict]:
        return self._events(self.parser.feed(text))

    def finish(self, status: str) -> list[dict]:
        """The last events; `status` of the items: "completed", or "incomplete" when cut short."""
        events = self._events(self.parser.finish())
        return events + self._close(status)

    def _events(self, parsed) -> list[dict]:
        out: list[dict] = []
        for kind, value in parsed:
            if kind == "reasoning":
                out += self._ensure("reasoning")
                item = self._open
                assert item is not None
                item["content"][0]["text"] += value
                out.append({"type": "response.reasoning_text.delta", "item_id": item["id"],
                            "output_index": self._index(), "content_index": 0, "delta": value})
            elif kind == "content":
                out += self._ensure("message")
                item = self._open
                assert item is not None
                item["content"][0]["text"] += value
                out.append({"type": "response.output_text.delta", "item_id": item["id"],
                            "output_index": self._index(), "content_index": 0, "delta": value, "logprobs": []})
            elif kind == "call":
                assert isinstance(value, ToolCall)
                out += self._close("completed")
                item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                        "call_id": value.id, "name": value.name, "arguments": ""}
                self._calls[value.index] = item
                out += self._add(item)
            else:
                index, fragment = value  # type: ignore[misc]
                item = self._calls[index]
                item["arguments"] += fragment
                out.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                            "output_index": self.items.index(item), "delta": fragment})
        return out

    def _index(self) -> int:
        return len(self.items) - 1

    def _ensure(self, kind: str) -> list[dict]:
        if self._open is not None and self._open["type"] == kind:
            return []
        out = self._close("completed")
        if kind == "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        out += self._add(item)
        out.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": self._index(),
                    "content_index": 0, "part": part})
        return out

    def _add(self, item: dict) -> list[dict]:
        added = {**item, "content": []} if "content" in item else dict(item)
        self.items.append(item)
        self._open = item
        return [{"type": "response.output_item.added", "output_index": self._index(), "item": added}]

    def _close(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        out: list[dict] = []
        if item is None:
            # a call's item stays open for its arguments until the next item or the end
            for call in self._calls.values():
                if call["status"] == "in_progress":
                    out += self._close_call(call, status)
            return out
        index = self.items.index(item)
        if item["type"] == "function_call":
            return self._close_call(item, status)
        part = item["content"][0]
        if item["type"] == "reasoning":
            out.append({"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": index,
                        "content_index": 0, "text": part["text"]})
        else:
            out.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                        "content_index": 0, "text": part["text"], "logprobs": []})
        out.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                    "content_index": 0, "part": dict(part)})
        item["status"] = status
        out.append({"type": "response.output_item.done", "output_index": index, "item": item})
        return out

    def _close_call(self, item: dict, status: str) -> list[dict]:
        index = self.items.index(item)
        item["status"] = status
        return [{"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index,
                 "name": item["name"], "arguments": item["arguments"]},
                {"type": "response.output_item.done", "output_index": index, "item": item}]


def usage_json(usage: Usage, reasoning_tokens: int = 0) -> dict:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def response_json(body: ResponsesRequest, response_id: str, created_at: int, model: str, status: str,
                  output: list[dict], usage: dict | None, incomplete_reason: str | None = None) -> dict:
    """The Response object: what the request asked, echoed, with the output and usage."""
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    return {
        "id": response_id, "object": "response", "created_at": created_at, "model": model, "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {}, "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "store": body.store, "temperature": body.temperature, "top_p": body.top_p,
        "text": {"format": fmt.model_dump(by_alias=True) if fmt is not None else {"type": "text"}},
        "tool_choice": (body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump")
                        else body.tool_choice or "auto"),
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "truncation": "disabled", "usage": usage, "user": body.user,
    }
