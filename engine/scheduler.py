"""Continuous batching under a token budget, with chunked prefill and preemption by recompute.

One rule per step: spend `max_num_batched_tokens` on running requests first (a decode costs
one token, an unfinished prefill costs its next chunk), then admit waiting requests in arrival
order while budget, `max_num_seqs` and free blocks allow. When a running request cannot get a
block, the newest running request is preempted: its blocks are freed and it waits again at the
front of the queue, to be recomputed from its prompt and the tokens it already produced.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.request import Request, Status


@dataclass
class ScheduledBatch:
    # (request, tokens to compute this step); query_len == 1 rows first (decode path)
    entries: list[tuple[Request, int]]
    num_batched_tokens: int

    @property
    def is_empty(self) -> bool:
        return not self.entries


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # oldest first; the newest is preempted first
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        entries: list[tuple[Request, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            want = min(req.num_tokens - req.num_computed_tokens, budget)
            num_new = self.block_manager.allocate(req, want)
            while num_new is None:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
                num_new = self.block_manager.allocate(req, want)
            if num_new is None:
                break  # req preempted itself: nothing after it in `running` remains
            entries.append((req, num_new))
            budget -= num_new
            i += 1
        # A step that had to preempt admits nobody: the pool is already short.
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            num_new = self.block_manager.allocate(req, min(req.num_tokens, budget))
            if num_new is None:
                break
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            entries.append((req, num_new))
            budget -= num_new
        entries.sort(key=lambda e: e[1] != 1)  # stable: decodes first, then prefill chunks
        return ScheduledBatch(entries, self.max_num_batched_tokens - budget)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.status = Status.PREEMPTED
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def finish(self, req: Request, reason: str, stop_reason: int | None = None) -> None:
        """Take a request out of the scheduler (finished or aborted) and free its blocks."""
        if req.status in (Status.RUNNING,):
            self.running.remove(req)
        elif req.status in (Status.WAITING, Status.PREEMPTED):
            self.waiting.remove(req)
        self.block_manager.free(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason
