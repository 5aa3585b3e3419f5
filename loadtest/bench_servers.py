"""`make bench`: our server vs `transformers serve --continuous-batching`, same model, one run.

    python -m loadtest.bench_servers [--concurrency 1,8,32] [--num-prompts 32] [--output-dir DIR]

Starts both servers on free loopback ports (same dtype, CPU), runs one interleaved comparison
sweep with `python -m loadtest` (A, B, A, B rounds within each concurrency level), then stops
both. Results (table, JSON, PNG plots, server logs) land in the output directory.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from loadtest.cli import main as loadtest_main
from loadtest.servers import ManagedServer, free_port

START_TIMEOUT_S = 600


def main(argv: list[str] | None = None, prog: str = "python -m loadtest.bench_servers") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-prompts", type=int, default=32, help="measured requests per level and server")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--output-dir", default=None)
    args = ap.parse_args(argv)

    from common.default_model import ensure_default_model

    model_dir = ensure_default_model()
    out = Path(args.output_dir or f"results/bench-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    ours_port, hf_port = free_port(), free_port()
    ours = ManagedServer("ours", [sys.executable, "-m", "server", str(model_dir), "--port", str(ours_port),
                                  "--dtype", args.dtype, "--device", "cpu", "--max-model-len", "4096",
                                  "--max-num-seqs", "64", "--served-model-name", "smollm2"], ours_port, out)
    transformers_cli = str(Path(sys.executable).parent / "transformers")  # the console script beside python
    hf = ManagedServer("transformers", [transformers_cli, "serve", str(model_dir), "--continuous-batching",
                                        "--port", str(hf_port), "--dtype", args.dtype, "--device", "cpu"],
                       hf_port, out, env={"HF_HUB_OFFLINE": "1"})
    try:
        for server in (ours, hf):
            server.wait_ready(START_TIMEOUT_S)
        # Each target is sent its own model id (from its /models). The tokenizer folder sizes
        # the random prompts in real tokens of this model. No --ignore-eos: transformers serve
        # answers 422 to that field, so outputs may end early; their lengths come from usage.
        return loadtest_main([
            "--target", f"ours={ours.base_url}", "--target", f"transformers={hf.base_url}",
            "--concurrency", args.concurrency, "--num-prompts", str(args.num_prompts),
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--tokenizer", str(model_dir), "--rounds", str(args.rounds),
            "--warmup", "2", "--output-dir", str(out),
        ])
    finally:
        for server in (ours, hf):
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
