"""A server on the default settings, shared by the test files that need nothing special."""
from __future__ import annotations

import pytest

from server_process import start_server


@pytest.fixture(scope="session")
def default_server():
    s = start_server()
    yield s
    s.stop()
