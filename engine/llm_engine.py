"""The in-process engine: add_request / abort / step / has_unfinished.

One step is schedule() -> execute() -> update(), and returns one TokenDelta per request that
produced tokens or finished in that step. Bad parameters raise ValueError in add_request,
before anything reaches the scheduler.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from engine.block_manager import BlockManager
from common.engine_config import EngineConfig
from common.default_model import resolve_model_path
from engine.device import resolve_device, resolve_dtype
from engine.host_limits import limit_torch_threads
from engine.kv_cache import allocate_kv_caches, available_memory, bytes_per_block
from common.messages import EngineStats, SamplingParams, TokenDelta
from engine.model_runner import ModelRunner
from engine.models.cpu_linear import can_pack, pack_linears
from engine.models.loader import load_model, read_hf_config
from engine.request import Request
from common.validation import validate_prompt, validate_sampling_params
from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)

CPU_KV_CACHE_MAX_BYTES = 4 << 30


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.model_dir = resolve_model_path(config.model)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cpu":
            limit_torch_threads()
        hf_config = read_hf_config(self.model_dir)
        self.model = load_model(self.model_dir, self.dtype, self.device)
        if can_pack(self.dtype, self.device):
            pack_linears(self.model, batch_hint=config.max_num_seqs)
        arch = self.model.arch
        self.vocab_size = arch.vocab_size
        self.eos_token_ids = _eos_token_ids(self.model_dir, hf_config)
        if config.max_model_len and config.max_model_len > arch.max_position_embeddings:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's limit "
                             f"{arch.max_position_embeddings}")
        self.max_model_len = config.max_model_len or arch.max_position_embeddings
        num_blocks = self._num_kv_blocks(config)
        self.num_kv_tokens = num_blocks * config.block_size
        if self.num_kv_tokens < self.max_model_len:
            raise ValueError(f"the KV cache holds {self.num_kv_tokens} tokens, fewer than max_model_len "
                             f"{self.max_model_len}: raise --kv-cache-memory or lower --max-model-len")
        kv_caches = allocate_kv_caches(arch, num_blocks, config.block_size, self.dtype, self.device)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, kv_caches, config.block_size, self.device, self.eos_token_ids, config.seed)
        self.requests: dict[str, Request] = {}
        self.config = config
        logger.info("model %s on %s (%s): KV cache %d blocks x %d = %d tokens, max_model_len %d",
                    self.model_dir, self.device, str(self.dtype).removeprefix("torch."), num_blocks,
                    config.block_size, self.num_kv_tokens, self.max_model_len)

    def _num_kv_blocks(self, config: EngineConfig) -> int:
        per_block = bytes_per_block(self.model.arch, config.block_size, self.dtype)
        if config.kv_cache_memory is not None:
            budget = config.kv_cache_memory
        elif self.device.type == "cuda":
            budget = int(available_memory(self.device) * config.gpu_memory_utilization)
        else:  # a fraction of free memory, at most 4 GiB like vLLM's CPU backend: more is
            # seldom usable by a CPU and costs seconds to zero at start-up
            budget = min(int(available_memory(self.device) * config.cpu_kv_cache_fraction), CPU_KV_CACHE_MAX_BYTES)
        # More blocks than every sequence at full length could use is memory for nothing.
        useful = config.max_num_seqs * -(-self.max_model_len // config.block_size)
        return max(1, min(budget // per_block, useful))

    # ---- the interface --------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already running")
        validate_sampling_params(sampling_params, self.vocab_size)
        if sampling_params.n != 1:
            raise ValueError("n: the engine runs one sequence per request; fan out with common.parallel_sampling")
        max_tokens = validate_prompt(prompt_token_ids, self.vocab_size, sampling_params.max_tokens, self.max_model_len)
        generator = None
        if sampling_params.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(sampling_params.seed % 2**64)
        req = Request(request_id, prompt_token_ids, sampling_params, max_tokens,
                      time.time() if arrival_time is None else arrival_time, generator)
        self.requests[request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> bool:
        """Free everything the request holds at once; False for an unknown (or finished) id."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.finish(req, "abort")
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[TokenDelta]:
        batch = self.scheduler.schedule()
        if batch.is_empty:
            return []
        sampled_reqs, out = self.runner.execute(batch)
        for req, num_new in batch.entries:
            req.num_computed_tokens += num_new
            self.block_manager.cache_full_blocks(req)
        deltas = []
        for i, req in enumerate(sampled_reqs):
            token = out.token_ids[i]
            req.append_token(token)
            self._check_stop(req, token)
            deltas.append(TokenDelta(
                request_id=req.request_id, new_token_ids=[token],
                logprobs=None if out.logprobs[i] is None else [out.logprobs[i]],
                finish_reason=req.finish_reason, stop_reason=req.stop_reason,
                num_cached_tokens=req.num_cached_tokens))
        return deltas

    def _check_stop(self, req: Request, token: int) -> None:
        p = req.params
        reason, stop_reason = None, None
        if req.num_output_tokens >= p.min_tokens:
            if token in p.stop_token_ids:
                reason, stop_reason = "stop", token
            elif not p.ignore_eos and token in self.eos_token_ids:
                reason = "stop"
        if reason is None and (req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len):
            reason = "length"
        if reason is not None:
            self.scheduler.finish(req, reason, stop_reason)
            del self.requests[req.request_id]

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
                           kv_cache_usage=bm.usage, prefix_cache_queries=bm.prefix_queries,
                           prefix_cache_hits=bm.prefix_hits, num_preemptions=self.scheduler.num_preemptions)


def _eos_token_ids(model_dir: Path, hf_config: dict) -> set[int]:
    ids: set[int] = set()
    for source in (hf_config, _read_json(Path(model_dir) / "generation_config.json")):
        value = source.get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(value)
    return ids


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
