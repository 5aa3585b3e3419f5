"""What one benchmark request is (RequestSpec) and what came back (RequestResult).

Plain data only: the client fills a RequestResult, metrics.py and report.py read it. Times are
seconds from time.perf_counter(), so they are only comparable within one process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RequestSpec:
    """One request to send; the same spec list goes to every target so they see equal work."""

    # Exactly one of prompt / messages is set; the client turns a prompt into one user message
    # for the chat endpoint.
    prompt: str | None
    messages: tuple[dict[str, Any], ...] | None
    max_tokens: int
    # Prompt length as this tool estimated it (tokenizer count, else word count). The server's
    # usage.prompt_tokens, when sent, is the figure used for token throughput.
    input_len: int
    # A dataset line's own `model` (a LoRA adapter, say); None: the target's model
    model: str | None = None

    def __post_init__(self) -> None:
        assert (self.prompt is None) != (self.messages is None), "set exactly one of prompt/messages"


@dataclass
class RequestResult:
    """Timings of one streamed request. A failed request keeps error_kind and no latency figures."""

    input_len: int
    start_time: float  # perf_counter() just before the request was sent
    success: bool = False
    error_kind: str = ""  # e.g. "http_503", "timeout", "ConnectError", "stream_error", "no_content"
    error_message: str = ""
    ttft_s: float | None = None  # first chunk with non-empty content, from start_time
    # Arrival time of each content chunk (perf_counter). A chunk may carry several tokens.
    chunk_times: list[float] = field(default_factory=list)
    e2el_s: float | None = None  # start_time to the end of the stream ([DONE] or EOF)
    output_tokens: int = 0  # usage.completion_tokens, else the number of content chunks
    prompt_tokens: int | None = None  # usage.prompt_tokens when the server sent usage
    usage_missing: bool = False  # True when output_tokens had to be counted from chunks
    generated_text: str = ""

    @property
    def itls_s(self) -> list[float]:
        """Gaps between successive content chunks (vLLM's ITL: per chunk, not per token)."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output_tokens - 1); undefined for one output token or a failure."""
        if not self.success or self.output_tokens <= 1:
            return None
        assert self.e2el_s is not None and self.ttft_s is not None, "a success has E2E and TTFT"
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def fail(self, kind: str, message: str = "") -> RequestResult:
        self.success = False
        self.error_kind = kind
        self.error_message = message[:500]
        return self
