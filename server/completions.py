"""POST /v1/completions: one prompt or a batch (text or token ids); choice index = prompt * n + i.
`echo` shows each choice's prompt first; `prompt_logprobs` (vLLM's) adds its tokens' logprobs."""
from __future__ import annotations

from fastapi import APIRouter, Request

from common.messages import GenerateRequest, PromptEcho, TextDelta, TextLogprob, Usage
from common.validation import check_token_ids
from server.errors import bad_request
from server.generation import (STREAM_RESPONSE, ChoiceResult, Renderer, ResponseIds, admit, serve_generation,
                               usage_dict)
from server.json_body import StrictJSONRoute
from server.prompt_logprobs import WithPromptLogprobs
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
    if state.lora is not None:
        request = state.lora.with_lora(body.model, request)
    renderer: Renderer = CompletionRenderer(ids, include_usage, params.logprobs, body.echo,
                                            echo_only=body.echo and body.max_tokens == 0)
    if body.prompt_logprobs is not None:
        renderer = WithPromptLogprobs(renderer, body.prompt_logprobs, per_choice=True)
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
    """With echo, a choice's text starts with its prompt, and its logprobs with the prompt's tokens
    (the first one's logprob null, as OpenAI's legacy API and vLLM answer): streamed in the
    choice's first chunk. `echo_only` (echo with max_tokens 0): the prompt alone; the one token
    the engine sampled is not shown nor counted."""

    def __init__(self, ids: ResponseIds, include_usage: bool, logprobs: int | None, echo: bool = False,
                 echo_only: bool = False):
        self.ids = ids
        self.include_usage = include_usage
        self.want_logprobs = logprobs is not None
        self.num_top = logprobs or 0
        self.echo = echo
        self.echo_only = echo_only
        self.text_offsets: dict[int, int] = {}  # per choice: characters of text so far

    def logprobs(self, index: int, entries: list[TextLogprob], prompt: PromptEcho | None = None) -> dict:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict | None] = []
        if prompt is not None:
            assert prompt.tokens is not None, "echo with logprobs asks the engine for the prompt's"
            for t in prompt.tokens:
                tokens.append(t.token)
                token_logprobs.append(t.logprob)
                top_logprobs.append(None if t.logprob is None else
                                    {a.token: a.logprob for a in [t, *t.top[: self.num_top]]})
        for e in entries:
            tokens.append(e.token)
            token_logprobs.append(e.logprob)
            top_logprobs.append({t.token: t.logprob for t in [e, *e.top]})
        offset = self.text_offsets.get(index, 0)
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        self.text_offsets[index] = offset
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}

    def _shown(self, text: str, entries: list[TextLogprob] | None,
               prompt: PromptEcho | None) -> tuple[str, list[TextLogprob] | None, PromptEcho | None]:
        """What a choice shows of its output and prompt."""
        if self.echo_only:
            text, entries = "", None
        if not self.echo:
            prompt = None
        return (text if prompt is None else prompt.text + text), entries, prompt

    def _chunk(self, choice: dict) -> dict:
        chunk = {"id": self.ids.id, "object": "text_completion", "created": self.ids.created,
                 "model": self.ids.model, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def chunks(self, delta: TextDelta) -> list[dict]:
        out = []
        text, entries, prompt = self._shown(delta.text, delta.logprobs, delta.prompt)
        if text or entries or prompt is not None:
            logprobs = self.logprobs(delta.index, entries or [], prompt) if self.want_logprobs else None
            out.append(self._chunk({"index": delta.index, "text": text, "logprobs": logprobs,
                                    "finish_reason": None}))
        if delta.finish_reason is not None:
            out.append(self._chunk({"index": delta.index, "text": "", "logprobs": None,
                                    "finish_reason": delta.finish_reason, "stop_reason": delta.stop_reason}))
        return out

    def _usage(self, usage: Usage) -> dict:
        return usage_dict(Usage(usage.prompt_tokens, 0, usage.cached_tokens) if self.echo_only else usage)

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.ids.id, "object": "text_completion", "created": self.ids.created, "model": self.ids.model,
                "choices": [], "usage": self._usage(usage)}

    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict:
        rendered = []
        for c in choices:
            text, entries, prompt = self._shown(c.text, c.logprobs, c.prompt)
            rendered.append({"index": c.index, "text": text,
                             "logprobs": self.logprobs(c.index, entries or [], prompt) if self.want_logprobs
                             else None,
                             "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        return {"id": self.ids.id, "object": "text_completion", "created": self.ids.created, "model": self.ids.model,
                "choices": rendered, "usage": self._usage(usage)}
