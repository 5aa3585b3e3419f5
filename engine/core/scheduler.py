"""Continuous batching under a token budget, with chunked prefill and preemption by recompute.

One rule per step: spend `max_num_batched_tokens` on running requests first (a decode costs
one token, an unfinished prefill costs its next chunk), then admit waiting requests in arrival
order while budget, `max_num_seqs` and free blocks allow. When a running request cannot get a
block, the newest running request is preempted: its blocks are freed and it waits again at the
front of the queue, to be recomputed from its prompt and the tokens it already produced.

`schedule()` says what runs (a `SchedulerOutput`: new requests with their data once, then diffs);
`update()` reads back what the runner sampled, advances progress, registers full blocks in the
prefix cache and applies the stop rules, returning one TokenDelta per request that got tokens.

A request with structured outputs waits until its grammar has compiled (others are admitted past
it); each step that samples it carries its allowed-token bitmask to the runner, and each token it
gets advances its matcher. It never drafts (a draft would need the matcher rolled back), and a
grammar that has nothing left to match ends it with "stop".
"""
from __future__ import annotations

import time
from collections import deque

from common.messages import FinishReason, TokenDelta, TokenLogprob
from common.speculative_config import SpeculativeConfig
from engine.core.block_manager import BlockManager
from engine.core.outputs import CachedRequestData, NewRequestData, RunnerOutput, SchedulerOutput
from engine.core.request import Request, RequestStatus
from engine.core.speculation import Speculator
from engine.core.stop import stop_token_ids
from engine.structured.manager import StructuredOutputManager


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: set[int], speculative_config: SpeculativeConfig | None = None,
                 structured: StructuredOutputManager | None = None, max_loras: int = 0):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # oldest first; the newest is preempted first
        self.num_preemptions = 0
        self.queue_times: list[float] = []  # seconds from arrival to first schedule, not yet reported
        self._finished_ids: set[str] = set()  # finished or aborted since the last schedule()
        self.speculator = None if speculative_config is None else Speculator(speculative_config, max_model_len)
        self.structured = structured
        self.constrained: set[str] = set()  # unfinished requests with a grammar: the only ones a step checks
        self._failed: list[TokenDelta] = []  # requests ended by an error outside a step (a grammar)
        # LoRA: the most distinct adapters among the running requests (the resident slots; 0: no adapters)
        self.max_loras = max_loras

    def add_request(self, req: Request) -> None:
        assert req.request_id not in self.requests, f"{req.request_id} is already scheduled"
        req.stop_token_ids = stop_token_ids(req.params, self.eos_token_ids)
        if req.params.structured_outputs is not None:
            assert self.structured is not None, "checked by the engine core"
            req.grammar = self.structured.start(req.params.structured_outputs)
            self.constrained.add(req.request_id)
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def abort(self, request_id: str) -> bool:
        """Free everything the request holds at once; False for an unknown (or finished) id."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self.finish(req, "abort")
        return True

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        out = SchedulerOutput([], [], {}, self._finished_ids)
        self._finished_ids = set()
        drafting = self.speculator is not None and self.speculator.start_step(len(self.running))
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.num_in_flight and self._reaches_length(req, req.num_tokens + req.num_in_flight):
                i += 1  # the tokens in flight reach its length limit: another row would be wasted
                continue
            num_blocks_before = len(req.block_ids)
            in_decode = req.num_computed_tokens == req.num_tokens - 1
            if drafting and in_decode and req.grammar is None:
                assert self.speculator is not None
                req.spec_token_ids = self.speculator.draft(req)[: budget - 1]
            want = min(req.num_tokens_with_pending - req.num_computed_tokens, budget)
            num_new = self.block_manager.allocate(req, want)
            while num_new is None:
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted_request_ids.add(victim.request_id)
                if victim is req:
                    break
                num_new = self.block_manager.allocate(req, want)
            if num_new is None:
                break  # req preempted itself: nothing after it in `running` remains
            out.cached_requests.append(CachedRequestData(req.request_id, req.block_ids[num_blocks_before:],
                                                         req.num_computed_tokens))
            out.num_scheduled_tokens[req.request_id] = num_new
            if req.spec_token_ids:
                out.spec_token_ids[req.request_id] = req.spec_token_ids
            budget -= num_new
            i += 1
        # A step that had to preempt admits nobody: the pool is already short.
        if self.constrained:
            self._fail_broken_grammars()
        now = time.time()
        # skipped this step: their grammar is not compiled yet, or their adapter finds no free slot
        compiling: list[Request] = []
        loras = {r.params.lora.id for r in self.running if r.params.lora is not None} if self.max_loras else set()
        while (self.waiting and not out.preempted_request_ids and budget > 0
               and len(self.running) < self.max_num_seqs):
            req = self.waiting[0]
            assert not req.num_in_flight, "a preempted request is read back before it is admitted again"
            if req.grammar is not None and (not req.grammar.ready() or req.grammar.error is not None):
                compiling.append(self.waiting.popleft())  # failed ones end at the next step's start
                continue
            lora = req.params.lora
            if lora is not None and lora.id not in loras and len(loras) >= self.max_loras:
                compiling.append(self.waiting.popleft())  # every slot is taken by running requests' adapters
                continue
            num_new = self.block_manager.allocate(req, min(req.num_tokens, budget))
            if num_new is None:
                break
            self.waiting.popleft()
            if lora is not None:
                loras.add(lora.id)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if not req.scheduled_once:
                req.scheduled_once = True
                self.queue_times.append(now - req.arrival_time)
            out.new_requests.append(NewRequestData(req.request_id, list(req.token_ids), req.num_prompt_tokens,
                                                   req.params, list(req.block_ids), req.num_computed_tokens))
            out.num_scheduled_tokens[req.request_id] = num_new
            budget -= num_new
        self.waiting.extendleft(reversed(compiling))
        if self.constrained:
            sampling = [self.requests[r] for r, n in out.num_scheduled_tokens.items() if r in self.constrained
                        and self.requests[r].num_computed_tokens + n == self.requests[r].num_tokens]
            if sampling:
                assert self.structured is not None
                out.grammar = self.structured.fill_bitmask(sampling)
        return out

    def only_compiling(self) -> bool:
        """Nothing runs and every waiting request waits for its grammar to compile."""
        if self.running or not self.constrained:
            return False
        return all(r.grammar is not None and r.grammar.compiling is not None for r in self.waiting)

    def _fail_broken_grammars(self) -> None:
        """End the waiting requests whose grammar failed to compile, whatever the step's room."""
        for req in [self.requests[r] for r in self.constrained]:
            grammar = req.grammar
            assert grammar is not None
            if req.status != RequestStatus.WAITING or not grammar.ready() or grammar.error is None:
                continue
            self.finish(req, "error")
            self._failed.append(TokenDelta(req.request_id, [], finish_reason="error", error=grammar.error))

    def take_failed(self) -> list[TokenDelta]:
        failed, self._failed = self._failed, []
        return failed

    def update(self, so: SchedulerOutput, ro: RunnerOutput) -> list[TokenDelta]:
        """A step that ran: its progress, then its sampled tokens and the stop rules."""
        self.advance(so, ro)
        return self.apply(so, ro)

    def advance(self, so: SchedulerOutput, ro: RunnerOutput | None = None) -> None:
        """Progress for every scheduled request, and one token in flight for each request the
        step samples. With async scheduling this runs as the step starts (`ro` None, no drafts), so the
        next step is scheduled before the host knows these tokens."""
        if so.spec_token_ids:
            assert ro is not None, "a step with drafts advances by what it accepted"
            num_sampled = {rid: len(tokens) for rid, tokens in zip(ro.request_ids, ro.sampled_token_ids, strict=True)}
        for request_id, num_new in so.num_scheduled_tokens.items():
            req = self.requests[request_id]
            if req.num_computed_tokens + num_new == req.num_tokens_with_pending:  # it reaches the end: it samples
                req.num_in_flight += 1
            draft = so.spec_token_ids.get(request_id)
            if draft:  # the KV of rejected draft positions is not kept: those slots are rewritten later
                assert self.speculator is not None
                num_accepted = num_sampled[request_id] - 1
                self.speculator.record(req, len(draft), num_accepted)
                num_new -= len(draft) - num_accepted
                req.spec_token_ids = []
            req.num_computed_tokens += num_new

    def apply(self, so: SchedulerOutput, ro: RunnerOutput,
              scheduled: dict[str, Request] | None = None) -> list[TokenDelta]:
        """The step's sampled tokens and the stop rules. A request that finished or was aborted
        since the step was scheduled (async scheduling) gets nothing from it (its row ran for
        nothing); one preempted meanwhile keeps its token, which is exact. `scheduled`: the
        requests the step was scheduled with (async scheduling), so that an id that finished and
        was added again meanwhile is not taken for its successor."""
        live = {rid: req for rid in so.num_scheduled_tokens
                if (req := self.requests.get(rid)) is not None and (scheduled is None or scheduled[rid] is req)}
        for req in live.values():
            if req.status == RequestStatus.RUNNING:
                self.block_manager.cache_full_blocks(req)
        if ro.prompt_logprobs:
            for request_id, chunk in ro.prompt_logprobs.items():
                if (req := live.get(request_id)) is not None:
                    req.add_prompt_logprobs(chunk)
        deltas = []
        for i, request_id in enumerate(ro.request_ids):
            req = live.get(request_id)
            if req is None:
                continue
            req.num_in_flight -= 1
            first_delta = req.num_output_tokens == 0
            accepted: list[int] = []
            for token in ro.sampled_token_ids[i]:
                req.token_ids.append(token)
                accepted.append(token)
                if self._check_stop(req, token):
                    break
            delta = TokenDelta(
                request_id=request_id, new_token_ids=accepted, logprobs=_logprobs(ro, i, len(accepted)),
                finish_reason=req.finish_reason, stop_reason=req.stop_reason, error=req.error,
                num_cached_tokens=req.num_cached_tokens if first_delta else None)
            if first_delta and req.params.prompt_logprobs is not None:
                assert len(req.prompt_logprobs) == req.num_prompt_tokens - 1, "a prompt position without logprobs"
                delta.prompt_logprobs, delta.prompt_logprob_ranks = req.prompt_logprobs, req.prompt_logprob_ranks
            deltas.append(delta)
        return deltas

    def finish(self, req: Request, reason: FinishReason, stop_reason: int | None = None) -> None:
        """Take a request out of the scheduler (finished or aborted) and free its blocks."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING:
            self.waiting.remove(req)
        self.block_manager.free(req)
        if req.grammar is not None:
            self.constrained.discard(req.request_id)
            if req.grammar.compiling is not None:
                req.grammar.compiling.cancel()  # not started yet: it never runs
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason
        del self.requests[req.request_id]
        self._finished_ids.add(req.request_id)

    def take_queue_times(self) -> list[float]:
        times, self.queue_times = self.queue_times, []
        return times

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()
        for req in self.running:
            req.num_registered_blocks = 0  # they register their full blocks again

    # ---- internals -----------------------------------------------------------------------

    def _check_stop(self, req: Request, token: int) -> bool:
        reason: FinishReason | None = None
        stop_reason = None
        if req.grammar is not None:
            assert self.structured is not None
            if not self.structured.accept(req.grammar, token):
                req.error = f"structured_outputs: the grammar refused token {token}"
                self.finish(req, "error")
                return True
            if req.grammar.terminated:  # it accepted a stop token (or has nothing left to match)
                reason = "stop"
        if req.num_output_tokens >= req.params.min_tokens and token in req.stop_token_ids:
            reason = "stop"
            stop_reason = token if token in req.params.stop_token_ids else None
        if reason is None and self._reaches_length(req, req.num_tokens):
            reason = "length"
        if reason is None:
            return False
        self.finish(req, reason, stop_reason)
        return True

    def _reaches_length(self, req: Request, num_tokens: int) -> bool:
        """Whether `num_tokens` tokens (prompt and outputs) end the request by length."""
        return num_tokens - req.num_prompt_tokens >= req.max_tokens or num_tokens >= self.max_model_len

    def _preempt(self, req: Request) -> None:
        req.spec_token_ids = []
        self.running.remove(req)
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1


def _logprobs(ro: RunnerOutput, i: int, num_accepted: int) -> list[list[TokenLogprob]] | None:
    """The runner's logprob arrays for request i, as TokenLogprob entries of its accepted tokens."""
    if ro.logprobs is None or ro.logprob_token_ids is None:
        return None
    ids, values = ro.logprob_token_ids[i], ro.logprobs[i]
    if ids is None or values is None:
        return None
    return [[TokenLogprob(t, v) for t, v in zip(ids[j], values[j], strict=True)] for j in range(num_accepted)]
