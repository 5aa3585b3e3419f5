"""What the HTTP handlers share: the worker client, the model's facts, and the server's life.

Life of the server: loading (503 with Retry-After) -> ready -> draining after SIGTERM (running
requests finish, new ones get 503) -> stopped. If a child process dies or reports a crash, every
request in flight ends with an error, /health answers 503, and the server exits with status 1.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from common.engine_config import EngineConfig
from common.ipc import IpcPaths
from common.gc_heap import freeze_startup_heap
from common.messages import EngineReady
from server.config import ServerConfig
from server.errors import ApiError, unavailable
from server.lora import LoraRegistry, parse_lora_module
from server.metrics import ServerMetrics
from server.processes import ChildProcesses
from server.worker_client import WorkerClient

logger = logging.getLogger(__name__)

# Between a child's death and the exit: open streams get their error chunk, probes see the 503.
FAILURE_EXIT_DELAY_S = 1.0


class ServingState:
    def __init__(self, server_config: ServerConfig, engine_config: EngineConfig, model_dir: str,
                 served_model_names: tuple[str, ...]):
        self.config = server_config
        self.engine_config = engine_config
        self.model_dir = model_dir
        # Every name is accepted as `model`; the first is the one responses and metrics carry (vLLM's rule)
        self.served_model_names = served_model_names
        self.served_model_name = served_model_names[0]
        self.metrics = ServerMetrics(self.served_model_name)
        # the LoRA adapters served as models (server/lora.py), with --enable-lora
        self.lora: LoraRegistry | None = None
        if engine_config.enable_lora:
            self.lora = LoraRegistry(model_dir, engine_config.max_lora_rank, engine_config.max_loras,
                                     served_model_names)
            for module in map(parse_lora_module, server_config.lora_modules):
                self.lora.add(module.name, module.path, module.base_model_name)
        elif server_config.lora_modules:
            raise ValueError("--lora-modules needs --enable-lora")
        self.paths: IpcPaths | None = None
        self.client: WorkerClient | None = None
        self.processes: ChildProcesses | None = None
        self.generation_defaults: dict[str, int | float] = {}  # from EngineReady
        self.draining = False
        self.exit_code = 0
        self._shut_down = False
        self.request_exit: Callable[[], None] = lambda: None  # set by the DrainingServer

    # ---- life -------------------------------------------------------------------------------

    async def startup(self) -> None:
        self.paths = IpcPaths.create()
        max_in_flight = self.engine_config.max_num_seqs + self.config.max_queued_requests
        self.client = WorkerClient(self.paths, self.metrics, max_in_flight)
        self.client.on_ready = self._on_ready
        self.client.on_failure = self._on_failure
        self.client.start()
        self.processes = ChildProcesses(self.engine_config, self.model_dir, self.paths, self.config.log_level,
                                        detokenize_check=self.config.detokenize_check)
        self.processes.start(on_exit=self._on_child_exit)
        logger.info("loading %s ...", self.model_dir)

    def shutdown(self) -> None:
        """Stop the children and remove the sockets; safe to call twice."""
        if self._shut_down:
            return
        self._shut_down = True
        if self.processes is not None:
            self.processes.stop()
        if self.client is not None:
            self.client.close()
        if self.paths is not None:
            self.paths.remove()

    def _on_ready(self, ready: EngineReady) -> None:
        self.generation_defaults = dict(ready.generation_defaults)
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        logger.info("ready: model %s (%s) on %s, %s; KV cache %d tokens; max_model_len %d; EOS ids %s; "
                    "sampling defaults %s; serving at http://%s:%d/v1", self.served_model_name, ready.model_dir,
                    ready.device, ready.dtype, ready.num_kv_tokens, ready.max_model_len, ready.eos_token_ids,
                    self.generation_defaults or "none", host, self.config.port)
        freeze_startup_heap()  # every module the server imports is loaded by now

    def _on_child_exit(self, name: str, exit_code: int | None) -> None:
        self.client.fail(f"the {name} process exited unexpectedly (exit code {exit_code})")

    def _on_failure(self, _reason: str) -> None:
        self.exit_code = 1
        asyncio.get_running_loop().call_later(FAILURE_EXIT_DELAY_S, self.request_exit)

    def start_drain(self) -> None:
        if not self.draining:
            self.draining = True
            logger.info("draining: %d requests running; new requests get 503", self.num_in_flight())

    def num_in_flight(self) -> int:
        return 0 if self.client is None else len(self.client.streams)

    # ---- checks for handlers ------------------------------------------------------------

    @property
    def ready(self) -> EngineReady | None:
        return None if self.client is None else self.client.ready

    def health_problem(self) -> str | None:
        if self.client is not None and self.client.failure is not None:
            return f"the engine failed: {self.client.failure}"
        if self.draining:
            return "the server is shutting down"
        if self.ready is None:
            return "the model is loading"
        return None

    def check_accepting(self) -> EngineReady:
        problem = self.health_problem()
        if problem is not None:
            raise unavailable(problem)
        return self.ready

    def check_model(self, model: str | None) -> None:
        if model is not None and self.lora is not None and model in self.lora.adapters:
            return
        if model is not None and model not in self.served_model_names:
            served = ", ".join(f"`{name}`" for name in self.served_model_names)
            raise ApiError(404, f"The model `{model[:200]}` does not exist; this server serves {served}.", "model",
                           code="model_not_found")
