"""Our engine before and after a change, in the same run: two checkouts, alternating rounds.

    git archive <old-commit> | tar -x -C /tmp/before
    python -m benchmarks.commits --baseline /tmp/before [--rounds 2] [--dtype bfloat16]
    python -m benchmarks.commits --after-engine kv_cache_dtype=int8   (one checkout, two configurations)
    python -m benchmarks.commits --dtype auto --before-env LLM_CPU_KERNEL_TIER=avx2   (a kernel tier)

Each round runs `benchmarks/workloads.py` (this checkout's copy, so both sides run the same
workloads and timing code) once against the baseline checkout and once against this one, each in
a fresh process (with `--before-env` / `--after-env` variables of its own); figures are the best of
the rounds, and the ratio columns are after / before:
of tok/s (first request in to last token out, prefills included) and of decode tok/s (the phase
where every sequence decodes: what a change to the decode step alone moves). Without
`--baseline` both sides are this checkout; `--before-engine` / `--after-engine KEY=VALUE` give
either side EngineConfig fields of its own, so an engine flag is measured the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
COLUMNS = [("output_tps", "tok/s", "{:.1f}"), ("decode_tps", "decode tok/s", "{:.1f}"),
           ("host_ms", "host ms/step", "{:.2f}"), ("forward_ms", "forward ms/step", "{:.1f}"),
           ("sample_ms", "sample ms/step", "{:.2f}")]


def run_once(tree: Path, args: argparse.Namespace, out: Path, engine_fields: list[str], env_vars: list[str]) -> dict:
    cmd = [sys.executable, str(HERE.with_name("workloads.py")), "--json", str(out), "--dtype", args.dtype,
           "--batch", str(args.batch), "--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len)]
    for field in engine_fields:
        cmd += ["--engine", field]
    env = dict(os.environ, PYTHONPATH=str(tree), **dict(v.split("=", 1) for v in env_vars))
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=REPO, help="a checkout of the older commit (default: this one)")
    ap.add_argument("--before-engine", action="append", default=[], metavar="KEY=VALUE",
                    help="an EngineConfig field for the baseline's runs; repeatable")
    ap.add_argument("--after-engine", action="append", default=[], metavar="KEY=VALUE",
                    help="an EngineConfig field for this checkout's runs; repeatable")
    ap.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable for the baseline's runs; repeatable")
    ap.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable for this checkout's runs; repeatable")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16, float32 or auto (the platform's choice)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args(argv)
    trees = {"before": (args.baseline.resolve(), args.before_engine, args.before_env),
             "after": (REPO, args.after_engine, args.after_env)}
    best: dict[str, dict[str, dict]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, (tree, fields, env_vars) in trees.items():
                print(f"round {r + 1}/{args.rounds}: {name} ({tree} {' '.join(fields + env_vars)})", flush=True)
                for workload, figures in run_once(tree, args, Path(tmp) / f"{name}.json", fields, env_vars).items():
                    kept = best[name].get(workload)
                    if kept is None or figures["output_tps"] > kept["output_tps"]:
                        best[name][workload] = figures
    print(f"\n{args.dtype}; {args.prompt_len}-token random prompts, {args.output_len} new tokens, EOS ignored; "
          f"sampled = temperature 0.8, top_p 0.95, presence_penalty 0.5; best of {args.rounds} rounds")
    labels = "".join(f"{label:>17}" for _, label, _ in COLUMNS)
    print(f"{'workload':<20}{'checkout':<10}{labels}{'tok/s ratio':>13}{'decode ratio':>14}")
    for workload in best["after"]:
        for side in ("before", "after"):
            figures = best[side][workload]
            cells = "".join(f"{fmt.format(figures[key]):>17}" for key, _, fmt in COLUMNS)
            ratio = figures["output_tps"] / best["before"][workload]["output_tps"]
            decode_ratio = figures["decode_tps"] / best["before"][workload]["decode_tps"]
            print(f"{workload if side == 'before' else '':<20}{side:<10}{cells}{ratio:>12.2f}x{decode_ratio:>13.2f}x")

if __name__ == "__main__":
    main()
