"""The CUDA benchmark's workloads (benchmarks/cuda.py) on a tiny model and short lengths, so the
GPU check's script is known to run before a CUDA machine is at hand: every requested token comes
back, the figures are positive, the profile tables are written; with async scheduling too (the
default on CUDA, opt-in on a CPU)."""
from __future__ import annotations

import pytest
from device_under_test import TEST_DEVICE

from common.engine_config import EngineConfig
from benchmarks.cuda import batch1_tpot, offline_throughput, profile_decode
from engine.llm_engine import LLMEngine


@pytest.mark.parametrize("async_scheduling", ["auto", "on"])
def test_offline_tpot_and_profile_workloads(tiny_llama_dir, tmp_path, async_scheduling):
    engine = LLMEngine(EngineConfig(model=tiny_llama_dir, dtype="float32", device=TEST_DEVICE,
                                    kv_cache_memory=8 << 20, max_model_len=256, block_size=4, max_num_seqs=8,
                                    async_scheduling=async_scheduling))
    offline = offline_throughput(engine, num_seqs=5, min_len=5, max_len=40)
    assert offline["output_tokens"] >= 5 * 5 and offline["tok_per_s"] > 0
    assert batch1_tpot(engine, prompt_len=8, output_len=12) > 0
    profile_decode(engine, num_seqs=3, steps=4, path=tmp_path / "profile.txt")
    tables = (tmp_path / "profile.txt").read_text()
    assert "4 decode steps of 3 sequences: by host time" in tables and "aten::" in tables
    assert not engine.has_unfinished()
