"""`python -m server [MODEL] [flags]`: check the model, then run uvicorn with the app."""
from __future__ import annotations

import logging
import multiprocessing
import resource
import sys

import uvicorn

from common.child_process import LOG_FORMAT
from common.default_model import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model, resolve_model_path
from server.app import create_app
from server.config import parse_args
from server.draining import DrainingServer
from server.http_protocol import LimitedHttpToolsProtocol
from server.state import ServingState

logger = logging.getLogger("server")

GRACEFUL_SHUTDOWN_S = 10  # after our drain only idle keep-alive connections remain


def main(argv: list[str] | None = None, prog: str = "python -m server") -> int:
    server_config, engine_config = parse_args(argv, prog)
    multiprocessing.current_process().name = "server"
    logging.basicConfig(level=server_config.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    try:
        model_dir = _model_dir(engine_config.model)
    except (FileNotFoundError, RuntimeError) as exc:
        logger.error("%s", exc)
        return 2
    served_names = server_config.served_model_name or (engine_config.model or DEFAULT_MODEL_NAME,)
    try:
        state = ServingState(server_config, engine_config.replace(model=model_dir), model_dir, tuple(served_names))
    except ValueError as exc:  # a --lora-modules folder that does not fit the model, or a bad flag
        logger.error("%s", exc)
        return 2
    raise_open_file_limit()
    # The protocol (httptools) refuses a request head that grows past MAX_HEADER_BYTES with 431
    # and one that arrives too slowly with 408 (server/http_protocol.py).
    # loop "auto" (uvicorn's default) runs uvloop, pinned in requirements.txt: at one stream the
    # server on it gave TPOT 8.61 vs 8.92 ms on asyncio's loop (benchmarks/results/2026-12-03-xeon-uvloop.md).
    config = uvicorn.Config(
        create_app(state), host=server_config.host, port=server_config.port,
        http=LimitedHttpToolsProtocol.with_header_timeout(server_config.header_read_timeout), lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_level=server_config.log_level, log_config=None, access_log=False)
    server = DrainingServer(config, state)
    try:
        server.run()
    finally:
        state.shutdown()  # also after a forced stop, where uvicorn skips the app's shutdown
    if not server.started and state.exit_code == 0:
        return 1  # could not bind the port, or the app failed to start
    return state.exit_code


def raise_open_file_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit, as vLLM does: the default soft 1024 descriptors
    run out with a few hundred open connections (each client holds one socket)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20  # Linux's default fs.nr_open
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open file limit from %d: %s", soft, exc)


def _model_dir(model: str | None) -> str:
    """The model folder; the embedded default is converted once, in a child process, so this
    process never loads torch."""
    if model is None and not (default_model_dir() / "config.json").exists():
        logger.info("converting the embedded %s once; this takes about half a minute", DEFAULT_MODEL_NAME)
        proc = multiprocessing.get_context("spawn").Process(target=ensure_default_model, name="convert-model")
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"converting {DEFAULT_MODEL_NAME} failed (exit code {proc.exitcode})")
    return str(resolve_model_path(model))
