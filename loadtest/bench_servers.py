"""`make bench`: our server vs its peers on the same model, one interleaved run.

    python -m loadtest.bench_servers [--peers transformers,llama-server] [--concurrency 1,8,32]
        [--num-prompts 32] [--sampling greedy,sampled] [--llama-server PATH] [--baseline DIR]
        [--output-dir DIR]

Starts every server on a free loopback port (CPU), runs one interleaved comparison sweep per
sampling mode with `python -m loadtest` (A, B, C, A, B, C rounds within each concurrency level),
then stops them. Results (table, JSON, PNG plots, server logs) land in the output directory, one
subfolder per sampling mode. Peers:

  transformers   `transformers serve --continuous-batching` on the converted folder, same dtype
  llama-server   llama.cpp's server on the package's own GGUF (Q4_1 / Q8_0, the weights we run),
                 one slot per request of the largest concurrency, all CPU threads; the binary
                 from --llama-server, $LLAMA_SERVER, or the default path of
                 deploy/build-llama-server.sh (which builds it in about 12 minutes; `make bench`
                 runs it first). Left out, with a line saying so, when no binary is found.
  ours-int8      our server again with --batch-linear int8 (int8 activations at every row count)
  ours-kv-int8   our server again with --kv-cache-dtype int8 (the KV cache as int8 rows)

--baseline DIR adds "baseline": the server of an older commit, from a checkout of it
(`git archive <commit> | tar -x -C DIR`), run with this environment's Python; how a change to
the server is measured against the commit before it (the CPU targets' "x the commit before").

Sampling modes: greedy (temperature 0) and sampled (temperature 0.8, top_p 0.95), each with
prompts of its own (no prompt of one mode warms a prefix cache for the other).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

from loadtest.cli import main as loadtest_main
from loadtest.servers import ManagedServer, free_port

START_TIMEOUT_S = 600
DEFAULT_LLAMA_SERVER = Path("/tmp/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server")
SAMPLING = {"greedy": ["--temperature", "0"], "sampled": ["--temperature", "0.8", "--top-p", "0.95"]}
LLAMA_CONTEXT_PER_SLOT = 512  # tokens: a 128-token prompt in its chat template plus 128 new ones fit


def llama_server_binary(given: str | None) -> Path | None:
    for candidate in (given, os.environ.get("LLAMA_SERVER"), DEFAULT_LLAMA_SERVER):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _ours(name: str, port: int, args, out: Path, *extra: str) -> ManagedServer:
    return ManagedServer(name, [sys.executable, "-m", "server", "--port", str(port), "--dtype", args.dtype,
                                "--device", "cpu", "--max-model-len", "4096", "--max-num-seqs", "64",
                                "--served-model-name", "smollm2", *extra], port, out)


def _baseline(tree: Path, args, out: Path) -> ManagedServer:
    """An older commit's server from its checkout: its own packages first on the path (this
    environment's editable install would otherwise give its processes today's code), and only the
    flags every commit takes."""
    tree = tree.resolve()
    port = free_port()
    return ManagedServer("baseline", [sys.executable, "-m", "server", "--port", str(port), "--dtype", args.dtype,
                                      "--max-num-seqs", "64"], port, out, env={"PYTHONPATH": str(tree)}, cwd=tree)


def _peer(name: str, args, model_dir: Path, out: Path) -> ManagedServer | None:
    port = free_port()
    if name == "ours-int8":  # our server again, with --batch-linear int8 (int8 activations at every row)
        return _ours(name, port, args, out, "--batch-linear", "int8")
    if name == "ours-kv-int8":  # our server again, with its KV cache as int8 rows
        return _ours(name, port, args, out, "--kv-cache-dtype", "int8")
    if name == "transformers":
        transformers_cli = str(Path(sys.executable).parent / "transformers")  # the console script beside python
        return ManagedServer("transformers", [transformers_cli, "serve", str(model_dir), "--continuous-batching",
                                              "--port", str(port), "--dtype", args.dtype, "--device", "cpu"],
                             port, out, env={"HF_HUB_OFFLINE": "1"})
    if name == "llama-server":
        binary = llama_server_binary(args.llama_server)
        if binary is None:
            print("llama-server left out: no binary (build it with deploy/build-llama-server.sh, or give "
                  "--llama-server PATH / $LLAMA_SERVER)")
            return None
        from common.default_model import find_gguf

        slots = max(int(c) for c in args.concurrency.split(","))
        return ManagedServer("llama-server", [str(binary), "-m", str(find_gguf()), "--host", "127.0.0.1",
                                              "--port", str(port), "-c", str(slots * LLAMA_CONTEXT_PER_SLOT),
                                              "-np", str(slots), "-t", str(os.cpu_count() or 1), "--jinja"],
                             port, out)
    raise ValueError(f"unknown peer {name!r}: transformers, llama-server, ours-int8 or ours-kv-int8")


def main(argv: list[str] | None = None, prog: str = "python -m loadtest.bench_servers") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="transformers,llama-server")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-prompts", type=int, default=32, help="measured requests per level and server")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", help="ours and transformers (ours runs the GGUF codes where "
                                                        "they are faster, as by default)")
    ap.add_argument("--sampling", default="greedy,sampled", help=f"modes to sweep, of {sorted(SAMPLING)}")
    ap.add_argument("--llama-server", default=None, help="path of the llama-server binary")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of an older commit, served as the peer 'baseline'")
    ap.add_argument("--output-dir", default=None)
    args = ap.parse_args(argv)
    modes = args.sampling.split(",")
    unknown = [m for m in modes if m not in SAMPLING]
    if unknown:
        ap.error(f"unknown sampling mode {unknown[0]!r}: use {', '.join(SAMPLING)}")
    if args.baseline is not None and not (args.baseline / "server" / "__main__.py").is_file():
        raise SystemExit(f"--baseline {args.baseline}: no server/__main__.py there "
                         "(make one with: git archive <commit> | tar -x -C DIR)")

    from common.default_model import ensure_default_model

    model_dir = ensure_default_model()
    out = Path(args.output_dir or f"results/bench-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    ours_port = free_port()
    servers = [_ours("ours", ours_port, args, out)]
    try:
        # Ours is up before a peer starts: our start-up times the batch methods of each layer
        # shape, which a peer loading its model beside it would disturb.
        servers[0].wait_ready(START_TIMEOUT_S)
        servers += [s for s in (_peer(p, args, model_dir, out) for p in args.peers.split(",") if p) if s is not None]
        if args.baseline is not None:
            servers.append(_baseline(args.baseline, args, out))
        for server in servers[1:]:
            server.wait_ready(START_TIMEOUT_S)
        code = 0
        for seed, mode in enumerate(modes):
            # Each target is sent its own model id (from its /models). The tokenizer folder sizes
            # the random prompts in real tokens of this model. No --ignore-eos: transformers serve
            # answers 422 to that field, so outputs may end early; their lengths come from usage.
            # Each mode its own prompts (--seed): with the greedy mode's again, every server's
            # prefix cache would meet them warm, which hides most of a slow prefill (median TTFT
            # at one stream, greedy then sampled on the same prompts: llama-server 402.5 -> 27.5
            # ms, ours 63.9 -> 30.4).
            print(f"\n=== {mode}: {' '.join(SAMPLING[mode])}")
            targets = [a for s in servers for a in ("--target", f"{s.name}={s.base_url}")]
            code = code or loadtest_main([
                *targets, "--concurrency", args.concurrency, "--num-prompts", str(args.num_prompts),
                "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                "--tokenizer", str(model_dir), "--rounds", str(args.rounds), *SAMPLING[mode],
                "--warmup", "2", "--seed", str(seed), "--output-dir", str(out / mode),
            ])
        return code
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
