"""POST /v1/chat/completions: request checks, then chunks and responses in OpenAI's shapes."""
from __future__ import annotations

from fastapi import APIRouter, Request

from common.messages import ChatMessage, GenerateRequest, TextDelta, TextLogprob, Usage
from server.generation import STREAM_RESPONSE, ChoiceResult, ResponseIds, admit, serve_generation, usage_dict
from server.json_body import StrictJSONRoute
from server.protocol import ChatCompletionRequest
from server.sampling import chat_sampling_params

router = APIRouter(route_class=StrictJSONRoute)


@router.post("/v1/chat/completions", responses=STREAM_RESPONSE)
async def chat_completions(body: ChatCompletionRequest, raw: Request):
    state = raw.app.state.serving
    ready = admit(state, body)
    params = chat_sampling_params(body, state.generation_defaults, ready.vocab_size, ready.max_model_len)
    messages = to_chat_messages(body.messages)
    ids = ResponseIds.new("chatcmpl", state.served_model_name)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    request = GenerateRequest(request_id=ids.id, sampling_params=params, messages=messages,
                              add_generation_prompt=body.add_generation_prompt)
    return await serve_generation(state, raw, request, params.n, bool(body.stream), include_usage,
                                  ChatRenderer(ids, include_usage, params.logprobs is not None))


def chat_logprobs(entries: list[TextLogprob]) -> dict:
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": e.token_bytes,
                         "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.token_bytes}
                                          for t in e.top]} for e in entries]}


class ChatRenderer:
    def __init__(self, ids: ResponseIds, include_usage: bool, want_logprobs: bool):
        self.ids = ids
        self.include_usage = include_usage
        self.want_logprobs = want_logprobs
        self.started: set[int] = set()  # choices whose role chunk went out

    def _chunk(self, choice: dict) -> dict:
        chunk = {"id": self.ids.id, "object": "chat.completion.chunk", "created": self.ids.created,
                 "model": self.ids.model, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI's shape: null on every chunk but the usage chunk
        return chunk

    def chunks(self, delta: TextDelta) -> list[dict]:
        i = delta.index
        out = []
        if i not in self.started:
            self.started.add(i)
            out.append(self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}))
        if delta.text or delta.logprobs:
            out.append(self._chunk({"index": i, "delta": {"content": delta.text},
                                    "logprobs": chat_logprobs(delta.logprobs) if delta.logprobs else None,
                                    "finish_reason": None}))
        if delta.finish_reason is not None:
            out.append(self._chunk({"index": i, "delta": {}, "logprobs": None, "finish_reason": delta.finish_reason,
                                    "stop_reason": delta.stop_reason}))
        return out

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.ids.id, "object": "chat.completion.chunk", "created": self.ids.created,
                "model": self.ids.model, "choices": [], "usage": usage_dict(usage)}

    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict:
        return {"id": self.ids.id, "object": "chat.completion", "created": self.ids.created, "model": self.ids.model,
                "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                             "logprobs": chat_logprobs(c.logprobs) if self.want_logprobs else None,
                             "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for c in choices],
                "usage": usage_dict(usage)}


def to_chat_messages(messages) -> list[ChatMessage]:
    """Request messages as the worker's ChatMessage structs (text content joined)."""
    # "developer" is OpenAI's newer name for the system role; chat templates know "system".
    return [ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text(), name=m.name)
            for m in messages]
