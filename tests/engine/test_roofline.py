"""The roofline: the CLI's table against the handbook's LLaMA-3-8B/H100 figures, the cost of a
mixed prefill/decode step against a hand computation, the engine's per-step account, and the
measured host limits with their cache."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.core.outputs import CachedRequestData, NewRequestData, RunnerOutput, SchedulerOutput
from engine.models.config import ModelArch
from engine.roofline import measure
from engine.roofline.cost_model import OPERATORS, OperatorCost, RooflineModel, StepShape
from engine.roofline.machine import PRESETS, MachineLimits
from engine.roofline.step_account import StepRoofline, step_shape

REPO = Path(__file__).resolve().parents[2]

# The handbook's tables: operator, GFLOP, GB, FLOP/byte, lower bound ms (H100: 989 TFLOP/s, 3.35 TB/s).
BATCH_1 = """\
qkv_proj            1.6    1.61     1.0        0.48
o_proj              1.1    1.07     1.0        0.32
gate_up_proj        7.5    7.52     1.0        2.24
down_proj           3.8    3.76     1.0        1.12
lm_head             1.1    1.05     1.0        0.31
attention           2.1    0.54     4.0        0.16
total                                            4.64"""
BATCH_64 = """\
qkv_proj          103.1    1.65    62.4        0.49
o_proj             68.7    1.11    62.1        0.33
gate_up_proj      481.0    7.65    62.9        2.28
down_proj         240.5    3.83    62.7        1.14
lm_head            67.2    1.07    63.0        0.32
attention         137.4   34.36     4.0       10.26
total                                           14.83"""

# hidden 8, 2 heads of 4 (q width 8), 1 KV head (kv width 4), MLP 16, 2 layers, vocab 32
TINY = ModelArch.from_hf_config({"model_type": "llama", "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
                                 "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1})


@pytest.mark.parametrize("batch, expected", [(1, BATCH_1), (64, BATCH_64)])
def test_cli_prints_the_handbook_table(batch, expected):
    run = subprocess.run([sys.executable, "-m", "engine.roofline", "llama3-8b", "--batch", str(batch), "--context",
                          "4096", "--machine", "h100"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    rows = expected.splitlines()
    start = lines.index(rows[0])
    assert lines[start:start + len(rows)] == rows, run.stdout


def test_mixed_step_against_a_hand_computation():
    # a prefill chunk of 3 ending at 5 tokens (rows at positions 2, 3, 4 see 3 + 4 + 5 keys), a decode at 7
    shape = StepShape.of_sequences([(3, 5), (1, 7)])
    assert shape == StepShape(num_tokens=4, num_sampled=2, attention_pairs=12 + 7, context_tokens=12)
    costs = RooflineModel(TINY, weight_bytes=2, kv_bytes=2, activation_bytes=2).costs(shape)
    assert list(costs) == list(OPERATORS)
    assert costs == {
        # [4, 8] @ [8, 16] x 2 layers: 2*4*8*16*2; weights 8*16*2 B + rows 4*(8+16)*2 B, per layer
        "qkv_proj": OperatorCost(2048, (256 + 192) * 2),
        "o_proj": OperatorCost(2 * 4 * 8 * 8 * 2, (128 + 128) * 2),
        "gate_up_proj": OperatorCost(2 * 4 * 8 * 32 * 2, (512 + 320) * 2),
        "down_proj": OperatorCost(2 * 4 * 16 * 8 * 2, (256 + 192) * 2),
        "lm_head": OperatorCost(2 * 2 * 8 * 32, 512 + 2 * 40 * 2),  # the 2 sampled rows only, once
        # 4 FLOPs x q width 8 x 2 layers per pair; K and V of 12 tokens, kv width 4, 2 B, 2 layers
        "attention": OperatorCost(4 * 8 * 2 * 19, 2 * 4 * 2 * 2 * 12),
    }
    chunk = RooflineModel(TINY).costs(StepShape.of_sequences([(3, 5)], num_sampled=0))  # a partial prefill
    assert chunk["lm_head"] == OperatorCost(0, 0)
    with pytest.raises(ValueError):
        StepShape.of_sequences([(6, 5)])


def test_decode_is_the_mixed_api_with_single_rows():
    assert StepShape.decode(64, 4096) == StepShape.of_sequences([(1, 4096)] * 64)


def test_step_shape_and_utilization_of_a_scheduled_step():
    params = SamplingParams()
    so = SchedulerOutput(
        new_requests=[NewRequestData("a", list(range(9)), 9, params, [0], num_computed_tokens=2)],
        cached_requests=[CachedRequestData("b", [], 6), CachedRequestData("c", [], 10)],
        num_scheduled_tokens={"a": 3, "b": 1, "c": 3}, spec_token_ids={"c": [4, 5]})
    ro = RunnerOutput(["b", "c"], [[1], [2, 3]])  # "a" is a partial chunk: it samples nothing
    shape = step_shape(so, ro)
    assert shape == StepShape.of_sequences([(3, 5), (1, 7), (3, 13)], num_sampled=1 + 3)
    limits = MachineLimits(peak_flops=1e6, bandwidth_bytes_per_s=1e5, name="slow")
    model = RooflineModel(TINY)
    account = StepRoofline(model, limits)
    account.observe(so, ro, seconds=0.5)
    stats = account.take_stats()
    costs = model.costs(shape)
    assert stats is not None and stats.wall_s == 0.5
    assert stats.bandwidth_utilization == [pytest.approx(sum(c.bytes for c in costs.values()) / 1e5 / 0.5)]
    assert stats.compute_utilization == [pytest.approx(sum(c.flops for c in costs.values()) / 1e6 / 0.5)]
    assert stats.operator_lower_bound_s == pytest.approx({n: limits.lower_bound_s(c) for n, c in costs.items()})
    assert account.take_stats() is None


def test_measured_limits_are_positive_and_cached(tmp_path, monkeypatch):
    """Measured once, at the CPU sizes that keep a start-up short (a 256 MiB read, a 1024^3
    matmul, 3 repeats: `python -m engine.roofline` on an empty cache logs how long it took), then
    read from the cache without measuring."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls: list[tuple] = []

    def spy(name, real):
        def run(*args):
            calls.append((name, *args))
            return real(*args)
        return run

    monkeypatch.setattr(measure, "memory_bandwidth", spy("read", measure.memory_bandwidth))
    monkeypatch.setattr(measure, "gemm_flops", spy("gemm", measure.gemm_flops))
    device, dtype = torch.device("cpu"), torch.float32
    first = measure.measured_limits(device, dtype)
    assert calls == [("read", device, 256 << 20, 3), ("gemm", dtype, device, 1024, 1024, 1024, 3)]
    assert first.peak_flops > 0 and first.bandwidth_bytes_per_s > 0
    path = tmp_path / "llm-serve" / "machine_limits.json"
    assert measure.cache_key(device, dtype) in json.loads(path.read_text())

    def no_measuring(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(measure, "measure", no_measuring)
    assert measure.measured_limits(device, dtype) == first
    assert len(calls) == 2


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(measure, "measure", lambda device, dtype: PRESETS["h100"])
    blocked = tmp_path / "file" / "machine_limits.json"  # under a file: no folder can be made
    assert measure.measured_limits(torch.device("cpu"), torch.float32, blocked) == PRESETS["h100"]


def test_the_engine_accounts_every_step(tiny_llama_dir, tmp_path, monkeypatch):
    from engine.llm_engine import LLMEngine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine = LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device="cpu", max_model_len=64,
                                    kv_cache_memory=1 << 20))
    engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    stats = engine.take_roofline_stats()
    assert stats is not None and len(stats.bandwidth_utilization) == len(stats.compute_utilization) == steps
    assert all(u > 0 for u in stats.bandwidth_utilization + stats.compute_utilization)
    assert set(stats.operator_lower_bound_s) == set(OPERATORS) and stats.wall_s > 0
