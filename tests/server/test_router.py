"""Two replicas of the real server behind the real vllm-router (PyPI, pinned in requirements-dev.txt), on
loopback: requests of every kind pass through it, its KV-aware policy fed by the replicas' KV cache
events keeps a shared prefix on the replica that cached it, and a replica that drains mid-run
loses no request (docs/scale-out.md)."""
from __future__ import annotations

import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import zmq

from engine.core.block_hash import external_hash, hash_block
from loadtest.servers import ManagedServer, free_port
from server_process import ServerProcess, parse_sse

ROUTER_BIN = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
pytestmark = [pytest.mark.slow,  # two real server processes and the router
              pytest.mark.skipif(not Path(ROUTER_BIN).exists(), reason="vllm-router is not installed "
                                 "(pip install -r requirements-dev.txt)")]
MODEL = "SmolLM2-135M-Instruct"
GROUPS, PER_GROUP = 8, 3  # shared-prefix groups, requests per group


class Replica(ServerProcess):
    def __init__(self):
        self.events_port = free_port()
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{self.events_port}"}
        super().__init__("--kv-events-config", json.dumps(config))

    @property
    def events(self) -> str:
        return f"{self.url}=tcp://127.0.0.1:{self.events_port}"

    def counter(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise LookupError(name)


class Router(ManagedServer):
    def __init__(self, replicas: list[Replica], policy: str, *extra: str):
        port = free_port()
        self.log_dir = Path(tempfile.mkdtemp(prefix="router-"))
        args = [ROUTER_BIN, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
                "--worker-urls", *[r.url for r in replicas], "--policy", policy, *extra]
        super().__init__("router", args, port, self.log_dir)
        try:
            self.wait_ready(120, probe="/health", poll_s=0.3)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace_s: float = 5.0) -> None:
        super().stop(grace_s)
        shutil.rmtree(self.log_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def replicas():
    started = [Replica(), Replica()]  # both load at once
    try:
        for r in started:
            r.wait_ready()
        yield started
    finally:
        for r in started:
            r.stop()


def test_requests_of_every_kind_pass_through_the_router(replicas):
    router = Router(replicas, "cache_aware")
    try:
        url = router.url
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 5,
                "temperature": 0}
        completion = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}
        for path, body, kind in (("/v1/chat/completions", chat, "chat.completion"),
                                 ("/v1/completions", completion, "text_completion")):
            r = httpx.post(f"{url}{path}", json=body, timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["object"] == kind and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=120) as s:
                assert s.status_code == 200
                events = parse_sse(s.read())
            assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
            assert all(e["object"] == kind + ".chunk" if kind == "chat.completion" else e["object"] == kind
                       for e in events)
    finally:
        router.stop()


def test_replicas_export_the_metrics_routers_and_autoscalers_read(replicas):
    text = httpx.get(f"{replicas[0].url}/metrics", timeout=10).text
    values = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
              if line.startswith("vllm:") and "{" in line}
    for name in ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
                 "vllm:num_requests_running", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
        assert name in values, name
    assert values["vllm:gpu_cache_usage_perc"] == values["vllm:kv_cache_usage_perc"]


def test_events_carry_the_hashes_a_router_computes_from_the_prompt(replicas):
    """A replica's BlockStored events for a prompt: its full blocks' tokens, and the sha256 chain
    that anyone computes from those tokens alone (engine/core/block_hash.py)."""
    replica = replicas[0]
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{replica.events_port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    time.sleep(0.5)  # subscribed before the request
    prompt = [random.Random(5).randrange(100, 40000) for _ in range(40)]  # 2 full blocks of 16, and 8
    r = httpx.post(f"{replica.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0},
                   timeout=120)
    assert r.status_code == 200, r.text
    stored = []
    while sub.poll(2000):
        topic, seq, payload = sub.recv_multipart()
        batch = msgspec.msgpack.decode(payload)
        assert isinstance(batch, list) and isinstance(batch[0], float) and batch[2] == 0  # [ts, events, rank]
        stored += [e for e in batch[1] if e["type"] == "BlockStored"]  # only this request runs now
    sub.close(linger=0)
    h1 = hash_block(None, prompt[:16])
    h2 = hash_block(h1, prompt[16:32])
    assert [h for e in stored for h in e["block_hashes"]] == [external_hash(h1), external_hash(h2)]
    assert stored[0]["parent_block_hash"] is None and [t for e in stored for t in e["token_ids"]] == prompt[:32]
    assert stored[0]["block_size"] == 16 and stored[0]["medium"] == "GPU"


def _words(rng: random.Random, n: int) -> str:
    vocab = ["river", "mountain", "copper", "lantern", "orchard", "violet", "harbor", "engine", "meadow", "signal",
             "pepper", "canyon", "marble", "thunder", "velvet", "glacier", "saddle", "compass", "ember", "falcon"]
    return " ".join(rng.choice(vocab) for _ in range(n))


def _hit_rate(replicas: list[Replica], router: Router, seed: int) -> float:
    """Groups of requests sharing a long prefix, one group after the other, through the router:
    the replicas' prefix-cache hits over queries (prompt tokens) in that run."""
    rng = random.Random(seed)
    before = [(r.counter("vllm:prefix_cache_hits_total"), r.counter("vllm:prefix_cache_queries_total"))
              for r in replicas]
    prompt_tokens = 0
    for g in range(GROUPS):
        prefix = f"Document {seed}-{g}: " + _words(rng, 120)  # ~130 tokens, its own per run
        for q in range(PER_GROUP):
            body = {"model": MODEL, "prompt": f"{prefix}\nQuestion {q}: {_words(rng, 6)}?", "max_tokens": 1,
                    "temperature": 0}
            r = httpx.post(f"{router.url}/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            prompt_tokens += r.json()["usage"]["prompt_tokens"]
            time.sleep(0.2)  # room for the replica's events to reach the router before the next request
    deadline = time.monotonic() + 30
    while True:  # the engines send their counters a moment later: until every prompt token is counted
        hits = queries = 0.0
        for r, (h0, q0) in zip(replicas, before, strict=True):
            hits += r.counter("vllm:prefix_cache_hits_total") - h0
            queries += r.counter("vllm:prefix_cache_queries_total") - q0
        if queries >= prompt_tokens or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert queries == prompt_tokens
    return hits / queries


def test_kv_aware_routing_on_our_events_beats_round_robin(replicas, record_property):
    router = Router(replicas, "round_robin")
    try:
        round_robin = _hit_rate(replicas, router, seed=1)
    finally:
        router.stop()
    rates = {"round_robin": round_robin}
    # The event sources given to the router, then found by it (GET /get_server_info, /kv_event_sources).
    for name, seed, extra in (
            ("kv_aware", 2, [*[a for r in replicas for a in ("--kv-event-source", r.events)],
                             "--kv-event-model", MODEL, "--kv-event-block-size", "16"]),
            ("kv_aware_discovered", 4, [])):
        router = Router(replicas, "kv_aware", *extra)
        try:
            time.sleep(1.0)  # the router's subscriptions are up before the first event
            rates[name] = _hit_rate(replicas, router, seed=seed)
        finally:
            log = router.log_text()
            router.stop()
        assert "decode batch" not in log, log[-3000:]  # every event batch decoded
        assert log.count("spawned subscriber") == 2, log[-3000:]
    record_property("prefix_cache_hit_rate", rates)
    print("prefix-cache hit rate: " + ", ".join(f"{k} {v:.3f}" for k, v in rates.items()))
    assert rates["kv_aware"] >= 1.5 * round_robin, rates
    assert rates["kv_aware_discovered"] >= 1.5 * round_robin, rates


def test_a_replica_that_drains_mid_run_loses_no_request(replicas):
    # a retry goes back to the worker the policy picks, the draining one until a health check has
    # marked it down: the retries' backoff (0.5, 1, 2, 2 s) spans several checks of 1 s
    router = Router(replicas, "cache_aware", "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                    "--retry-max-retries", "5", "--retry-initial-backoff-ms", "500", "--retry-max-backoff-ms", "2000",
                    "--retry-backoff-multiplier", "2")
    results: list[int] = []
    lock = threading.Lock()
    rng = random.Random(3)
    prompts = [f"Story {i}: " + _words(rng, 20) for i in range(24)]

    def client(mine: list[str]) -> None:
        with httpx.Client(timeout=120) as http:
            for prompt in mine:
                r = http.post(f"{router.url}/v1/completions",
                              json={"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0})
                with lock:
                    results.append(r.status_code)

    try:
        served_before = [r.counter("vllm:prompt_tokens_total") for r in replicas]
        threads = [threading.Thread(target=client, args=(prompts[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        while len(results) < 6:
            time.sleep(0.05)
        assert replicas[1].counter("vllm:prompt_tokens_total") > served_before[1], "both replicas served"
        replicas[1].proc.send_signal(signal.SIGTERM)  # drains: running requests finish, new ones get 503
        for t in threads:
            t.join(300)
        assert replicas[1].wait_exit(60) == 0
    finally:
        router.stop()
    assert results == [200] * len(prompts), results


def test_a_replica_killed_mid_run_loses_no_request_the_router_retries(replicas):
    """SIGKILL, no drain: the requests it was running fail at the router's connection to it, and the
    router sends them (not yet answered) and every later one to the replica left. Runs after the
    drain test, with a new replica in the drained one's place."""
    survivor, doomed = replicas[0], Replica().wait_ready()
    try:
        router = Router([survivor, doomed], "round_robin", "--health-check-interval-secs", "1",
                        "--health-failure-threshold", "1", "--retry-max-retries", "5")
        results: list[int] = []
        lock = threading.Lock()
        rng = random.Random(6)
        prompts = [f"Tale {i}: " + _words(rng, 20) for i in range(24)]

        def client(mine: list[str]) -> None:
            with httpx.Client(timeout=120) as http:
                for prompt in mine:
                    r = http.post(f"{router.url}/v1/completions",
                                  json={"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0})
                    with lock:
                        results.append(r.status_code)

        try:
            threads = [threading.Thread(target=client, args=(prompts[i::4],)) for i in range(4)]
            for t in threads:
                t.start()
            while len(results) < 6:
                time.sleep(0.05)
            running = doomed.counter("vllm:num_requests_running")
            doomed._signal_group(signal.SIGKILL)  # the server and its engine, at once
            for t in threads:
                t.join(300)
        finally:
            router.stop()
        print(f"killed with {running:.0f} running; statuses {sorted(results)}")
        assert results == [200] * len(prompts), results
    finally:
        doomed.stop()
