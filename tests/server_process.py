"""Test helpers: the real server as a subprocess on a free port, and a strict SSE reader.

The server runs the real default model in float32 (batch-invariant greedy decoding, so texts
from a batch equal texts alone) with a small KV cache. It gets its own process group, and is
always killed with that group at the end, so no engine or worker outlives a test.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from loadtest.servers import free_port

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 240  # model load on a busy 2-core machine; the first run also converts the model
BASE_ARGS = ["--max-model-len", "2048", "--kv-cache-memory", str(128 << 20), "--dtype", "float32",
             "--device", "cpu", "--max-num-seqs", "32"]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the test process dies (Linux), so an
    interrupted test run leaves no server behind."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


class ServerProcess:
    def __init__(self, *extra_args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)
        args = [sys.executable, "-m", "server", "--port", str(self.port), *BASE_ARGS, *extra_args]
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent)

    def wait_ready(self) -> "ServerProcess":
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready in {START_TIMEOUT_S} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything left of the group
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.log.close()
        os.unlink(self.log.name)


def start_server(*extra_args: str) -> ServerProcess:
    server = ServerProcess(*extra_args)
    try:
        return server.wait_ready()
    except BaseException:
        server.stop()
        raise


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
