"""Start an OpenAI-compatible server as a child process, wait until it answers, stop it.

Each server gets its own process group, so stopping it also stops the processes it started
(our server's engine and tokenizer worker).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManagedServer:
    def __init__(self, name: str, command: list[str], port: int, log_dir: Path, env: dict | None = None):
        self.name = name
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout_s: float, probe: str = "/v1/models") -> None:
        """Ready when `probe` answers 200 (a server that loads lazily may answer /health early)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}{probe}", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s; see {self.log_path}")

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
