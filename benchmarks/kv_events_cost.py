"""`python -m benchmarks.kv_events_cost`: what publishing KV cache events costs the engine's step loop.

One engine (the default model), started with `--kv-events-config` on an ipc:// endpoint that a
subscriber in another process reads, runs rounds of the same workload with the events recorded and
published, and with them off (the block manager's `kv_events` set to None: nothing recorded, nothing
queued), alternately, so both see the same machine. Each round is `--requests` fresh prompts of
`--prompt-tokens` random token ids (every full block a BlockStored; older rounds' blocks evicted, a
BlockRemoved each) and `--output-tokens` greedy tokens each, all at once. It prints each round's
tokens/s (prompt + output) and events, then the medians and bests and their difference, the time
publish() takes in the step loop per batch, and (without the model) the block manager's time per
full block to hash and register it with the events off and on.
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time

from common.engine_config import EngineConfig
from common.kv_events_config import KVEventsConfig
from common.messages import SamplingParams

SUBSCRIBER = """
import sys, zmq
sub = zmq.Context().socket(zmq.SUB); sub.connect(sys.argv[1]); sub.setsockopt(zmq.SUBSCRIBE, b"")
n = 0
while True:
    sub.recv_multipart(); n += 1
    print(n, flush=True)
"""


def recording_cost_us(blocks: int = 256, block_size: int = 16, repeats: int = 20) -> tuple[float, float]:
    """Microseconds per block to hash and register a prompt's full blocks, events off and on (the
    block manager's part of the step loop; the best of `repeats`)."""
    from engine.core.block_manager import BlockManager
    from engine.core.request import Request

    best = {False: float("inf"), True: float("inf")}
    for r in range(repeats):
        for on in (False, True):
            bm = BlockManager(blocks + 1, block_size, enable_prefix_caching=True)
            bm.kv_events = [] if on else None
            req = Request("r", [(r * 7919 + i) % 49000 for i in range(blocks * block_size)], SamplingParams(), 1)
            bm.allocate(req, blocks * block_size)
            req.num_computed_tokens = blocks * block_size
            start = time.perf_counter()
            for done in range(1, blocks + 1):  # one block per call, as decode steps fill them
                req.num_computed_tokens = done * block_size
                bm.cache_full_blocks(req)
            best[on] = min(best[on], (time.perf_counter() - start) / blocks * 1e6)
    return best[False], best[True]


def run_round(engine, rng: random.Random, vocab: int, args, tag: str) -> tuple[float, int]:
    """Tokens/s of one round, and the events it recorded."""
    params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
    events = 0
    for i in range(args.requests):
        engine.add_request(f"{tag}-{i}", [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)], params)
    start = time.perf_counter()
    while engine.has_unfinished():
        pending = engine.block_manager.kv_events
        engine.step()
        if pending is not None:
            events += len(pending)  # the list the step filled; step() handed it to the publisher
    seconds = time.perf_counter() - start
    return args.requests * (args.prompt_tokens + args.output_tokens) / seconds, events


class TimedPublisher:
    """The engine's publisher, with the time its publish() takes in the step loop added up."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def publish(self, events) -> None:
        start = time.perf_counter()
        self.inner.publish(events)
        self.seconds += time.perf_counter() - start
        self.calls += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8, help="rounds with events on, and as many off")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-memory", type=int, default=256 << 20)
    args = parser.parse_args()

    from engine.llm_engine import LLMEngine  # torch is imported here

    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"ipc://{tmp}/kv-events"
        engine = LLMEngine(EngineConfig(kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.requests,
                                        kv_events_config=KVEventsConfig(enable_kv_cache_events=True,
                                                                        endpoint=endpoint)))
        subscriber = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, endpoint], stdout=subprocess.PIPE,
                                      text=True)
        timed = engine.kv_event_publisher = TimedPublisher(engine.kv_event_publisher)
        time.sleep(1.0)  # subscribed before the first batch
        rng = random.Random(0)
        run_round(engine, rng, engine.vocab_size, args, "warm-up")
        results: dict[str, list[float]] = {"on": [], "off": []}
        total_events = 0
        for r in range(2 * args.rounds):
            mode = "on" if r % 2 == 0 else "off"
            engine.block_manager.kv_events = [] if mode == "on" else None
            tps, events = run_round(engine, rng, engine.vocab_size, args, f"{r}")
            results[mode].append(tps)
            total_events += events
            print(f"round {r:2d} events {mode:3s}: {tps:8.1f} tokens/s, {events} events")
        time.sleep(1.0)
        subscriber.terminate()
        lines = subscriber.communicate(timeout=60)[0].split()
        batches = lines[-1] if lines else "0"
        for name, pick in (("median", statistics.median), ("best", max)):
            on, off = pick(results["on"]), pick(results["off"])
            print(f"{name} tokens/s: events on {on:.1f}, off {off:.1f} ({(on - off) / off * 100:+.1f} %)")
        print(f"{total_events} events in {timed.calls} batches ({batches} received by the subscriber); "
              f"publish() took {timed.seconds / max(timed.calls, 1) * 1e6:.1f} us per batch in the step loop")
        off_us, on_us = recording_cost_us()
        print(f"hashing and registering a full block: {off_us:.2f} us with events off, {on_us:.2f} us on")


if __name__ == "__main__":
    main()
