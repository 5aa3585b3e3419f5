"""Starting and watching the engine and tokenizer worker processes.

Both are started with the spawn method (a fresh interpreter: no forked threads, locks or CUDA
state). The event loop watches each process's sentinel, so a child that dies for any reason,
SIGKILL included, is noticed at once and reported through `on_exit`; the server then fails every
request in flight and exits non-zero instead of hanging.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from common.engine_config import EngineConfig
from common.ipc import IpcPaths
from engine.engine_process import run_engine_process
from tokenizer_worker.worker import run_tokenizer_worker

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 5.0


class ChildProcesses:
    def __init__(self, engine_config: EngineConfig, model_dir: str, paths: IpcPaths, log_level: str,
                 detokenize_check: bool = True):
        self.engine_config = engine_config
        self.detokenize_check = detokenize_check
        self.model_dir = model_dir
        self.paths = paths
        self.log_level = log_level
        self.procs: list[BaseProcess] = []
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, on_exit: Callable[[str, int | None], None]) -> None:
        self._loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        self.procs = [
            ctx.Process(target=run_engine_process, name="engine",
                        args=(self.engine_config, self.paths, self.log_level)),
            ctx.Process(target=run_tokenizer_worker, name="tokenizer_worker",
                        args=(self.model_dir, self.paths, self.log_level,
                              self.engine_config.grammar_compile_timeout, self.detokenize_check)),
        ]
        for proc in self.procs:
            proc.start()
            logger.info("started the %s process (pid %d)", proc.name, proc.pid)
            self._loop.add_reader(proc.sentinel, self._exited, proc, on_exit)

    def _exited(self, proc: BaseProcess, on_exit: Callable[[str, int | None], None]) -> None:
        self._loop.remove_reader(proc.sentinel)
        proc.join(timeout=1.0)  # the sentinel closes a moment before the process can be reaped
        if not self.stopping:
            on_exit(proc.name, proc.exitcode)

    def stop(self) -> None:
        """Stop both children (they ignore SIGTERM, see `common.child_process.start_child_process`)."""
        self.stopping = True
        for proc in self.procs:
            if self._loop is not None and proc.sentinel is not None:
                try:
                    self._loop.remove_reader(proc.sentinel)
                except (ValueError, OSError):
                    pass
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(timeout=JOIN_TIMEOUT_S)
