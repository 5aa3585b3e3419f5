"""Request traces ("trace": true) against the shape table of Qwen3-0.6B that forward hooks on
transformers' model print for a 17-token chat prompt (layer 0, prefill then one decode step).

Shapes only, so the engine runs the real architecture (engine/models/configs/qwen3-0.6b) with
random weights, in bfloat16 to halve the memory. Also: a traced request batched with another
keeps its own shapes and reports the batch's, the other gets no trace, and nothing stays hooked;
a chunked prompt is recorded at its last chunk, with the chunks before it summarised.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from torch.nn.modules import module as torch_module

from common.engine_config import EngineConfig
from common.messages import EngineTrace, SamplingParams, TraceStep, TraceStop
from engine.llm_engine import LLMEngine

QWEN3_06B = Path(__file__).resolve().parents[2] / "engine" / "models" / "configs" / "qwen3-0.6b"
PROMPT = list(range(1000, 1017))  # 17 arbitrary ids: the seed's chat prompt had 17 tokens

# module: (prefill in, prefill out, decode in, decode out), (batch, tokens, features), in the
# order the seed's forward hooks fired
SEED_TABLE = {
    "embed_tokens": ([1, 17], [1, 17, 1024], [1, 1], [1, 1, 1024]),
    "input_layernorm": ([1, 17, 1024], [1, 17, 1024], [1, 1, 1024], [1, 1, 1024]),
    "q_proj": ([1, 17, 1024], [1, 17, 2048], [1, 1, 1024], [1, 1, 2048]),
    "k_proj": ([1, 17, 1024], [1, 17, 1024], [1, 1, 1024], [1, 1, 1024]),
    "v_proj": ([1, 17, 1024], [1, 17, 1024], [1, 1, 1024], [1, 1, 1024]),
    "self_attn": ([1, 17, 1024], [1, 17, 1024], [1, 1, 1024], [1, 1, 1024]),
    "post_attention_layernorm": ([1, 17, 1024], [1, 17, 1024], [1, 1, 1024], [1, 1, 1024]),
    "gate_proj": ([1, 17, 1024], [1, 17, 3072], [1, 1, 1024], [1, 1, 3072]),
    "up_proj": ([1, 17, 1024], [1, 17, 3072], [1, 1, 1024], [1, 1, 3072]),
    "down_proj": ([1, 17, 3072], [1, 17, 1024], [1, 1, 3072], [1, 1, 1024]),
    "norm": ([1, 17, 1024], [1, 17, 1024], [1, 1, 1024], [1, 1, 1024]),
    # The seed's prefill row is (1, 17, 1024) -> (1, 17, 151936): transformers computes logits at
    # every position. Our engine computes the LM head at the last position only (the other
    # positions' logits would be thrown away), so ours is one row, in the prefill as in a decode.
    "lm_head": ([1, 1, 1024], [1, 1, 151936], [1, 1, 1024], [1, 1, 151936]),
}


def greedy(max_tokens: int, trace: bool) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, trace=trace)


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[EngineTrace]]:
    """Run the requests to the end, from a cold prefix cache; per request the trace parts its
    deltas carried."""
    engine.scheduler.reset_prefix_cache()
    for request_id, (ids, params) in requests.items():
        engine.add_request(request_id, ids, params)
    parts: dict[str, list[EngineTrace]] = {request_id: [] for request_id in requests}
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.trace is not None:
                parts[delta.request_id].append(delta.trace)
    return parts


def prefill_and_decode(parts: list[EngineTrace]) -> tuple[TraceStep, TraceStep]:
    assert len(parts) == 2, "one part with the prefill's delta, one with the first decode's"
    assert parts[0].prefill is not None and parts[0].decode is None
    assert parts[1].decode is not None and parts[1].prefill is None
    return parts[0].prefill, parts[1].decode


def by_name(step: TraceStep) -> dict[str, TraceStop]:
    stops = {stop.name: stop for stop in step.stops}
    assert len(stops) == len(step.stops), "each stop once"
    return stops


@pytest.fixture(scope="module")
def qwen3_engine():
    engine = LLMEngine(EngineConfig(model=str(QWEN3_06B), load_format="dummy", dtype="bfloat16", device="cpu",
                                    max_model_len=64, kv_cache_memory=16 << 20, max_num_seqs=4,
                                    max_num_batched_tokens=64))
    yield engine
    del engine


def test_trace_has_the_shapes_of_the_seed_table(qwen3_engine):
    parts = run(qwen3_engine, {"traced": (PROMPT, greedy(2, trace=True))})["traced"]
    prefill, decode = prefill_and_decode(parts)
    assert (parts[0].device, parts[0].dtype, parts[0].attention_backend) == ("cpu", "bfloat16", "torch-paged")
    assert parts[0].queue_ms is not None and parts[0].queue_ms >= 0
    assert (prefill.tokens, prefill.cached_tokens, prefill.context_tokens) == (17, 0, 17)
    assert (decode.tokens, decode.cached_tokens, decode.context_tokens) == (1, 17, 18)
    assert (prefill.batch_tokens, prefill.batch_requests, decode.batch_tokens) == (17, 1, 1)
    ours = {"prefill": by_name(prefill), "decode": by_name(decode)}
    for module, (pre_in, pre_out, dec_in, dec_out) in SEED_TABLE.items():
        assert (ours["prefill"][module].input, ours["prefill"][module].output) == (pre_in, pre_out), module
        assert (ours["decode"][module].input, ours["decode"][module].output) == (dec_in, dec_out), module
    for step in (prefill, decode):  # the seed's modules in the order its forward hooks finished
        names = [stop.name for stop in step.stops]
        assert [n for n in names if n in SEED_TABLE] == list(SEED_TABLE)
    # layer 0's K cache: (1, 8, 17, 128) after the prefill, (1, 8, 18, 128) after the decode step
    assert ours["prefill"]["kv_write"].output == [1, 8, 17, 128]
    assert ours["decode"]["kv_write"].input == [1, 8, 17, 128]
    assert ours["decode"]["kv_write"].output == [1, 8, 18, 128]
    assert ours["prefill"]["kv_write"].shapes == {"written": [1, 8, 17, 128]}
    assert ours["prefill"]["attention"].shapes["scores"] == [1, 16, 17, 17]
    assert ours["decode"]["attention"].shapes["scores"] == [1, 16, 1, 18]
    # the rest of the seed's stop-by-stop table
    assert ours["prefill"]["rope"].input == ours["prefill"]["rope"].output == [1, 17, 16 + 8, 128]
    assert ours["prefill"]["q_norm"].output == [1, 17, 16, 128] and ours["prefill"]["k_norm"].output == [1, 17, 8, 128]
    assert ours["prefill"]["o_proj"].output == [1, 17, 1024]
    assert ours["prefill"]["act_fn"].output == [1, 17, 3072]
    assert ours["prefill"]["sampling"].input == [1, 151936] and ours["prefill"]["sampling"].output == [1]
    # merged projections: run as one, reported as the checkpoint's modules with no time of their own
    assert ours["prefill"]["qkv_proj"].output == [1, 17, 2048 + 1024 + 1024]
    assert ours["prefill"]["gate_up_proj"].output == [1, 17, 2 * 3072]
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        assert ours["prefill"][name].ms is None and "merged" in ours["prefill"][name].note
    for step in (prefill, decode):
        for stop in step.stops:
            if stop.ms is not None:
                assert stop.ms >= 0, stop
            if stop.all_layers_ms is not None:  # 28 layers: the sum holds layer 0's own time
                assert stop.ms is not None and stop.all_layers_ms >= stop.ms, stop
        assert step.step_ms >= step.runner_ms >= step.forward_ms > 0
        assert by_name(step)["decoder_layer"].all_layers_ms <= step.forward_ms


def test_a_traced_request_in_a_batch(qwen3_engine):
    parts = run(qwen3_engine, {"traced": (PROMPT, greedy(2, trace=True)),
                               "other": ([7, 8, 9, 10, 11], greedy(3, trace=False))})
    assert parts["other"] == []
    prefill, decode = prefill_and_decode(parts["traced"])
    assert (prefill.batch_tokens, prefill.batch_requests) == (17 + 5, 2)
    assert (decode.batch_tokens, decode.batch_requests) == (2, 2)
    assert by_name(prefill)["q_proj"].output == [1, 17, 2048]  # its own rows, not the batch's
    assert by_name(decode)["attention"].shapes["scores"] == [1, 16, 1, 18]
    assert decode.attention_kernel.startswith("one-query batch")
    tracer = qwen3_engine.runner.tracer
    assert not tracer.tracking and not qwen3_engine.traces.active
    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks


def test_a_chunked_prompt_is_recorded_at_its_last_chunk(tiny_qwen3_dir):
    engine = LLMEngine(EngineConfig(model=tiny_qwen3_dir, dtype="float32", device="cpu", kv_cache_memory=8 << 20,
                                    max_model_len=64, block_size=4, max_num_batched_tokens=8))
    prompt = list(range(3, 23))  # 20 tokens: chunks of 8, 8 and 4
    prefill, decode = prefill_and_decode(run(engine, {"chunked": (prompt, greedy(2, trace=True))})["chunked"])
    assert (prefill.tokens, prefill.cached_tokens, prefill.context_tokens) == (4, 16, 20)
    assert [(c.tokens, c.context_tokens, c.batch_tokens) for c in prefill.earlier_chunks] == [(8, 8, 8), (8, 16, 8)]
    assert prefill.attention_kernel == "sdpa with a mask (after 16 cached tokens)"
    stops = by_name(prefill)
    assert stops["attention"].shapes["scores"] == [1, 4, 4, 20]  # tiny Qwen3: 4 heads
    assert stops["kv_write"].input == [1, 2, 16, 32] and stops["kv_write"].output == [1, 2, 20, 32]
    assert "logits_refine" not in stops  # float32: no refinement
    assert by_name(decode)["embed_tokens"].output == [1, 1, 64]
