"""The load generator's event loop: uvloop's where it is installed (it is pinned), asyncio's otherwise."""
import asyncio

import pytest

from loadtest.event_loop import run_event_loop


def test_runs_the_coroutine_on_uvloop():
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[type, int]:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()), 42

    loop_type, value = run_event_loop(main())
    assert value == 42
    assert issubclass(loop_type, uvloop.Loop)


def test_an_exception_comes_out_as_itself():
    async def main() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        run_event_loop(main())
