"""The processes' start-up heaps are frozen out of the cyclic garbage collector (common/gc_heap.py),
so no full collection walks the model's and libraries' objects while the server streams."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow  # a real server process (and the model) per module

FROZEN = re.compile(r" (\S+) common\.gc_heap: garbage collector: (\d+) start-up objects frozen")


def test_every_process_freezes_its_startup_heap(default_server):
    log = default_server.log_text()
    frozen = {m.group(1): int(m.group(2)) for m in FROZEN.finditer(log)}
    assert frozen.keys() == {"server", "engine", "tokenizer_worker"}, log[-3000:]
    # torch, transformers and the model: hundreds of thousands of objects in the engine
    assert frozen["engine"] > 100_000 and frozen["tokenizer_worker"] > 10_000 and frozen["server"] > 10_000, frozen
