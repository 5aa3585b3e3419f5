"""uvicorn, with a drain on SIGTERM / SIGINT instead of an immediate stop.

uvicorn stops listening at the first signal, and sse-starlette 3.x then ends every open stream.
Here the first signal only marks the server as draining: the port stays open so new requests
get a 503 (not a refused connection), running requests finish, and once none is left (or
--drain-timeout passed) uvicorn shuts down. A second signal stops at once.
"""
from __future__ import annotations

import logging
import time

import uvicorn
from sse_starlette.sse import AppStatus

from server.state import ServingState

logger = logging.getLogger(__name__)

# We end streams ourselves when the drain is over; sse-starlette must not end them at SIGTERM.
AppStatus.disable_automatic_graceful_drain()


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServingState):
        super().__init__(config)
        self.state = state
        self.drain_requested_at: float | None = None
        state.request_exit = self.request_exit

    def request_exit(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame) -> None:
        # A signal handler: set flags only (no logging, no event loop calls); on_tick acts.
        # The signal is deliberately not recorded for uvicorn to re-raise after serve().
        if self.drain_requested_at is None and not self.should_exit:
            self.drain_requested_at = time.monotonic()
            return
        AppStatus.should_exit = True  # ends the SSE streams still open
        self.state.exit_code = self.state.exit_code or 1
        self.should_exit = True
        self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_requested_at is not None and not self.should_exit:
            self.state.start_drain()
            in_flight = self.state.num_in_flight()
            if in_flight == 0:
                logger.info("drained; shutting down")
                self.should_exit = True
            elif time.monotonic() - self.drain_requested_at > self.state.config.drain_timeout:
                logger.warning("drain timeout: ending %d requests still running", in_flight)
                AppStatus.should_exit = True
                self.should_exit = True
        return await super().on_tick(counter)
