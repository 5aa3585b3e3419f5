"""A choice's prompt as the server shows it back: `echo` (the prompt's text before the completion)
and prompt logprobs (each prompt token's logprob, rank and best alternatives, from the engine).

The text is the request's own prompt string, or for a prompt of token ids their decode (special
tokens kept: the echo shows what the model read). The tokens are decoded one by one, as the
logprobs of output tokens are (`TokenText`); the first has no logprob: nothing predicts it.
"""
from __future__ import annotations

from common.messages import PromptEcho, PromptToken, TokenDelta
from tokenizer_worker.token_text import MIN_LOGPROB, TokenText


def prompt_echo(prompt: str | list[int], prompt_ids: list[int], delta: TokenDelta, tokenizer,
                token_text: TokenText) -> PromptEcho:
    text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt_ids, skip_special_tokens=False)
    if delta.prompt_logprobs is None:
        return PromptEcho(text)
    assert delta.prompt_logprob_ranks is not None and len(delta.prompt_logprobs) == len(prompt_ids) - 1
    tokens = [PromptToken(prompt_ids[0], token_text.get(prompt_ids[0])[0])]
    for entries, rank in zip(delta.prompt_logprobs, delta.prompt_logprob_ranks, strict=True):
        actual, *top = entries
        tokens.append(PromptToken(actual.token_id, token_text.get(actual.token_id)[0],
                                  max(actual.logprob, MIN_LOGPROB), rank,
                                  [PromptToken(t.token_id, token_text.get(t.token_id)[0], max(t.logprob, MIN_LOGPROB),
                                               place) for place, t in enumerate(top, start=1)]))
    return PromptEcho(text, tokens)
