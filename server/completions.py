"""POST /v1/completions: one prompt or a batch (text or token ids); choice index = prompt * n + i."""
from __future__ import annotations

from fastapi import APIRouter, Request

from common.messages import GenerateRequest, TextDelta, TextLogprob, Usage
from common.validation import check_token_ids
from server.errors import bad_request
from server.generation import STREAM_RESPONSE, ChoiceResult, ResponseIds, admit, serve_generation, usage_dict
from server.json_body import StrictJSONRoute
from server.protocol import CompletionRequest
from server.sampling import MAX_N, completion_sampling_params

router = APIRouter(route_class=StrictJSONRoute)


@router.post("/v1/completions", responses=STREAM_RESPONSE)
async def completions(body: CompletionRequest, raw: Request):
    state = raw.app.state.serving
    ready = admit(state, body)
    params = completion_sampling_params(body, state.generation_defaults, ready.vocab_size, ready.max_model_len)
    prompts = _prompt_list(body.prompt)
    if len(prompts) * params.n > MAX_N:
        raise bad_request(f"prompt: {len(prompts)} prompts x n={params.n} is more than {MAX_N} choices", "prompt")
    for p in prompts:  # here, not only in the worker: an id beyond 64 bits cannot even be sent there
        if not isinstance(p, str):
            check_token_ids("prompt", p, ready.vocab_size)  # InvalidRequest: a 400
    ids = ResponseIds.new("cmpl", state.served_model_name)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    request = GenerateRequest(request_id=ids.id, sampling_params=params, prompts=prompts)
    renderer = CompletionRenderer(ids, include_usage, params.logprobs is not None)
    return await serve_generation(state, raw, request, len(prompts) * params.n, bool(body.stream), include_usage,
                                  renderer)


def _prompt_list(prompt) -> list[str | list[int]]:
    """str -> [str]; [int, ...] -> one prompt of ids; [str, ...] or [[int, ...], ...] -> a batch."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt[0], int):
        return [list(prompt)]
    return list(prompt)


class CompletionRenderer:
    def __init__(self, ids: ResponseIds, include_usage: bool, want_logprobs: bool):
        self.ids = ids
        self.include_usage = include_usage
        self.want_logprobs = want_logprobs
        self.text_offsets: dict[int, int] = {}  # per choice: characters of text so far

    def logprobs(self, index: int, entries: list[TextLogprob]) -> dict:
        offset = self.text_offsets.get(index, 0)
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(e.token)
        self.text_offsets[index] = offset
        return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{t.token: t.logprob for t in [e, *e.top]} for e in entries],
                "text_offset": offsets}

    def _chunk(self, choice: dict) -> dict:
        chunk = {"id": self.ids.id, "object": "text_completion", "created": self.ids.created,
                 "model": self.ids.model, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def chunks(self, delta: TextDelta) -> list[dict]:
        out = []
        if delta.text or delta.logprobs:
            logprobs = self.logprobs(delta.index, delta.logprobs) if delta.logprobs else None
            out.append(self._chunk({"index": delta.index, "text": delta.text, "logprobs": logprobs,
                                    "finish_reason": None}))
        if delta.finish_reason is not None:
            out.append(self._chunk({"index": delta.index, "text": "", "logprobs": None,
                                    "finish_reason": delta.finish_reason, "stop_reason": delta.stop_reason}))
        return out

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.ids.id, "object": "text_completion", "created": self.ids.created, "model": self.ids.model,
                "choices": [], "usage": usage_dict(usage)}

    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict:
        return {"id": self.ids.id, "object": "text_completion", "created": self.ids.created, "model": self.ids.model,
                "choices": [{"index": c.index, "text": c.text,
                             "logprobs": self.logprobs(c.index, c.logprobs) if self.want_logprobs else None,
                             "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for c in choices],
                "usage": usage_dict(usage)}
