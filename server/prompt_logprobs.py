"""Prompt logprobs in vLLM's response shape, and the renderer wrapper that adds them.

`prompt_logprobs: k` (vLLM's extension, on both generation endpoints) answers, per prompt token,
`null` for the first (nothing predicts it), then `{"<token id>": {"logprob", "rank",
"decoded_token"}}` for the prompt token and the k best tokens (one entry where they coincide).
/v1/completions puts the list on each choice, /v1/chat/completions on the response (every choice
shares the prompt), as vLLM does. Not streamed (vLLM refuses it with stream too).
"""
from __future__ import annotations

from common.messages import PromptEcho, PromptToken, TextDelta, Usage
from server.generation import ChoiceResult, Renderer


def _entry(t: PromptToken) -> dict:
    return {"logprob": t.logprob, "rank": t.rank, "decoded_token": t.token}


def vllm_prompt_logprobs(prompt: PromptEcho | None, k: int) -> list[dict | None]:
    assert prompt is not None and prompt.tokens is not None, "the engine sends them on the first delta"
    out: list[dict | None] = [None]
    for t in prompt.tokens[1:]:
        entries = {str(t.token_id): _entry(t)}
        for alt in t.top[:k]:
            entries.setdefault(str(alt.token_id), _entry(alt))
        out.append(entries)
    return out


class WithPromptLogprobs:
    """Adds `prompt_logprobs` to a non-streamed response: on each choice, or on the response."""

    def __init__(self, inner: Renderer, k: int, per_choice: bool):
        self.inner = inner
        self.k = k
        self.per_choice = per_choice

    def chunks(self, delta: TextDelta) -> list[dict]:
        return self.inner.chunks(delta)

    def usage_chunk(self, usage: Usage) -> dict:
        return self.inner.usage_chunk(usage)

    def response(self, choices: list[ChoiceResult], usage: Usage) -> dict:
        out = self.inner.response(choices, usage)
        if self.per_choice:
            for rendered, choice in zip(out["choices"], choices, strict=True):
                rendered["prompt_logprobs"] = vllm_prompt_logprobs(choice.prompt, self.k)
        else:
            out["prompt_logprobs"] = vllm_prompt_logprobs(choices[0].prompt, self.k)
        return out
