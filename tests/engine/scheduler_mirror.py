"""What a fake runner keeps of each request, from the scheduler's structs alone (as the real
runner does): its tokens, its blocks and how many of its tokens the KV cache holds."""
from __future__ import annotations

from engine.core.outputs import SchedulerOutput


class SchedulerMirror:
    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.blocks: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def apply(self, so: SchedulerOutput) -> None:
        """The step's diffs: rows freed (a finished request's tokens too), then taken, then grown."""
        for rid in so.finished_request_ids | so.preempted_request_ids:
            self.blocks.pop(rid, None)
            if rid in so.finished_request_ids:
                self.tokens.pop(rid, None)
        for new in so.new_requests:
            assert new.request_id not in self.blocks, "a row given twice"
            self.tokens[new.request_id] = list(new.token_ids)
            self.blocks[new.request_id] = list(new.block_ids)
            self.computed[new.request_id] = new.num_computed_tokens
        for cached in so.cached_requests:
            self.blocks[cached.request_id] += cached.new_block_ids
            self.computed[cached.request_id] = cached.num_computed_tokens
