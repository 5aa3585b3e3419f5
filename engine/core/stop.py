"""Which token ids end a request: one definition for the stop check and the min_tokens ban."""
from __future__ import annotations

from common.messages import SamplingParams


def stop_token_ids(params: SamplingParams, eos_token_ids: set[int]) -> set[int]:
    """The request's stop_token_ids, plus the model's EOS ids unless it ignores EOS."""
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= eos_token_ids
    return ids
