"""Where the requests come from: seeded random prompts of about --input-len tokens, or a JSONL file.

Random prompts are ordinary English words. With --tokenizer (a local Hugging Face folder of the
target model; nothing is ever downloaded) the words are encoded, cut to exactly input_len tokens
and decoded, so input_len is the real prompt length in that model's tokens. Without one, one
common English word is about one token in the usual BPE vocabularies, so input_len words are
"about" input_len tokens. A chat template adds its own tokens on top; the server's
usage.prompt_tokens is what the throughput figures use.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from loadtest.request import RequestSpec

# Short, frequent words: each is one token (with its leading space) in GPT-2, Llama and
# SmolLM-style vocabularies, which keeps the word-count estimate of prompt length close.
WORDS = """
the of and to in is was for on that with as by at from his it an were are which this be has
had not they he first new their one but also its after two who have other all time more when
there been can into some over most she three her years only may would year made world later
during many where used while than out up state about known part under these city school
between then well each both being such through we so him home game early season team since
work name life government way four local house found them high back long still second group
family best film series like great number north south east west music war people water area
place public small called around five until before good old large own left end river band
day line make book down show went took lead main open power point just round light live said
near even close much find head began set hand run town next road body mind side word form
past free stage story play eye field sea song land case air face low idea plan fact job age
art rule law door food fire red blue green black white gold cold warm fast slow hard soft
kind true real full late rich poor safe key
""".split()


class PromptSource:
    """Hands out request specs in a fixed, seeded order: take(n) twice gives different requests."""

    def __init__(
        self,
        *,
        endpoint_kind: str,
        input_len: int,
        output_len: int,
        seed: int,
        tokenizer_path: str | None = None,
        dataset_path: str | None = None,
    ) -> None:
        self._endpoint_kind = endpoint_kind
        self._input_len = input_len
        self._output_len = output_len
        self._rng = random.Random(seed)
        self._tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None
        self._dataset = load_dataset(dataset_path, endpoint_kind) if dataset_path else None
        self._cursor = 0  # next dataset line; wraps around when a run needs more lines

    def take(self, n: int) -> list[RequestSpec]:
        return [self._next() for _ in range(n)]

    def _next(self) -> RequestSpec:
        if self._dataset is None:
            prompt, input_len = self._random_prompt()
            return RequestSpec(prompt=prompt, messages=None, max_tokens=self._output_len, input_len=input_len)
        entry = self._dataset[self._cursor % len(self._dataset)]
        self._cursor += 1
        prompt = entry.get("prompt")
        messages = tuple(entry["messages"]) if "messages" in entry else None
        text = prompt if prompt is not None else " ".join(str(m.get("content", "")) for m in entry["messages"])
        return RequestSpec(
            prompt=prompt,
            messages=messages,
            max_tokens=int(entry.get("max_tokens", self._output_len)),
            input_len=self._count_tokens(text),
            model=entry.get("model"),
        )

    def _random_prompt(self) -> tuple[str, int]:
        words = self._rng.choices(WORDS, k=self._input_len)
        if self._tokenizer is None:
            return " ".join(words), len(words)
        ids: list[int] = self._tokenizer.encode(" ".join(words), add_special_tokens=False)
        while len(ids) < self._input_len:  # a vocabulary that splits words finer than usual
            words += self._rng.choices(WORDS, k=self._input_len - len(ids))
            ids = self._tokenizer.encode(" ".join(words), add_special_tokens=False)
        text = self._tokenizer.decode(ids[: self._input_len])
        # Decoding then encoding is not always the identity; report what the text really is.
        return text, len(self._tokenizer.encode(text, add_special_tokens=False))

    def _count_tokens(self, text: str) -> int:
        if self._tokenizer is None:
            return len(text.split())
        return len(self._tokenizer.encode(text, add_special_tokens=False))


def load_tokenizer(path: str) -> Any:
    """A local Hugging Face tokenizer folder; refuses anything that would need the network."""
    if not Path(path).is_dir():
        raise ValueError(f"--tokenizer {path!r} is not a local folder (nothing is downloaded)")
    os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces with local_files_only below
    from transformers import AutoTokenizer  # slow import, only when a tokenizer is asked for

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_dataset(path: str, endpoint_kind: str) -> list[dict[str, Any]]:
    """JSONL lines of {"prompt": str} or {"messages": [...]}, each optionally with "max_tokens"."""
    entries: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from None
            if not isinstance(entry, dict) or ("prompt" in entry) == ("messages" in entry):
                raise ValueError(f'{where}: need exactly one of "prompt" or "messages"')
            if "prompt" in entry and not isinstance(entry["prompt"], str):
                raise ValueError(f'{where}: "prompt" must be a string')
            if "messages" in entry:
                if endpoint_kind != "chat":
                    raise ValueError(f'{where}: "messages" needs --endpoint chat')
                if not isinstance(entry["messages"], list) or not all(isinstance(m, dict) for m in entry["messages"]):
                    raise ValueError(f'{where}: "messages" must be a list of objects')
            max_tokens = entry.get("max_tokens")
            if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
                raise ValueError(f'{where}: "max_tokens" must be a positive integer')
            entries.append(entry)
    if not entries:
        raise ValueError(f"{path}: no requests in the file")
    return entries
