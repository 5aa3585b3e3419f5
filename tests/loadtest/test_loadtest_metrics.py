"""Metric math on synthetic timings (no server): vLLM's TTFT/TPOT/ITL/E2E, percentiles, goodput.

Floats are compared with pytest.approx: the figures are sums and differences of float seconds.
"""

import pytest

from loadtest.metrics import compute_metrics, latency_stats, meets_slo
from loadtest.request import RequestResult


def done(start, ttft, chunk_offsets, e2e, output_tokens, prompt_tokens=None, input_len=10):
    """A successful request whose content chunks arrived at start + each offset."""
    r = RequestResult(input_len=input_len, start_time=start)
    r.success = True
    r.ttft_s = ttft
    r.chunk_times = [start + t for t in chunk_offsets]
    r.e2el_s = e2e
    r.output_tokens = output_tokens
    r.prompt_tokens = prompt_tokens
    return r


def failed(start, kind):
    return RequestResult(input_len=10, start_time=start).fail(kind, "boom")


def test_chunk_with_several_tokens():
    # 7 tokens in 3 chunks (3 + 3 + 1): ITL is per chunk, TPOT per token from usage.
    r = done(100.0, 0.1, [0.1, 0.2, 0.4], 0.5, output_tokens=7, prompt_tokens=12)
    assert r.itls_s == pytest.approx([0.1, 0.2])
    assert r.tpot_s == pytest.approx((0.5 - 0.1) / 6)
    m = compute_metrics([r], duration_s=2.0)
    assert m["mean_itl_ms"] == pytest.approx(150.0)
    assert m["mean_tpot_ms"] == pytest.approx(400.0 / 6)
    assert m["total_output_tokens"] == 7
    assert m["output_throughput"] == pytest.approx(3.5)
    assert m["total_token_throughput"] == pytest.approx((12 + 7) / 2.0)  # usage prompt_tokens wins
    assert m["itls"] == [pytest.approx([0.1, 0.2])]


def test_one_output_token_has_no_tpot():
    one = done(0.0, 0.05, [0.05], 0.06, output_tokens=1)
    two = done(1.0, 0.05, [0.05, 0.15], 0.15, output_tokens=2)
    assert one.tpot_s is None and one.itls_s == []
    m = compute_metrics([one, two], duration_s=1.0)
    # Only the two-token request has a TPOT; both have TTFT and E2E.
    assert m["mean_tpot_ms"] == pytest.approx(100.0)
    assert m["p99_tpot_ms"] == pytest.approx(100.0)
    assert m["mean_ttft_ms"] == pytest.approx(50.0)
    assert m["tpots"] == [None, pytest.approx(0.1)]
    # No TPOT cannot break a TPOT SLO (vLLM counts it as 0).
    assert meets_slo(one, {"tpot": 1.0})


def test_errored_request_is_counted_not_measured():
    good = done(0.0, 0.2, [0.2, 0.3], 0.3, output_tokens=2, input_len=5)
    bad = failed(0.1, "http_503")
    timeout = failed(0.2, "timeout")
    m = compute_metrics([good, bad, timeout], duration_s=1.0)
    assert m["completed"] == 1 and m["failed"] == 2
    assert m["error_counts"] == {"http_503": 1, "timeout": 1}
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_e2el_ms"] == pytest.approx(300.0)
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["total_input_tokens"] == 5  # only the completed request's prompt
    assert m["ttfts"] == [pytest.approx(0.2), None, None]
    assert m["output_lens"] == [2, 0, 0]
    assert m["errors"][0] == "" and m["errors"][1].startswith("http_503")
    assert m["start_times"] == pytest.approx([0.0, 0.1, 0.2])


def test_percentiles_and_empty():
    stats = latency_stats("ttft", [i / 1000 for i in range(101)])  # 0..100 ms
    assert stats["mean_ttft_ms"] == pytest.approx(50.0)
    assert stats["median_ttft_ms"] == pytest.approx(50.0)
    assert stats["p90_ttft_ms"] == pytest.approx(90.0)
    assert stats["p99_ttft_ms"] == pytest.approx(99.0)
    assert all(v is None for v in latency_stats("itl", []).values())
    m = compute_metrics([failed(0.0, "ConnectError")], duration_s=0.5)
    assert m["completed"] == 0 and m["mean_ttft_ms"] is None and m["request_throughput"] == 0.0


def test_goodput():
    fast = done(0.0, 0.1, [0.1, 0.2, 0.3], 0.3, output_tokens=3)  # TPOT 100 ms
    slow_first = done(1.0, 0.4, [0.4, 0.5], 0.5, output_tokens=2)  # TTFT 400 ms
    slow_tokens = done(2.0, 0.1, [0.1, 0.5], 0.9, output_tokens=2)  # TPOT 800 ms
    bad = failed(3.0, "stream_error")
    results = [fast, slow_first, slow_tokens, bad]
    m = compute_metrics(results, duration_s=4.0, slo_ms={"ttft": 200, "tpot": 150})
    assert m["request_goodput"] == pytest.approx(1 / 4.0)  # only `fast` meets both
    assert compute_metrics(results, duration_s=4.0, slo_ms={"ttft": 200})["request_goodput"] == pytest.approx(2 / 4.0)
    assert compute_metrics(results, duration_s=4.0, slo_ms={"e2el": 600})["request_goodput"] == pytest.approx(2 / 4.0)
    assert compute_metrics(results, duration_s=4.0)["request_goodput"] is None  # no SLO, no goodput
