"""The in-process engine: an EngineCore assembled from a model folder and an EngineConfig.

Assembly only: the platform decides device, dtype, threads, KV budget, attention backend and
linear method; the model is loaded with that method; the KV cache is sized and allocated in the
backend's layout; then the block manager, scheduler and runner are built. The machine's roofs are
measured once (cached) before the model loads, for the per-step roofline metrics. The request
lifecycle (add_request / abort / step) is EngineCore's.
"""
from __future__ import annotations

import logging
import time
from types import ModuleType

import torch

from common.default_model import resolve_model_path
from common.engine_config import EngineConfig
from common.errors import InvalidRequest
from common.lora_folder import LoraFolderError, read_model_config
from common.messages import SamplingParams
from common.generation_config import load_eos_token_ids, load_generation_defaults
from engine.attention import create_backend
from engine.attention.kv_int8 import describe_kv_dtype, row_width
from engine.core.block_manager import BlockManager
from engine.core.engine_core import EngineCore
from engine.core.scheduler import Scheduler
from engine.lora.manager import LoraManager
from engine.models.config import ModelArch, read_hf_config
from engine.models.batch_invariance import describe_invariance
from engine.models.gguf_codes import gguf_file, read_group_codes
from engine.models.int8_linear import use_int8_weights
from engine.models.group_quantized import describe_batch_methods, measure_batch_methods, use_group_codes
from engine.models.linear import LinearMethod, probe_batch_invariance, weight_bytes_per_element, weights_on_huge_pages
from engine.models.layers import RMSNorm
from engine.models.llama import MLP
from engine.models.loader import load_model
from engine.models.native_decode import EVERY_STEP, NativeDecodeLayers, unsupported_reason
from engine.platform import Platform
from engine.roofline.cost_model import RooflineModel
from engine.roofline.measure import measured_limits
from engine.roofline.step_account import StepRoofline
from engine.runner.decode_graphs import DecodeGraphs, capture_sizes
from engine.runner.kv_cache import allocate_kv_caches, bytes_per_block
from engine.runner.model_runner import ModelRunner
from engine.runner.profile_run import peak_activation_bytes
from engine.structured.manager import StructuredOutputManager
from engine.utils import cdiv

logger = logging.getLogger(__name__)


class LLMEngine(EngineCore):
    def __init__(self, config: EngineConfig):
        self.model_dir = resolve_model_path(config.model)
        self.platform = Platform.create(config.device, config.dtype, config.native_kernels)
        self.platform.configure_host()
        self.device, self.dtype = self.platform.device, self.platform.dtype
        self.machine_limits = measured_limits(self.device, self.dtype)  # before the model takes the memory
        arch = ModelArch.from_hf_config(read_hf_config(self.model_dir))
        self.eos_token_ids = load_eos_token_ids(self.model_dir)
        self.generation_defaults = load_generation_defaults(self.model_dir)  # for the front end
        if config.max_model_len and config.max_model_len > arch.max_position_embeddings:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's limit "
                             f"{arch.max_position_embeddings}")
        max_model_len = config.max_model_len or arch.max_position_embeddings
        native_kernels = self.platform.native  # None on CUDA, or with --no-native-kernels
        dense_method = self.platform.linear_method(batch_hint=config.max_num_seqs)
        if config.quantization == "int8":  # the weights as loaded, re-quantized below
            if native_kernels is None or not native_kernels.int8_linear_available():
                raise ValueError("--quantization int8: needs the native CPU kernels' int8 dot product (AVX2 or "
                                 "AVX512-VNNI; not the scalar tier)")
        self.model = load_model(self.model_dir, self.dtype, self.device,
                                LinearMethod() if config.quantization == "int8" else dense_method,
                                random_weights=config.load_format == "dummy")
        if config.quantization == "int8":
            assert native_kernels is not None
            others = use_int8_weights(self.model, native_kernels, dense_method)
            logger.info("--quantization int8: linear layers as int8 (per output channel) x int8 activations (per "
                        "group of 64); dense: %s", ", ".join(others) or "none")
        self.quantized = self._use_gguf_codes(config, native_kernels)
        if self.device.type == "cpu":  # the kernels' weights, read at every step: a page walk per 4 KiB otherwise
            moved = weights_on_huge_pages(self.model)
            if moved:
                logger.info("the kernels' weights (%.1f MB) copied into one buffer advised to huge pages", moved / 1e6)
        # how batch-invariant rows go through each linear shape (engine/models/batch_invariance.py)
        invariance = probe_batch_invariance(self.model, self.dtype, self.device, config.max_num_batched_tokens,
                                            config.max_num_batched_tokens)
        # the KV cache's element type: the engine's, or int8 rows with a scale each (kv_int8.py)
        self.kv_cache_dtype = torch.int8 if config.kv_cache_dtype == "int8" else self.dtype
        if config.kv_cache_dtype == "int8" and self.device.type != "cpu":
            raise ValueError("--kv-cache-dtype int8: the CPU's attention backend only")
        backend = create_backend(self.platform.choose_attention_backend(config.attention_backend), arch.num_heads,
                                 arch.num_kv_heads, arch.head_dim, config.block_size, native_kernels,
                                 self.kv_cache_dtype)
        activation_bytes = 0
        if self.device.type == "cuda" and config.kv_cache_memory is None:  # what the largest step needs, first
            activation_bytes = peak_activation_bytes(self.model, backend, self.dtype, self.device,
                                                     config.max_num_batched_tokens, config.max_num_seqs,
                                                     config.block_size)
            logger.info("the largest step (%d tokens, %d logits rows) peaks at %.2f GiB of activations",
                        config.max_num_batched_tokens, config.max_num_seqs, activation_bytes / 2**30)
        num_blocks = self._num_kv_blocks(config, arch, max_model_len, activation_bytes)
        self.num_kv_tokens = num_blocks * config.block_size
        if self.num_kv_tokens < max_model_len:
            raise ValueError(f"the KV cache holds {self.num_kv_tokens} tokens, fewer than max_model_len "
                             f"{max_model_len}: raise --kv-cache-memory or lower --max-model-len")
        for module in self.model.modules():
            if isinstance(module, RMSNorm | MLP):
                module.native = native_kernels  # fused add + RMSNorm, silu-and-mul
        # one block more than the block manager hands out: the padded rows of a captured decode batch
        pad_block = num_blocks
        kv_caches = allocate_kv_caches(arch.num_layers, backend.kv_cache_shape(num_blocks + 1), self.kv_cache_dtype,
                                       self.device)
        one_call = "the native kernels are off" if native_kernels is None else unsupported_reason(self.model)
        if native_kernels is not None and one_call is None:  # small decode steps: every layer in one native call
            self.model.native_layers = NativeDecodeLayers(self.model, native_kernels, kv_caches)
            rows = self.model.native_layers.max_rows
            one_call = "every decode step" if rows == EVERY_STEP else f"decode steps of up to {rows} rows"
        self.lora_manager = None
        if config.enable_lora:
            self.lora_manager = LoraManager(self.model, read_model_config(self.model_dir), config.max_loras,
                                            config.max_lora_rank, config.max_cpu_loras or config.max_loras,
                                            self.dtype, self.device, native_kernels)
            if self.model.native_layers is not None:  # decode steps with adapters stay in the one call
                self.model.native_layers.attach_lora(self.model)
        block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        scheduler = Scheduler(block_manager, config.max_num_seqs, config.max_num_batched_tokens, max_model_len,
                              self.eos_token_ids, config.speculative_config,
                              StructuredOutputManager(str(self.model_dir), arch.vocab_size, sorted(self.eos_token_ids)),
                              max_loras=config.max_loras if config.enable_lora else 0)
        runner = ModelRunner(self.model, kv_caches, backend, config.block_size, config.max_num_seqs,
                             config.max_num_batched_tokens, max_model_len, self.device, self.eos_token_ids,
                             config.seed)
        runner.lora = self.lora_manager
        runner.sampler.native = native_kernels  # each draw's passes over the vocabulary (CPU)
        graphs = "off (--enforce-eager)" if config.enforce_eager else "off (a CPU)"
        if self.device.type == "cuda" and not config.enforce_eager:
            runner.decode_graphs = DecodeGraphs(self.model, backend, kv_caches, capture_sizes(config.max_num_seqs),
                                                max_model_len, config.block_size, pad_block, self.device)
            start = time.perf_counter()
            with torch.inference_mode():
                runner.decode_graphs.capture()
            graphs = f"{runner.decode_graphs.describe()} in {time.perf_counter() - start:.1f} s"
        async_scheduling = config.async_scheduling == "on" or (config.async_scheduling == "auto"
                                                               and self.device.type == "cuda")
        super().__init__(scheduler, runner, arch.vocab_size, max_model_len, config.batch_invariant, async_scheduling)
        if config.kv_events_config is not None and config.kv_events_config.publishes:
            if not config.enable_prefix_caching:  # the events are the prefix cache's: there would be none
                logger.warning("KV cache events: none to publish with --no-enable-prefix-caching")
            else:
                from engine.kv_events.publisher import ZmqEventPublisher
                block_manager.kv_events = []
                self.kv_event_publisher = ZmqEventPublisher(config.kv_events_config)
        element_bytes = self.dtype.itemsize  # activations are in the engine's dtype
        kv_bytes = row_width(arch.head_dim, self.kv_cache_dtype) * self.kv_cache_dtype.itemsize / arch.head_dim
        # weights as a decode step reads them (the codes' where they run; a batch above the
        # crossover reads the dense weights, more than this counts)
        weight_bytes = weight_bytes_per_element(self.model, 1, self.dtype)
        self.step_observer = StepRoofline(RooflineModel(arch, weight_bytes, kv_bytes, element_bytes),
                                          self.machine_limits)
        logger.info("model %s on %s", self.model_dir, self.platform.describe(config.max_num_seqs))
        logger.info("native CPU kernels (decode attention, RoPE + KV write, add + RMSNorm, silu-and-mul): %s",
                    "on" if native_kernels is not None else "off, torch ops")
        logger.info("all layers in one native call: %s", one_call)
        logger.info("batch-invariant rows: %s", describe_invariance(invariance))
        logger.info("decode graphs: %s", graphs)
        logger.info("LoRA adapters: %s", "off" if not config.enable_lora else
                    f"up to {config.max_loras} resident, rank <= {config.max_lora_rank}")
        logger.info("async scheduling: %s", describe_async_scheduling(config, self.device, self.async_scheduling))
        logger.info("KV cache %d blocks x %d = %d tokens (%s), max_model_len %d", num_blocks, config.block_size,
                    self.num_kv_tokens, describe_kv_dtype(self.kv_cache_dtype), max_model_len)
        logger.info("machine limits (roofline metrics): %s", self.machine_limits.describe())

    def check_lora(self, sampling_params: SamplingParams) -> None:
        lora = sampling_params.lora
        assert lora is not None
        if self.lora_manager is None:
            super().check_lora(sampling_params)
            return
        try:
            self.lora_manager.check(lora)
        except LoraFolderError as e:
            raise InvalidRequest("model", f"LoRA adapter {lora.name!r}: {e}") from None

    def _use_gguf_codes(self, config: EngineConfig, native: ModuleType | None) -> bool:
        """Run the linear layers on the GGUF's codes where asked (--quantization) and possible."""
        gguf_path = gguf_file(config, self.model_dir)
        if gguf_path is None:
            return False
        if native is None or self.dtype not in (torch.float32, torch.bfloat16):
            why_not = ("the native CPU kernels are off or failed to build" if native is None
                       else f"the codes' kernel takes float32 or bfloat16, not {self.dtype}")
            if config.quantization == "gguf":
                raise ValueError(f"--quantization gguf: {why_not}")
            logger.warning("dense weights: %s", why_not)
            return False
        arch = self.model.arch
        if config.batch_linear == "int8" and not native.int8_linear_available():
            raise ValueError("--batch-linear int8: the int8 kernel needs AVX2 or AVX512-VNNI (not the scalar tier)")
        # --dtype float32 asks for float32's precision: int8 batches only when named (float32 that
        # auto chose for a CPU without bf16 arithmetic takes what is fastest, as bfloat16 does)
        batch_linear = config.batch_linear
        if batch_linear == "auto" and (self.dtype not in (torch.float32, torch.bfloat16)
                                       or getattr(self.platform, "float32_asked", False)):
            batch_linear = "dense"
        if batch_linear == "amx" and (self.dtype != torch.bfloat16 or not native.amx_linear_available()):
            raise ValueError("--batch-linear amx: needs --dtype bfloat16 and a CPU with AMX-BF16")
        # The codes' few rows against int8 activations too where auto chose float32 (a CPU without
        # bf16 arithmetic), as llama.cpp runs Q4 weights against Q8 activations: there the float32
        # codes are bound by converting every code, not by its bytes (AMD EPYC Zen 3: the layers
        # of a batch-1 step 1.3-1.5x faster), and the batches above take int8 activations anyway
        int8_codes = batch_linear == "int8" or (batch_linear == "auto" and self.dtype == torch.float32)
        dense_left = use_group_codes(self.model, read_group_codes(gguf_path, arch.num_heads, arch.num_kv_heads), native,
                                     int8=batch_linear in ("auto", "int8"), int8_codes=int8_codes,
                                     amx=batch_linear in ("auto", "amx") and self.dtype == torch.bfloat16)
        verdicts = measure_batch_methods(self.model, self.dtype, config.max_num_seqs, batch_linear)
        logger.info("linear layers on the codes of %s: %s; dense: %s", gguf_path.name, describe_batch_methods(verdicts),
                    ", ".join(dense_left) or "none")
        return True

    def _num_kv_blocks(self, config: EngineConfig, arch: ModelArch, max_model_len: int, activation_bytes: int) -> int:
        budget = self.platform.kv_cache_budget(config, activation_bytes)
        # More blocks than every sequence at full length could use is memory for nothing.
        useful = config.max_num_seqs * cdiv(max_model_len, config.block_size)
        return max(1, min(budget // bytes_per_block(arch, config.block_size, self.kv_cache_dtype), useful))


def describe_async_scheduling(config: EngineConfig, device: torch.device, on: bool) -> str:
    if on:
        return "on (the next step is scheduled while this one runs)"
    if config.async_scheduling != "off" and config.speculative_config is not None:
        return "off (speculative decoding)"
    return "off (--async-scheduling off)" if config.async_scheduling == "off" else f"off (a {device.type.upper()})"
