"""uvicorn, with a drain on SIGTERM / SIGINT instead of an immediate stop.

uvicorn stops listening at the first signal, and sse-starlette 3.x then ends every open stream.
Here the first signal only marks the server as draining: the port stays open so new requests
get a 503 (not a refused connection), running requests finish, and once none is left uvicorn
shuts down. At --drain-timeout the requests still running are aborted with a 503 error (a
stream ends with the error event and [DONE]) and the server exits with status 0 all the same:
the deadline is part of a normal stop. A second signal stops at once, with status 1.
"""
from __future__ import annotations

import logging
import time

import uvicorn
from sse_starlette.sse import AppStatus

from server.errors import RETRY_AFTER_S, ApiError
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
                # Each request left gets a 503 that says why (a stream: an error event, then
                # [DONE]); the next tick finds none running and shuts down, and uvicorn lets the
                # responses finish (timeout_graceful_shutdown) before it closes their connections.
                timeout = self.state.config.drain_timeout
                aborted = self.state.client.abort_all(ApiError(
                    503, f"the server is shutting down: the request did not finish within the drain timeout "
                         f"({timeout:g} s) and was aborted; retry it on another replica", code="drain_timeout",
                    headers={"Retry-After": str(RETRY_AFTER_S)}))
                logger.warning("drain timeout (%g s): aborted %d requests still running", timeout, aborted)
        return await super().on_tick(counter)
