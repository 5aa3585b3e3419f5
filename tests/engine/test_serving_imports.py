"""The serving path never imports the benchmarks: the server, the tokenizer worker and an engine
that loads a model and runs a step leave no `benchmarks` module behind, and the engine's package
holds no benchmark or development tool any more (they live in the top-level `benchmarks/`)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

CODE = """
import sys
import server.app, server.cli, tokenizer_worker.worker, engine.engine_process
from common.engine_config import EngineConfig
from common.messages import SamplingParams
from engine.llm_engine import LLMEngine

engine = LLMEngine(EngineConfig(model=sys.argv[1], dtype="float32", device="cpu", max_model_len=64,
                                kv_cache_memory=1 << 20))
engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
while engine.has_unfinished():
    engine.step()
loaded = sorted(m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks."))
assert not loaded, loaded
"""


def test_serving_path_imports_no_benchmark(tiny_llama_dir):
    subprocess.run([sys.executable, "-c", CODE, tiny_llama_dir], check=True)


def test_development_tools_left_the_runtime_packages():
    # Files, not import specs: an editable install of another checkout would still answer for the old names.
    root = Path(__file__).resolve().parents[2]
    for gone in ("engine/bench", "engine/attention/triton_compile_check.py", "tokenizer_worker/stream_check_cost.py"):
        assert not (root / gone).exists(), gone
    for name in ("benchmarks.commits", "benchmarks.triton_compile_check", "benchmarks.stream_check_cost"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None and Path(spec.origin).is_relative_to(root), name
