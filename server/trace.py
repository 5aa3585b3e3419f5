"""The `"trace": true` extension on the wire: the check, and the response's `trace` object.

Refused with a 400 naming the field unless the server runs with `--enable-trace` (a trace shows
how the server is built and how busy it is, and a traced step runs slower). The object is the
table a forward hook on every module of layer 0 would print, one row per stop with a column for
the prefill and one for the first decode step:

    {"choice": 0, "layer": 0, "engine": {device, dtype, ..., queue_ms},
     "steps": {"prefill": {tokens, batch_tokens, attention_kernel, forward_ms, ...}, "decode": {...}},
     "stops": [{"stop": "q_proj", "note": "...",
                "prefill": {"input": [1, 17, 1024], "output": [1, 17, 2048], "step_ms": null},
                "decode": {"input": [1, 1, 1024], "output": [1, 1, 2048], "step_ms": null}}, ...]}

Shapes are the request's own, (batch=1, tokens, features...); text is described ("text: 312
characters"). An engine stop's `step_ms` is its operator's time in the whole step, shared with
every request batched with this one (`steps.*.batch_tokens` says how many rows that was), and
`all_layers_step_ms` sums it over the layers; the tokenizer worker's stops have `ms`, this
request's alone.
"""
from __future__ import annotations

import msgspec

from common.messages import RequestTrace, TraceStep, TraceStop
from server.config import ServerConfig
from server.errors import bad_request
from server.protocol import SamplingFields

_STEP_FIELDS = ("tokens", "cached_tokens", "context_tokens", "batch_tokens", "batch_requests", "attention_kernel",
                "step_ms", "prepare_ms", "forward_ms", "logits_ms", "sample_ms", "runner_ms")


def check_trace_allowed(body: SamplingFields, config: ServerConfig) -> None:
    if body.trace and not config.enable_trace:
        raise bad_request("trace: this server does not trace requests (start it with --enable-trace)", "trace")


def trace_json(trace: RequestTrace) -> dict:
    engine = trace.engine
    rows: dict[str, dict] = {}
    for stop in trace.prompt_stops:
        _cell(rows, stop, "prefill", "ms")
    steps: dict[str, dict] = {}
    for phase in ("prefill", "decode"):
        record: TraceStep | None = None if engine is None else getattr(engine, phase)
        if record is None:
            continue
        steps[phase] = {name: getattr(record, name) for name in _STEP_FIELDS}
        if phase == "prefill":
            steps[phase]["earlier_chunks"] = msgspec.to_builtins(record.earlier_chunks)
        for stop in record.stops:
            _cell(rows, stop, phase, "step_ms")
    for phase, stop in (("prefill", trace.detokenize_prefill), ("decode", trace.detokenize_decode)):
        if stop is not None:
            _cell(rows, stop, phase, "ms")
    if "detokenization" in rows:
        rows["detokenization"].update(all_tokens_ms=trace.detokenize_ms, tokens=trace.detokenized_tokens)
    header = {} if engine is None else {
        "device": engine.device, "dtype": engine.dtype, "attention_backend": engine.attention_backend,
        "linear_method": engine.linear_method, "batch_invariant": engine.batch_invariant,
        "queue_ms": engine.queue_ms}
    return {"choice": trace.choice, "layer": 0, "engine": header, "steps": steps, "stops": list(rows.values())}


def _cell(rows: dict[str, dict], stop: TraceStop, phase: str, time_key: str) -> None:
    """Put `stop` into its row's `phase` column (the row made on first sight, in order)."""
    row = rows.setdefault(stop.name, {"stop": stop.name})
    if stop.note and "note" not in row:
        row["note"] = stop.note
    cell: dict = {"input": stop.input, "output": stop.output, time_key: stop.ms}
    if stop.all_layers_ms is not None:
        cell["all_layers_" + time_key] = stop.all_layers_ms
    if stop.shapes:
        cell["shapes"] = stop.shapes
    row[phase] = cell
