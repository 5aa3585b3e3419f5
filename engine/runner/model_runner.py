"""Turns a SchedulerOutput into one flat forward pass and samples the next tokens.

Per step: update the persistent batch from the scheduler's diffs (`update_states`), lay the
scheduled requests out in the attention backend's order and build the flat inputs with vectorised
index arithmetic (`prepare_inputs`), run the model (`forward`), and sample at each request's last
scheduled row when that row reaches the end of its known tokens (a partial prefill chunk samples
nothing). The runner never sees the scheduler's `Request` objects: it keeps its own per-request
state (the seeded generator survives a preemption) and reads only plain structs. A step holding a
traced request (`engine/trace`) runs with the tracer's hooks and laps; any other step checks one
empty dict.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from common.messages import LoraRequest
from engine.attention.base import AttentionBackend, StepInputs
from engine.attention.forward_context import ForwardContext, forward_context
from engine.core.outputs import RunnerOutput, SchedulerOutput
from engine.lora.context import lora_context
from engine.lora.manager import LoraManager
from engine.models.batch_invariance import invariant_rows_from
from engine.models.llama import CausalLM
from engine.runner.buffers import CpuGpuBuffer
from engine.runner.decode_graphs import DecodeGraphs
from engine.runner.input_batch import InputBatch
from engine.runner.model_inputs import ModelInputs
from engine.runner.pending import PendingStep, ReadyStep, add_logprobs
from engine.runner import prompt_logprobs
from engine.sample.sampler import Sampler
from engine.sample.verify import accept_drafts
from engine.structured.bitmask import apply_grammar_bitmask
from engine.trace.tracer import RequestTracer, StepTrace
from engine.utils import cdiv


class ModelRunner:
    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, device: torch.device, eos_token_ids: set[int], seed: int):
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.device = device
        self.batch = InputBatch(max_num_seqs, max_model_len, block_size, model.arch.vocab_size, device, eos_token_ids)
        # request id -> its generator (seeded requests only), kept from its first schedule to its end
        self.generators: dict[str, torch.Generator] = {}
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        self.sampler = Sampler(generator)
        # staging for the per-step inputs (pinned on CUDA, the same memory on CPU)
        self._token_index = CpuGpuBuffer(max_num_batched_tokens, torch.int64, device)
        self._positions = CpuGpuBuffer(max_num_batched_tokens, torch.int64, device)
        self._slots = CpuGpuBuffer(max_num_batched_tokens, torch.int64, device)
        self._query_start_loc = CpuGpuBuffer(max_num_seqs + 1, torch.int32, device)
        self._seq_lens = CpuGpuBuffer(max_num_seqs, torch.int32, device)
        self._rows = CpuGpuBuffer(max_num_seqs, torch.int64, device)
        # a drafting request samples every scheduled position: up to the token budget
        self._logits_indices = CpuGpuBuffer(max_num_batched_tokens, torch.int64, device)
        self._sampled_rows = CpuGpuBuffer(max_num_batched_tokens, torch.int64, device)
        # On CUDA, the staging copies of a step are asynchronous, and a step that samples nothing
        # has no host sync: the host must not rewrite the pinned buffers before they are copied.
        self._staged: torch.cuda.Event | None = None
        self.tracer = RequestTracer(model, backend, device)
        # decode steps at padded batch sizes, captured as CUDA graphs (set by the engine on CUDA)
        self.decode_graphs: DecodeGraphs | None = None
        # the resident LoRA adapters (set by the engine with --enable-lora), and each running
        # adapter's request by id
        self.lora: LoraManager | None = None
        self._loras: dict[int, LoraRequest] = {}

    def execute(self, so: SchedulerOutput) -> RunnerOutput:
        return self.execute_async(so).result()

    @torch.inference_mode()
    def execute_async(self, so: SchedulerOutput) -> PendingStep | ReadyStep:
        """Run the step; its sampled ids come with `result()` of what this returns (on CUDA the
        kernels are queued and the call returns before they finish)."""
        start = time.perf_counter()
        if self._staged is not None:
            self._staged.synchronize()
        self.update_states(so)
        if not so.num_scheduled_tokens:
            return ReadyStep(RunnerOutput.empty())
        inputs = self.prepare_inputs(so)
        trace = self.tracer.begin(inputs, start) if self.tracer.followed else None
        if trace is None:
            return self._run(so, inputs, None)
        with trace:
            result = self._run(so, inputs, trace).result()
        result.traces = trace.finish()
        return ReadyStep(result)

    def _run(self, so: SchedulerOutput, inputs: ModelInputs, trace: StepTrace | None) -> PendingStep | ReadyStep:
        """Forward, logits and sampling of a prepared step; `trace` takes a lap after each."""
        hidden = self.forward(inputs, eager=trace is not None)  # a traced step times every module
        if trace is not None:
            trace.lap("forward")
        step = self._sample(so, inputs, trace, hidden)
        if inputs.prompt_logprob_rows is not None:
            step.attach_prompt_logprobs(prompt_logprobs.compute(inputs.prompt_logprob_rows, hidden,
                                                                self.model.compute_logits))
        return step

    def _sample(self, so: SchedulerOutput, inputs: ModelInputs, trace: StepTrace | None,
                hidden: torch.Tensor) -> PendingStep | ReadyStep:
        if not inputs.sampled_request_ids:
            return ReadyStep(RunnerOutput.empty())
        with invariant_rows_from(inputs.invariant_logits_start):
            logits = self.model.compute_logits(hidden.index_select(0, inputs.logits_indices))  # [num_sampled, vocab]
        if so.grammar is not None:
            apply_grammar_bitmask(logits, so.grammar, self._logits_row_of(inputs))
        if trace is not None:
            trace.lap("logits")
        md = self.batch.sampling.metadata(inputs.sampled_rows)
        out = self.sampler(logits, md, self.batch.sampling)
        if trace is not None:
            trace.lap("sample")
        if inputs.num_logits is None:  # one token per request: the ids never leave the device first
            self.batch.append_sampled(inputs.sampled_rows, inputs.sampled_rows_dev, out.token_ids)
            # the step's one device-to-host read (plus logprobs if asked), when its result is asked for
            return PendingStep(inputs.sampled_request_ids, out.token_ids, md.num_logprobs, out.logprob_token_ids,
                               out.logprobs)
        assert inputs.drafts is not None
        accepted = accept_drafts(out.token_ids.tolist(), inputs.drafts, inputs.num_logits)
        self._append_accepted(inputs, accepted)
        result = RunnerOutput(inputs.sampled_request_ids, accepted)
        if out.logprobs is not None:
            assert out.logprob_token_ids is not None
            add_logprobs(result, out.logprob_token_ids.tolist(), out.logprobs.tolist(), md.num_logprobs.tolist(),
                         (np.cumsum(inputs.num_logits) - inputs.num_logits).tolist())
        return ReadyStep(result)

    @staticmethod
    def _logits_row_of(inputs: ModelInputs) -> dict[str, int]:
        """Sampled request id -> its first logits row."""
        if inputs.num_logits is None:
            return {r: i for i, r in enumerate(inputs.sampled_request_ids)}
        first = np.cumsum(inputs.num_logits) - inputs.num_logits
        return dict(zip(inputs.sampled_request_ids, first.tolist(), strict=True))

    def _append_accepted(self, inputs: ModelInputs, accepted: list[list[int]]) -> None:
        """Write each request's accepted tokens after its known ones (over its draft)."""
        assert inputs.num_logits is not None
        lengths = np.fromiter((len(a) for a in accepted), np.int64, len(accepted))
        request_rows = inputs.sampled_rows[np.cumsum(inputs.num_logits) - inputs.num_logits]
        rows = np.repeat(request_rows, lengths)
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        tokens = torch.tensor([t for a in accepted for t in a], dtype=torch.int64).to(self.device)
        self.batch.append_sampled(rows, torch.from_numpy(rows).to(self.device), tokens, offsets)

    def update_states(self, so: SchedulerOutput) -> None:
        """Apply the scheduler's diffs to the persistent batch: rows freed first, then taken."""
        for request_id in so.finished_request_ids:
            self.batch.remove(request_id)
            self.generators.pop(request_id, None)
            if self.tracer.tracking:
                self.tracer.forget(request_id)
        for request_id in so.preempted_request_ids:
            self.batch.remove(request_id)  # its generator stays: it resumes where it was
        for new in so.new_requests:
            generator = self.generators.get(new.request_id)
            if generator is None and new.sampling_params.seed is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(new.sampling_params.seed % 2**64)
                self.generators[new.request_id] = generator
            if new.sampling_params.lora is not None:
                self._loras[new.sampling_params.lora.id] = new.sampling_params.lora
            self.batch.add(new.request_id, new.token_ids, new.num_prompt_tokens, new.block_ids,
                           new.num_computed_tokens, new.sampling_params, generator)
            if new.sampling_params.trace:
                self.tracer.follow(new.request_id, new.num_prompt_tokens)
        for cached in so.cached_requests:
            row = self.batch.row_of[cached.request_id]
            self.batch.num_computed_tokens[row] = cached.num_computed_tokens
            draft = so.spec_token_ids.get(cached.request_id)
            if draft:  # input only: the tokens after the known ones, until verified
                self.batch.write_draft(row, draft)
            if cached.new_block_ids:
                self.batch.append_blocks(row, cached.new_block_ids)

    def prepare_inputs(self, so: SchedulerOutput) -> ModelInputs:
        """The flat batch for this step, requests in the backend's order; vectorised, no per-token
        Python."""
        b, bs = self.batch, self.block_size
        request_ids = list(so.num_scheduled_tokens)
        num_reqs = len(request_ids)
        rows = np.fromiter((b.row_of[r] for r in request_ids), np.int64, num_reqs)
        query_lens = np.fromiter(so.num_scheduled_tokens.values(), np.int64, num_reqs)
        asks = b.batch_invariant[rows]
        invariant: np.ndarray | None = asks if asks.any() else None
        order = self.backend.order_requests(query_lens, invariant)
        if order is not None:
            rows, query_lens = rows[order], query_lens[order]
            request_ids = [request_ids[i] for i in order]
            invariant = None if invariant is None else invariant[order]
        assert invariant is None or (np.diff(invariant.view(np.int8)) >= 0).all(), "batch-invariant requests last"
        num_computed = b.num_computed_tokens[rows]
        seq_lens = num_computed + query_lens
        known = b.num_tokens[rows]
        num_draft = None
        if so.spec_token_ids:
            num_draft = np.fromiter((len(so.spec_token_ids.get(r, ())) for r in request_ids), np.int64, num_reqs)
            known = known + num_draft
        assert (seq_lens <= known).all(), "scheduled past the known tokens"
        qsl = np.zeros(num_reqs + 1, np.int64)
        np.cumsum(query_lens, out=qsl[1:])
        num_tokens = int(qsl[-1])
        request_of_token = np.repeat(np.arange(num_reqs), query_lens)
        positions = num_computed[request_of_token] + np.arange(num_tokens) - qsl[request_of_token]
        token_rows = rows[request_of_token]
        slots = b.block_table.np[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        width = cdiv(int(seq_lens.max()), bs)
        rows_dev = self._rows.stage(rows)
        block_table = b.block_table.to_device(columns=width)[:, :width].index_select(0, rows_dev)
        step = StepInputs(
            num_reqs=num_reqs, num_tokens=num_tokens, block_size=bs,
            query_start_loc=self._query_start_loc.stage(qsl), query_start_loc_np=qsl,
            seq_lens=self._seq_lens.stage(seq_lens), seq_lens_np=seq_lens, num_computed_tokens_np=num_computed,
            positions=self._positions.stage(positions), slot_mapping=self._slots.stage(slots),
            block_table=block_table, batch_invariant_np=invariant)
        token_index = self._token_index.stage(token_rows * self.max_model_len + positions)
        input_ids = b.token_ids.view(-1).index_select(0, token_index)
        samples = np.flatnonzero(seq_lens == known)  # requests whose scheduled tokens reach the end
        sampled_ids = [request_ids[i] for i in samples]
        drafts = num_logits = None
        if num_draft is None:  # the last row of each
            logits_rows, sampled_rows = qsl[1:][samples] - 1, rows[samples]
        else:  # a drafting request's every position: its last token and each draft token
            num_logits = 1 + num_draft[samples]
            starts = np.repeat(qsl[1:][samples] - num_logits, num_logits)
            logits_rows = starts + np.arange(int(num_logits.sum())) - np.repeat(np.cumsum(num_logits) - num_logits,
                                                                                num_logits)
            sampled_rows = np.repeat(rows[samples], num_logits)
            drafts = [so.spec_token_ids.get(r, []) for r in sampled_ids]
        logits_indices = self._logits_indices.stage(logits_rows)
        sampled_rows_dev = self._sampled_rows.stage(sampled_rows)
        if self.device.type == "cuda":
            self._staged = torch.cuda.Event()
            self._staged.record()
        inputs = ModelInputs(request_ids, input_ids, step.positions, step, logits_indices, sampled_ids, sampled_rows,
                             sampled_rows_dev, drafts, num_logits)
        if self.lora is not None:
            inputs.lora = self._lora_groups(rows, request_of_token)
        if b.num_prompt_logprob_rows:
            inputs.prompt_logprob_rows = prompt_logprobs.select_rows(
                request_ids, rows, qsl, num_computed, seq_lens, b.num_prompt_tokens[rows], b.prompt_logprobs[rows],
                b.token_ids, self.max_model_len)
        if invariant is not None:
            first = int(np.argmax(invariant))
            inputs.invariant_token_start = int(qsl[first])
            normal_samples = samples[samples < first]
            inputs.invariant_logits_start = len(normal_samples) if num_logits is None \
                else int(num_logits[: len(normal_samples)].sum())
        return inputs

    def _lora_groups(self, rows: np.ndarray, request_of_token: np.ndarray):
        """The step's LoRA slot groups (its adapters made resident), None when every row is the base model's."""
        assert self.lora is not None
        ids = self.batch.lora_id[rows]
        if not ids.any():
            return None
        step_ids = set(np.unique(ids).tolist()) - {0}
        # adapters no running row uses any more: forget their requests (their weights stay cached)
        self._loras = {i: lora for i, lora in self._loras.items() if i in set(self.batch.lora_id.tolist())}
        return self.lora.step_groups(ids[request_of_token], {i: self._loras[i] for i in sorted(step_ids)})

    def forward(self, inputs: ModelInputs, eager: bool = False) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of the flat batch: a decode step through the captured
        graphs where there are (not `eager`), else the model's modules."""
        step, graphs = inputs.attention, self.decode_graphs
        if graphs is not None and graphs.takes(step.num_tokens, step.num_reqs, eager or inputs.lora is not None
                                               or inputs.invariant_token_start is not None):
            return graphs.run(inputs.input_ids, step.positions, step.slot_mapping, step.block_table, step.seq_lens)
        metadata = self.backend.build_metadata(inputs.attention)
        with forward_context(ForwardContext(self.backend, metadata, self.kv_caches)), \
                invariant_rows_from(inputs.invariant_token_start), lora_context(inputs.lora):
            return self.model(inputs.input_ids, inputs.positions)
