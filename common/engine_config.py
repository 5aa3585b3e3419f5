"""Engine configuration: one frozen dataclass, also the source of the CLI flags.

Each field's `metadata["help"]` becomes a `--flag-name` (and an environment variable
`LLM_FLAG_NAME`) in `common.cli_args`, so the engine, the server and the benchmark share one
definition of every knob.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.cli_args import opt
from common.kv_events_config import KVEventsConfig, parse_kv_events_config
from common.speculative_config import SpeculativeConfig, parse_speculative_config


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = opt(None, "Hugging Face model folder; default: the embedded SmolLM2-135M-Instruct")
    load_format: str = opt(
        "auto", "auto: the weights in the folder's *.safetensors; dummy: random weights from its config.json "
                "alone (shapes and speed only, the text is noise)", choices=("auto", "dummy"))
    quantization: str = opt(
        "auto", "auto: the default model runs on its GGUF file's own Q4_1 / Q8_0 codes (at the batch sizes where "
                "they are faster; larger batches by --batch-linear), a model folder on its dense weights; "
                "gguf: the codes of the default model's GGUF or of a *.gguf in the model folder; none: dense "
                "--dtype weights; int8: dense weights quantized per output channel, run with int8 activations "
                "(per group of 64; lossy, needs the int8 kernels: AVX2 or AVX512-VNNI)",
        choices=("auto", "gguf", "none", "int8"))
    batch_linear: str = opt(
        "auto", "the linear layers of batches above the GGUF codes' crossover: int8 (activations per group of 64 x "
                "weights per output channel, AVX2 or AVX512-VNNI; and with VNNI the Q4_1 codes of the rows below "
                "the crossover against int8 activations per group of 32 too: faster at batch 1, lossy), dense "
                "(--dtype weights through oneDNN), amx (the codes as bfloat16 tiles on AMX: the dense weights on a "
                "third of the bytes; bfloat16 only), or auto: the fastest of dense, amx (where the CPU has AMX) and "
                "int8 (where the kernel tier has an int8 dot product) measured at start-up, the codes' rows on the "
                "exact codes (where auto chose float32, a CPU without bf16 arithmetic: the Q4_1 codes against int8 "
                "activations at every row, as llama.cpp runs them); with an explicit --dtype float32, dense",
        choices=("auto", "int8", "dense", "amx"))
    dtype: str = opt("auto", "float32 | bfloat16 | float16 | auto (bfloat16 on CUDA and on CPUs whose kernel tier "
                             "has bf16 arithmetic: AVX512-BF16, AMX; float32 on other CPUs)")
    device: str = opt("auto", "cpu | cuda | auto")
    max_model_len: int | None = opt(None, "longest prompt + output, in tokens; default: the model's limit")
    max_num_seqs: int = opt(64, "most sequences in one engine step")
    max_num_batched_tokens: int = opt(512, "token budget of one engine step (prefill chunks + decodes)")
    block_size: int = opt(16, "tokens per KV cache block")
    kv_cache_dtype: str = opt(
        "auto", "auto: the KV cache in --dtype; int8: each token's K and V row per kv head as int8 codes with "
                "one float32 scale (about half the bytes of bfloat16 for decode attention to read, and twice the "
                "tokens in the same memory; lossy; the CPU attention backend only)", choices=("auto", "int8"))
    kv_cache_memory: int | None = opt(
        None, "bytes for the KV cache; default: a fraction of free memory (on CPU at most 4 GiB)")
    gpu_memory_utilization: float = opt(0.9, "fraction of device memory the engine may use (CUDA)")
    cpu_kv_cache_fraction: float = opt(0.25, "fraction of available host memory for the KV cache (CPU)")
    enable_prefix_caching: bool = opt(True, "reuse the KV blocks of a shared prompt prefix")
    seed: int = opt(0, "seed of the generator for requests without their own seed")
    speculative_config: SpeculativeConfig | None = opt(
        None, 'n-gram speculative decoding, as vLLM\'s JSON: \'{"method": "ngram", "num_speculative_tokens": 4, '
              '"prompt_lookup_min": 2, "prompt_lookup_max": 5}\'', parse=parse_speculative_config,
        metavar="JSON")
    kv_events_config: KVEventsConfig | None = opt(
        None, 'publish KV cache events (blocks stored, removed, all cleared) for KV-aware routers, as vLLM\'s '
              'JSON: \'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
              '"replay_endpoint": "tcp://*:5558", "topic": ""}\' (docs/scale-out.md)', parse=parse_kv_events_config,
        metavar="JSON")
    grammar_compile_timeout: float = opt(
        10.0, "seconds a structured-outputs grammar (response_format, structured_outputs, tools) may take to "
              "compile; a slower one is refused with a 400")

    batch_invariant: bool = opt(
        False, "every request's logits independent of the batch it lands in (a request can also ask with "
               '"batch_invariant": true)')

    attention_backend: str = opt(
        "auto", "auto: triton-paged on CUDA (Triton kernels), torch-paged on CPU (torch ops and the native "
                "kernels); triton-paged on CPU only under Triton's interpreter (TRITON_INTERPRET=1, for tests)",
        choices=("auto", "torch-paged", "triton-paged"))
    enforce_eager: bool = opt(
        False, "on CUDA, run decode steps eagerly instead of replaying captured CUDA graphs")
    async_scheduling: str = opt(
        "auto", "schedule and launch each step before reading the previous one's sampled ids, so the host's "
                "work overlaps the device's; auto: on for CUDA, off on CPU (where the host runs the step "
                "itself, so it would only delay every token by a step); off with speculative decoding",
        choices=("auto", "on", "off"))

    native_kernels: bool = opt(
        True, "on CPU, run the native C++ kernels (built at install in ISA tiers; the best tier the CPU runs, or "
              "LLM_CPU_KERNEL_TIER=avx2|scalar|...; without them the torch paths run and the log says why)")

    enable_lora: bool = opt(
        False, "serve LoRA adapters (PEFT folders) on the attention and MLP projections, chosen per request "
               "(docs/lora.md)")
    max_loras: int = opt(1, "LoRA adapters resident at once: the most distinct adapters among the running requests")
    max_lora_rank: int = opt(16, "the largest LoRA rank served; a folder with a larger one is refused")
    max_cpu_loras: int | None = opt(
        None, "LoRA adapters kept loaded in host memory (least recently used out first); default: max_loras")

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)
