"""The `llm-serve` console command, with subcommands like vLLM's:

    llm-serve serve [MODEL] [flags]   the OpenAI-compatible server (= python -m server)
    llm-serve bench serve [flags]     the load generator (= python -m loadtest)
    llm-serve bench soak [flags]      mixed traffic for hours, resources sampled (= python -m loadtest soak)
    llm-serve bench servers [flags]   our server vs transformers serve (= python -m loadtest.bench_servers)
    llm-serve bench engine [flags]    our engine vs transformers (= python -m benchmarks)
    llm-serve roofline [MODEL] [flags] a decode step's roofline table (= python -m engine.roofline)

Each subcommand's module is imported only when it runs: the engine benchmark imports torch, which
the server process must never load (and each spawned child re-runs this command's script). The
flags after the subcommand go to that command's own parser unchanged.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

PROG = "llm-serve"


def _serve(argv: list[str], prog: str) -> int | None:
    from server.cli import main

    return main(argv, prog=prog)


def _bench_serve(argv: list[str], prog: str) -> int | None:
    from loadtest.cli import main

    return main(argv, prog=prog)


def _bench_soak(argv: list[str], prog: str) -> int | None:
    from loadtest.soak import main

    return main(argv, prog=prog)


def _bench_servers(argv: list[str], prog: str) -> int | None:
    from loadtest.bench_servers import main

    return main(argv, prog=prog)


def _bench_engine(argv: list[str], prog: str) -> int | None:
    try:
        from benchmarks.__main__ import main
    except ModuleNotFoundError as exc:
        if exc.name != "benchmarks":
            raise
        # the Docker image installs the serving packages only
        print(f"{prog}: the benchmarks are not installed here; run `python -m benchmarks` from a checkout",
              file=sys.stderr)
        return 2
    sys.argv[0] = prog  # the benchmark's parser names itself after sys.argv[0]
    return main(argv)


def _roofline(argv: list[str], prog: str) -> int | None:
    from engine.roofline.__main__ import main

    return main(argv, prog=prog)


# subcommand words -> (what it does, how to run it)
COMMANDS: dict[tuple[str, ...], tuple[str, Callable[[list[str], str], int | None]]] = {
    ("serve",): ("run the OpenAI-compatible server (python -m server)", _serve),
    ("bench", "serve"): ("put load on an OpenAI-compatible server (python -m loadtest)", _bench_serve),
    ("bench", "soak"): ("hours of mixed traffic, the server's RSS, FDs and KV usage sampled "
                        "(python -m loadtest soak)", _bench_soak),
    ("bench", "servers"): ("our server vs transformers serve, one interleaved sweep "
                           "(python -m loadtest.bench_servers)", _bench_servers),
    ("bench", "engine"): ("our engine vs transformers on the same model (python -m benchmarks)", _bench_engine),
    ("roofline",): ("a decode step's FLOPs, bytes and time bound per operator (python -m engine.roofline)",
                    _roofline),
}


def usage() -> str:
    lines = [f"usage: {PROG} COMMAND [flags]   ({PROG} COMMAND --help for its flags)", "", "commands:"]
    for words, (text, _) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<16}{text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for words, (_, run) in COMMANDS.items():
        if tuple(argv[:len(words)]) == words:
            code = run(argv[len(words):], f"{PROG} {' '.join(words)}")
            return 0 if code is None else code
    if argv and argv[0] not in ("-h", "--help"):
        print(f"{PROG}: unknown command {' '.join(argv[:2])!r}\n\n{usage()}", file=sys.stderr)
        return 2
    print(usage())
    return 0 if argv else 2


if __name__ == "__main__":
    sys.exit(main())
