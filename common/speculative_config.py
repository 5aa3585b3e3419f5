"""`--speculative-config`, as in vLLM: a JSON object naming the draft method and its knobs.

    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
                           "prompt_lookup_min": 2, "prompt_lookup_max": 5}'

n-gram (prompt lookup) drafting: the longest earlier match of the sequence's last n tokens
(prompt_lookup_max >= n >= prompt_lookup_min) in its prompt and output proposes the
num_speculative_tokens that followed it. `disable_by_batch_size`: steps with more running
requests than this draft nothing (vLLM's knob of that name). On the 2-core CPU, with drafts
accepted ~80 % of the time, drafting paid 3.1x at batch 1, 1.5x at 8 and 1.2x at 16
(`python -m benchmarks --speculative`, benchmarks/results/2026-12-01-speculative-decoding.md);
above 16 a step is compute-bound and the gain depends on the acceptance rate, so 16 is the default.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

METHODS = ("ngram",)
DEFAULT_DISABLE_BY_BATCH_SIZE = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Parse and check; ValueError names what is wrong."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative config is not valid JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("speculative config must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"speculative config: unknown keys {unknown}; known: {sorted(known)}")
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative config: method {self.method!r} is not supported; use one of {METHODS}")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative config: {name} must be a positive integer, got {value!r}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError("speculative config: prompt_lookup_max must be at least prompt_lookup_min")

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def parse_speculative_config(text: str) -> SpeculativeConfig | None:
    """The CLI's parser: '' or 'none' turns it off; a bad value is an argparse error with the reason."""
    if text.strip().lower() in ("", "none", "null"):
        return None
    try:
        return SpeculativeConfig.from_json(text)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
