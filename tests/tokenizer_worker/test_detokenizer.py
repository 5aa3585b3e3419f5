"""Incremental detokenizer and stop strings, against the full (non-streamed) decode.

The tokenizers are built here, no files: byte-level BPE like SmolLM2's, one trained on a small
corpus and one whose vocabulary holds every 1..4-byte piece of a text, so any cut of that text's
UTF-8 bytes (inside a character too) is a valid sequence of ids.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tokenizer_worker.detokenizer import NUM_PROMPT_CONTEXT_TOKENS, IncrementalDetokenizer

SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>"]
# Chinese (3-byte), emoji (4-byte, one with a ZWJ sequence), accents (2-byte), ASCII.
TEXT = "Hi there! 你好，世界。Café déjà vu 🙂👍🏽 ok 👨‍👩‍👧 STOP 終わり end."
# Whole pieces the hand-written token sequences below use (besides pieces of TEXT).
EXTRA_TEXT = "there!STOP 終わり ok\n"
EMOJI = "🙂"  # F0 9F 99 82


def byte_to_char() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte, as byte-level BPE vocabularies use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    backend.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


class PieceTokenizer:
    """Byte-level BPE whose vocabulary is every byte plus every 2..8-byte piece of `corpus`."""

    def __init__(self, corpus: str):
        to_char = byte_to_char()
        self._piece = lambda data: "".join(to_char[b] for b in data)
        vocab: dict[str, int] = {}
        for b in range(256):
            vocab.setdefault(self._piece(bytes([b])), len(vocab))
        data = corpus.encode()
        for length in range(2, 9):
            for i in range(len(data) - length + 1):
                vocab.setdefault(self._piece(data[i : i + length]), len(vocab))
        self._vocab = vocab
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        self.hf = wrap(backend)

    def ids(self, *pieces: bytes | str) -> list[int]:
        """One id per piece; a str piece is its UTF-8 bytes, a special token its own id."""
        out = []
        for piece in pieces:
            if piece in SPECIAL_TOKENS:
                out.append(self.hf.convert_tokens_to_ids(piece))
            else:
                out.append(self._vocab[self._piece(piece.encode() if isinstance(piece, str) else piece)])
        return out

    def random_ids(self, text: str, rng: random.Random) -> list[int]:
        """`text` cut at random byte positions into pieces of 1..4 bytes."""
        data, pieces, i = text.encode(), [], 0
        while i < len(data):
            length = rng.randint(1, 4)
            pieces.append(data[i : i + length])
            i += length
        return self.ids(*pieces)


@pytest.fixture(scope="module")
def pieces() -> PieceTokenizer:
    return PieceTokenizer(TEXT + EXTRA_TEXT)


@pytest.fixture(scope="module")
def trained() -> PreTrainedTokenizerFast:
    """A tiny trained byte-level BPE: common words merge, rarer multi-byte characters stay split."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = [TEXT, "the quick brown fox 你好 你好 世界 🙂🙂 jumps", "hello world 你好世界 😀 café"] * 20
    backend.train_from_iterator(corpus, trainer)
    return wrap(backend)


def stream(detokenizer, token_ids, rng=None):
    """Feed ids one at a time (or in random chunks of 1..5); return (deltas, stop_hit)."""
    deltas, i = [], 0
    while i < len(token_ids):
        size = 1 if rng is None else rng.randint(1, 5)
        out = detokenizer.add_tokens(token_ids[i : i + size])
        deltas.append(out.text)
        i += size
        if out.stop_hit is not None:
            assert detokenizer.stop_hit == out.stop_hit
            return deltas, out.stop_hit
    deltas.append(detokenizer.flush())
    return deltas, detokenizer.stop_hit


def truncate_at_stop(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """Reference: read the full text left to right, stop at the first completed stop string."""
    for end in range(1, len(text) + 1):
        ending_here = [s for s in stop if text[:end].endswith(s)]
        if ending_here:
            hit = max(ending_here, key=len)  # same end: the longest starts earliest
            return (text[:end] if include else text[: end - len(hit)]), hit
    return text, None


# ---- text without stop strings ----------------------------------------------------------------


def test_four_byte_emoji_split_across_tokens_is_held_until_complete(pieces):
    data = EMOJI.encode()
    ids = pieces.ids("ok ", data[:1], data[1:2], data[2:], " ok")
    detokenizer = IncrementalDetokenizer(pieces.hf, [])
    assert [detokenizer.add_tokens([i]).text for i in ids] == ["ok ", "", "", EMOJI, " ok"]
    assert detokenizer.flush() == ""


def test_tokens_that_end_and_start_mid_character(pieces):
    data = "你好，".encode()  # E4 BD A0 | E5 A5 BD | EF BC 8C
    ids = pieces.ids(data[0:2], data[2:4], data[4:6], data[6:9])
    detokenizer = IncrementalDetokenizer(pieces.hf, [])
    # The second token completes 你 but ends inside 好: the whole step waits for the next one.
    assert [detokenizer.add_tokens([i]).text for i in ids] == ["", "", "你好", "，"]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_cuts_concatenate_to_the_full_decode(pieces, skip_special_tokens):
    for seed in range(40):
        rng = random.Random(seed)
        ids = pieces.random_ids(TEXT, rng) + pieces.ids("<|im_end|>")
        detokenizer = IncrementalDetokenizer(pieces.hf, [], skip_special_tokens=skip_special_tokens)
        deltas, stop_hit = stream(detokenizer, ids, rng if seed % 2 else None)
        assert stop_hit is None
        assert "".join(deltas) == pieces.hf.decode(ids, skip_special_tokens=skip_special_tokens)
        assert not any("\ufffd" in delta for delta in deltas), (seed, deltas)


def test_trained_tokenizer_streams_its_own_encoding(trained):
    text = "the quick 你好 fox 🙂 ran to 世界, café 😀👍🏽 done"
    ids = trained.encode(text, add_special_tokens=False)
    assert any("\ufffd" in trained.decode([i]) for i in ids), "want characters split across tokens"
    for seed in range(10):
        deltas, _ = stream(IncrementalDetokenizer(trained, []), ids, random.Random(seed))
        assert "".join(deltas) == text
        assert not any("\ufffd" in delta for delta in deltas)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_ids_match_full_decode_even_with_invalid_utf8(trained, skip_special_tokens):
    """Random ids: lone bytes, broken characters, special tokens; a trailing broken one too."""
    for seed in range(30):
        rng = random.Random(seed)
        ids = [rng.randrange(len(trained)) for _ in range(rng.randint(1, 60))]
        detokenizer = IncrementalDetokenizer(trained, [], skip_special_tokens=skip_special_tokens)
        deltas, _ = stream(detokenizer, ids, rng)
        assert "".join(deltas) == trained.decode(ids, skip_special_tokens=skip_special_tokens)


def test_special_tokens_are_skipped_or_kept(pieces):
    ids = pieces.ids("<|im_start|>", "ok", "<|im_end|>")
    skipped = IncrementalDetokenizer(pieces.hf, [], skip_special_tokens=True)
    assert [skipped.add_tokens([i]).text for i in ids] + [skipped.flush()] == ["", "ok", "", ""]
    kept = IncrementalDetokenizer(pieces.hf, [], skip_special_tokens=False)
    assert "".join(kept.add_tokens([i]).text for i in ids) + kept.flush() == "<|im_start|>ok<|im_end|>"


def test_prompt_context(pieces):
    prompt = pieces.ids("<|im_start|>", "Hi", " the", "<|im_end|>", "\n", "<|im_start|>", "ok\n")
    output = pieces.ids("你", "好")
    detokenizer = IncrementalDetokenizer(pieces.hf, prompt)
    assert [detokenizer.add_tokens([i]).text for i in output] == ["你", "好"]
    # A prompt that ends inside a character: the output's bytes decode on their own.
    data = "你".encode()
    detokenizer = IncrementalDetokenizer(pieces.hf, pieces.ids("ok", data[:1]))
    output = pieces.ids(data[1:], "ok")
    assert "".join(stream(detokenizer, output)[0]) == pieces.hf.decode(output)


def test_trailing_incomplete_character_is_flushed_as_decoded(pieces):
    data = EMOJI.encode()
    detokenizer = IncrementalDetokenizer(pieces.hf, [])
    assert detokenizer.add_tokens(pieces.ids("ok")).text == "ok"
    assert detokenizer.add_tokens(pieces.ids(data[:2])).text == ""
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.add_tokens(pieces.ids(data[2:])).text == ""  # finished


class RecordingBackend:
    """The real Rust tokenizer, recording how many ids each decode call got."""

    def __init__(self, backend: Tokenizer):
        self._backend = backend
        self.decode_lengths: list[int] = []

    def get_added_tokens_decoder(self):
        return self._backend.get_added_tokens_decoder()

    def decode(self, ids, skip_special_tokens):
        self.decode_lengths.append(len(ids))
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)


def test_each_step_decodes_a_short_window_not_the_whole_output(pieces):
    rng = random.Random(0)
    ids = [i for _ in range(30) for i in pieces.random_ids(TEXT, rng)]  # ~1200 tokens
    backend = RecordingBackend(pieces.hf.backend_tokenizer)
    detokenizer = IncrementalDetokenizer(SimpleNamespace(backend_tokenizer=backend), ids[:50])
    deltas, _ = stream(detokenizer, ids)
    assert "".join(deltas) == pieces.hf.decode(ids)
    # The window waits while tokens keep ending inside characters, so its size is bounded by
    # the longest run of multi-byte characters in TEXT (18 bytes), not by the output length.
    assert max(backend.decode_lengths) <= 2 * 18 + NUM_PROMPT_CONTEXT_TOKENS
    assert sum(backend.decode_lengths) <= 6 * len(ids)


def test_skipped_special_tokens_do_not_widen_the_window(pieces):
    backend = RecordingBackend(pieces.hf.backend_tokenizer)
    detokenizer = IncrementalDetokenizer(SimpleNamespace(backend_tokenizer=backend), [])
    ids = pieces.ids("ok", *["<|im_end|>"] * 100, " ok")
    assert "".join(stream(detokenizer, ids)[0]) == "ok ok"
    assert max(backend.decode_lengths) <= 2


# ---- stop strings -------------------------------------------------------------------------------


def test_stop_string_spanning_tokens_starting_mid_token(pieces):
    ids = pieces.ids("Hi", " th", "ere!S", "TO", "P 終", "わり")
    detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=["!STOP"])
    outputs = [detokenizer.add_tokens([i]) for i in ids[:5]]
    # "!S" and "!STO" could still become "!STOP": held back, never streamed; " 終" dropped.
    assert [o.text for o in outputs] == ["Hi", " th", "ere", "", ""]
    assert [o.stop_hit for o in outputs] == [None, None, None, None, "!STOP"]
    assert detokenizer.add_tokens(ids[5:]).text == "" and detokenizer.flush() == ""


def test_stop_string_included_in_output(pieces):
    ids = pieces.ids("Hi", " th", "ere!S", "TO", "P 終", "わり")
    detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=["!STOP"], include_stop_str_in_output=True)
    assert [detokenizer.add_tokens([i]).text for i in ids[:5]] == ["Hi", " th", "ere", "", "!STOP"]


def test_held_stop_prefix_is_released_when_it_does_not_complete(pieces):
    ids = pieces.ids("Hi", " S", "T", "OP", " ST", "OP")
    detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=["STOPX"])
    assert [detokenizer.add_tokens([i]).text for i in ids] == ["Hi", " ", "", "", "STOP ", ""]
    assert detokenizer.flush() == "STOP"
    assert detokenizer.stop_hit is None


def test_several_stop_strings_first_completed_wins(pieces):
    # "世界" completes before "界。Ca" would; "好，世界X" starts earliest but never completes.
    ids = pieces.ids("你好", "，世", "界。", "Ca")
    detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=["好，世界X", "界。Ca", "世界"])
    assert stream(detokenizer, ids) == (["你", "", "好，"], "世界")


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (["vu", "Caf"], ("Hi Caf", "Caf")),  # in different tokens
        (["afé", "Ca"], ("Hi Ca", "Ca")),  # in one token: the earlier end wins
        (["Café", "af"], ("Hi Caf", "af")),  # "af" completes before "Café", which starts earlier
        (["fé", "afé"], ("Hi Café", "afé")),  # same end: the longer one
    ],
)
def test_first_completed_match_with_include(pieces, stop, expected):
    detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=stop, include_stop_str_in_output=True)
    out = detokenizer.add_tokens(pieces.ids("Hi", " ", "Café", " ", "déjà", " vu"))
    assert (out.text, out.stop_hit) == expected


def test_stop_string_with_a_split_multibyte_character(pieces):
    data = "終わり".encode()
    ids = pieces.ids("STOP ", data[:2], data[2:4], data[4:8], data[8:])
    detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=["終わ"])
    assert "".join(stream(detokenizer, ids)[0]) == "STOP "
    assert detokenizer.stop_hit == "終わ"


def test_stop_string_found_in_the_flushed_tail(pieces):
    data = EMOJI.encode()
    detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=["k\ufffd"])
    assert detokenizer.add_tokens(pieces.ids("ok")).text == "o"
    assert detokenizer.add_tokens(pieces.ids(data[:2])).text == ""
    assert (detokenizer.flush(), detokenizer.stop_hit) == ("", "k\ufffd")


def test_special_token_text_as_stop_string_when_kept(pieces):
    ids = pieces.ids("ok", "<|im_end|>", "Hi")
    detokenizer = IncrementalDetokenizer(pieces.hf, [], skip_special_tokens=False, stop=["<|im_end|>"])
    assert stream(detokenizer, ids) == (["ok", ""], "<|im_end|>")


@pytest.mark.parametrize("include", [False, True])
def test_random_cuts_and_stop_strings_match_truncated_full_text(pieces, include):
    """Streamed text equals the full text cut at the first completed stop string."""
    for seed in range(60):
        rng = random.Random(seed)
        ids = pieces.random_ids(TEXT, rng)
        full_text = pieces.hf.decode(ids)
        stop = []
        for _ in range(rng.randint(1, 3)):
            start = rng.randrange(len(full_text))
            stop.append(full_text[start : start + rng.randint(1, 6)])
        stop.append("éjà vX")  # a prefix that appears but never completes
        detokenizer = IncrementalDetokenizer(pieces.hf, [], stop=stop, include_stop_str_in_output=include)
        deltas, stop_hit = stream(detokenizer, ids, rng if seed % 2 else None)
        assert ("".join(deltas), stop_hit) == truncate_at_stop(full_text, stop, include), (seed, stop)
        assert not any("\ufffd" in delta for delta in deltas)
