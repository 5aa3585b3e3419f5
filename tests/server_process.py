"""Test helpers: the real server as a subprocess on a free port, and a strict SSE reader.

The server runs the real default model in float32 (batch-invariant greedy decoding, so texts
from a batch equal texts alone) with a small KV cache. It is a `loadtest.servers.ManagedServer`:
its own process group, always killed with that group at the end, so no engine or worker outlives
a test; its log lives in a temporary folder that is removed then.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

import httpx

from loadtest.servers import ManagedServer, free_port

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 240  # model load on a busy 2-core machine; the first run also converts the model
BASE_ARGS = ["--max-model-len", "2048", "--kv-cache-memory", str(128 << 20), "--dtype", "float32",
             "--device", "cpu", "--max-num-seqs", "32"]


class ServerProcess(ManagedServer):
    def __init__(self, *extra_args: str, env: dict[str, str] | None = None):
        port = free_port()
        self.log_dir = Path(tempfile.mkdtemp(prefix="server-"))
        super().__init__("server", [sys.executable, "-m", "server", "--port", str(port), *BASE_ARGS, *extra_args],
                         port, self.log_dir, env=env, cwd=REPO)

    def wait_ready(self) -> ServerProcess:
        """Ready when /health answers 200; stopped (and the log in the error) if it never does."""
        try:
            super().wait_ready(START_TIMEOUT_S, probe="/health", poll_s=0.3)
        except BaseException:
            self.stop()
            raise
        return self

    def child_pid(self, name: str) -> int:
        """The pid of the server's child process with this name (as `ps -o comm` shows it)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == self.proc.pid and comm == name:
                return int(entry.name)
        raise LookupError(f"no child process {name!r} of {self.proc.pid}")

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)


def start_server(*extra_args: str, env: dict[str, str] | None = None) -> ServerProcess:
    """`env`: variables added to this process's environment for the server and its children."""
    return ServerProcess(*extra_args, env=env).wait_ready()


class SSEFormatError(AssertionError):
    pass


def parse_sse(raw: bytes) -> list:
    """Events of a whole SSE body, strictly: `data: <payload>` lines separated by one blank
    line with "\\n" only; comment lines (`: ping`) allowed. JSON payloads are decoded; the last
    one must be `[DONE]`."""
    text = raw.decode("utf-8")
    if "\r" in text:
        raise SSEFormatError("\\r in the stream: the separator must be \\n")
    if not text.endswith("\n\n"):
        raise SSEFormatError("stream does not end with a blank line")
    events = []
    for block in text[:-2].split("\n\n"):
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        if len(lines) != 1 or not lines[0].startswith("data: "):
            raise SSEFormatError(f"not a single data line: {block[:200]!r}")
        payload = lines[0][len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    if not events or events[-1] != "[DONE]":
        raise SSEFormatError("stream does not end with data: [DONE]")
    if "[DONE]" in events[:-1]:
        raise SSEFormatError("[DONE] before the end")
    return events[:-1]


def stream_post(url: str, body: dict, headers: dict | None = None, timeout: float = 120) -> list:
    with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse_sse(response.read())


async def health_once_not_ok(http: httpx.AsyncClient, url: str, timeout_s: float = 1.0) -> httpx.Response:
    """/health, polled until it stops answering 200 or `timeout_s` passes: a child's death, or a
    SIGTERM (handled in the server's event loop), takes a moment to show there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        health = await http.get(f"{url}/health")
        if health.status_code != 200 or asyncio.get_running_loop().time() >= deadline:
            return health
        await asyncio.sleep(0.01)
