"""When to draft, how much, and how well it went: the scheduler's side of speculative decoding.

A running request in decode gets a draft (n-gram proposer) when the step is small enough for
drafting to pay (`disable_by_batch_size`), when its sampling allows verifying several positions
in one pass (no repetition / presence / frequency penalty, no min_tokens ban pending: those
depend on the tokens before each position), and when its recent drafts were accepted often
enough: a request whose acceptance rate (an exponential average over its verifications) falls
below `MIN_ACCEPTANCE` stops drafting for `SUSPEND_STEPS` steps. A draft never runs past
max_tokens or max_model_len. The runner verifies; `record` learns what was accepted.
"""
from __future__ import annotations

from common.messages import SpecDecodeStats
from common.speculative_config import SpeculativeConfig
from engine.core.ngram_proposer import NgramProposer
from engine.core.request import Request

MIN_ACCEPTANCE = 0.2
SUSPEND_STEPS = 16
ACCEPTANCE_DECAY = 0.7  # weight of the past in the acceptance average


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.proposer = NgramProposer(config)
        self.max_model_len = max_model_len
        self.num_steps = 0
        self._stats = SpecDecodeStats(0, 0, 0, [0] * config.num_speculative_tokens)

    def start_step(self, num_running: int) -> bool:
        """Whether this step drafts at all."""
        self.num_steps += 1
        return num_running <= self.config.disable_by_batch_size

    def draft(self, req: Request) -> list[int]:
        p = req.params
        if (p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
                or req.num_output_tokens < p.min_tokens or self.num_steps < req.spec_resume_step):
            return []
        # the step also samples one token after the draft: leave room for it
        room = min(req.max_tokens - req.num_output_tokens, self.max_model_len - req.num_tokens) - 1
        return self.proposer.propose(req.token_ids, min(self.config.num_speculative_tokens, room))

    def record(self, req: Request, num_drafted: int, num_accepted: int) -> None:
        s = self._stats
        s.num_drafts += 1
        s.num_draft_tokens += num_drafted
        s.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            s.accepted_per_position[position] += 1
        req.spec_acceptance = ACCEPTANCE_DECAY * req.spec_acceptance + (1 - ACCEPTANCE_DECAY) * (
            num_accepted / num_drafted)
        if req.spec_acceptance < MIN_ACCEPTANCE:
            req.spec_resume_step = self.num_steps + SUSPEND_STEPS
            req.spec_acceptance = 0.5  # a fresh, neutral start after the pause

    def take_stats(self) -> SpecDecodeStats | None:
        """What happened since the last call (counter increments), or None when nothing did."""
        s = self._stats
        if not s.num_drafts:
            return None
        self._stats = SpecDecodeStats(0, 0, 0, [0] * self.config.num_speculative_tokens)
        return s
