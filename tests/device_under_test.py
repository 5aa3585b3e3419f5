"""The device the device-parametric tests run on: cpu here, cuda in the GPU check (`make gpu-check`
sets LLM_TEST_DEVICE=cuda)."""
from __future__ import annotations

import os

TEST_DEVICE = os.environ.get("LLM_TEST_DEVICE", "cpu")
