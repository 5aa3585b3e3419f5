"""Start an OpenAI-compatible server as a child process, wait until it answers, stop it.

Used by `loadtest.bench_servers` and by the test suite's real-server helper. Each server gets
its own process group, so stopping it also stops the processes it started (our server's engine
and tokenizer worker), and on Linux it is sent SIGTERM if the thread that started it dies, so
an interrupted run leaves no server behind.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

LOG_TAIL_CHARS = 4000  # of the server's log, in the error when it does not come up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: PR_SET_PDEATHSIG, SIGTERM when the starting thread exits."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)


class ManagedServer:
    def __init__(self, name: str, command: list[str], port: int, log_dir: Path, env: dict | None = None,
                 cwd: str | Path | None = None):
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.url}/v1"
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout_s: float, probe: str = "/v1/models", poll_s: float = 0.5) -> None:
        """Ready when `probe` answers 200 (a server that loads lazily may answer /health early)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}{probe}", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s; {self._log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _log_tail(self) -> str:
        return f"the end of {self.log_path}:\n{self.log_text()[-LOG_TAIL_CHARS:]}"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the group (our server drains; its children ignore it and are stopped by it),
        then SIGKILL whatever is left of the group."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
