"""The stream self-check with real tokenizers: zero mismatches, and a broken detokenizer caught.

Every choice runs through `WorkerRequest.on_token_delta` (so the stop-token rule and the joining
of deltas are part of what is checked) with the real IncrementalDetokenizer and StreamCheck. Two
tokenizers: the default model's byte-level BPE, and a SentencePiece-style byte-fallback BPE built
here with Llama's decoder (▁ for spaces, the first one stripped; <0xNN> tokens for characters it
has no piece for, so CJK, emoji and combining marks arrive a byte at a time).
"""
from __future__ import annotations

import json
import logging
import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from common.default_model import ensure_default_model
from common.messages import SamplingParams, TextDelta, TokenDelta
from tokenizer_worker.detokenizer import DetokenizerOutput, IncrementalDetokenizer
from tokenizer_worker.request_state import Choice, WorkerRequest
from tokenizer_worker.stream_check import SHOWN_CHARS, StreamCheck
from tokenizer_worker.token_text import TokenText

# CJK, emoji (4-byte, skin tone, ZWJ family), combining marks (e + U+0301, n + U+0303, a Devanagari
# vowel sign), accents, ASCII.
TEXTS = [
    "Hello 你好，世界。 the world",
    "emoji 🙂👍🏽 and a family 👨‍👩‍👧 end",
    "combining e\u0301 n\u0303 and हिन्दी, naïve café déjà vu",
    "終わり STOP the quick brown fox 🦊 jumps over the lazy dog 🐕",
]
CHECK_LOGGER = "tokenizer_worker.stream_check"
REQUEST_ID = "req-1"


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A small trained BPE with Llama's layout: the trainer's pieces, then the 256 <0xNN> tokens."""
    trainer_side = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_side.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    corpus = ["Hello world, the quick brown fox jumps over the lazy dog.", "你好 世界 hello the world",
              "café déjà vu, naïve résumé", "the end of the story"] * 30
    # limit_alphabet keeps rare characters out of the vocabulary: those fall back to bytes.
    trainer = trainers.BpeTrainer(vocab_size=300, limit_alphabet=40, special_tokens=["<unk>"], show_progress=False)
    trainer_side.train_from_iterator(corpus, trainer)
    trained = json.loads(trainer_side.to_str())["model"]
    vocab = dict(trained["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = trainer_side.normalizer
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, PreTrainedTokenizerBase]:
    return {"default model": AutoTokenizer.from_pretrained(str(ensure_default_model())),
            "byte fallback": byte_fallback_tokenizer()}


@pytest.fixture(params=["default model", "byte fallback"])
def tokenizer(request, tokenizers) -> PreTrainedTokenizerBase:
    return tokenizers[request.param]


def run_choice(tokenizer, prompt_ids: list[int], output_ids: list[int], rng: random.Random | None = None, *,
               finish: tuple[str, int | None] = ("length", None), detokenizer_class=IncrementalDetokenizer,
               **params) -> tuple[str, TextDelta]:
    """Stream `output_ids` through one choice (one id per delta, or random chunks of 1..5); the
    last delta carries `finish` (reason, stop token id). Returns the joined text and the last delta."""
    sampling = SamplingParams(**params)
    request = WorkerRequest(REQUEST_ID, sampling, [len(prompt_ids)])
    detokenizer = detokenizer_class(tokenizer, prompt_ids, skip_special_tokens=sampling.skip_special_tokens,
                                    stop=sampling.stop, include_stop_str_in_output=sampling.include_stop_str_in_output)
    choice = Choice(0, 0, f"0:{REQUEST_ID}", detokenizer, stream_check=StreamCheck(detokenizer))
    request.add_choice(choice)
    token_text = TokenText(tokenizer)
    pieces, i, last = [], 0, None
    while not choice.finished:
        size = 1 if rng is None else rng.randint(1, 5)
        chunk, i = output_ids[i : i + size], i + size
        done = i >= len(output_ids)
        reason, stop_reason = finish if done else (None, None)
        result = request.on_token_delta(choice, TokenDelta("0:req-1", chunk, finish_reason=reason,
                                                           stop_reason=stop_reason), token_text)
        if result.delta is not None:
            pieces.append(result.delta.text)
            last = result.delta
    assert last is not None and last.finish_reason is not None
    return "".join(pieces), last


def warnings_of_the_check(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == CHECK_LOGGER]


# ---- a correct detokenizer: no mismatch -----------------------------------------------------------


def test_own_encodings_token_by_token_and_in_random_chunks(tokenizer, caplog):
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for seed in range(8):
            streamed, last = run_choice(tokenizer, [], ids, random.Random(seed) if seed else None)
            assert streamed == text and not last.detokenize_mismatch, (text, seed)
    assert warnings_of_the_check(caplog) == []


def test_byte_fallback_tokens_do_split_characters(tokenizers):
    """What the byte-fallback cases above exercise: characters that arrive one byte token at a time."""
    bf = tokenizers["byte fallback"]
    tokens = bf.convert_ids_to_tokens(bf.encode(TEXTS[1] + TEXTS[2], add_special_tokens=False))
    assert sum(t.startswith("<0x") for t in tokens) > 20


def byte_token_ids(tokenizer) -> set[int]:
    return {i for t, i in tokenizer.get_vocab().items() if len(t) == 6 and t.startswith("<0x") and t.endswith(">")}


def draw(rng: random.Random, specials: list[int], vocab: list[int]) -> int:
    return rng.choice(specials) if rng.random() < 0.1 else rng.choice(vocab)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_ids_with_broken_characters_and_special_tokens(tokenizer, skip_special_tokens, caplog):
    """Ids no tokenizer would produce: lone bytes, cut characters, special tokens anywhere, a
    random prompt before them (its last ids are the decode's context) and a cut character last.
    For the byte-fallback tokenizer without its byte tokens: see the test after this one."""
    specials = tokenizer.all_special_ids
    excluded = byte_token_ids(tokenizer)
    vocab = [i for i in range(len(tokenizer)) if i not in excluded]
    for seed in range(40):
        rng = random.Random(seed)

        prompt = [draw(rng, specials, vocab) for _ in range(rng.randint(0, 8))]
        output = [draw(rng, specials, vocab) for _ in range(rng.randint(1, 80))]
        _, last = run_choice(tokenizer, prompt, output, rng if seed % 2 else None,
                             skip_special_tokens=skip_special_tokens)
        assert not last.detokenize_mismatch, seed
    assert warnings_of_the_check(caplog) == []


def test_a_byte_fallback_run_that_is_not_utf8_as_a_whole_is_a_counted_difference(tokenizers, caplog):
    """A known difference, not hidden: the ByteFallback decoder turns a run of byte tokens that is
    invalid UTF-8 as a whole into one U+FFFD per byte, also the bytes of characters in it that were
    complete and already streamed. Here 終 (3 byte tokens) and then a stray byte: the stream sent
    終 at once, the full decode has four U+FFFD. (A max_tokens cut inside a character that follows
    byte-fallback characters is such a run; byte-level BPE tokenizers have no such rule.)"""
    bf = tokenizers["byte fallback"]
    ids = [bf.convert_tokens_to_ids(f"<0x{b:02X}>") for b in [*"終".encode(), 0xF0]]
    assert set(ids) <= byte_token_ids(bf)
    with caplog.at_level(logging.WARNING, logger=CHECK_LOGGER):
        streamed, last = run_choice(bf, [], ids)
    assert streamed.startswith("終") and bf.decode(ids) == "\ufffd" * 4
    assert last.detokenize_mismatch and len(warnings_of_the_check(caplog)) == 1


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_and_a_stop_token(tokenizer, include, caplog):
    """Stop strings cut from the text itself (inside characters' neighbourhoods, across tokens),
    and, when none matches, a stop token id that ends the text (kept only with `include`)."""
    eos = tokenizer.eos_token_id
    hits = 0
    for seed in range(40):
        rng = random.Random(seed)
        text = TEXTS[seed % len(TEXTS)]
        stop = [text[start : start + rng.randint(1, 5)] for start in rng.sample(range(len(text)), 2)]
        stop.append("never in any text")
        ids = tokenizer.encode(text, add_special_tokens=False) + [eos]
        _, last = run_choice(tokenizer, [], ids, rng if seed % 2 else None, finish=("stop", eos), stop=stop,
                             include_stop_str_in_output=include, skip_special_tokens=not include)
        assert not last.detokenize_mismatch, (seed, stop)
        hits += last.stop_reason in stop
    assert hits > 30  # most runs end at a stop string, not at the stop token
    assert warnings_of_the_check(caplog) == []


def test_stop_token_id_is_left_out_of_both_texts(tokenizer, caplog):
    ids = tokenizer.encode(TEXTS[0], add_special_tokens=False)
    eos = tokenizer.eos_token_id
    for include, expected in ((False, TEXTS[0]), (True, TEXTS[0] + tokenizer.eos_token)):
        streamed, last = run_choice(tokenizer, [], [*ids, eos], finish=("stop", eos),
                                    include_stop_str_in_output=include, skip_special_tokens=False)
        assert (streamed, last.stop_reason, last.detokenize_mismatch) == (expected, eos, False)
    assert warnings_of_the_check(caplog) == []


def test_the_reference_decodes_after_the_prompt_context_too(tokenizers, caplog):
    """SentencePiece drops the first token's space: the output "▁world" alone decodes to "world",
    after the prompt to " world". The stream has the space; so must the reference."""
    bf = tokenizers["byte fallback"]
    prompt = bf.encode("Hello", add_special_tokens=False)
    output = bf.encode("Hello world 你好", add_special_tokens=False)[len(prompt) :]
    streamed, last = run_choice(bf, prompt, output)
    assert streamed == " world 你好" and bf.decode(output) == "world 你好"
    assert not last.detokenize_mismatch and warnings_of_the_check(caplog) == []


# ---- a broken detokenizer: caught -----------------------------------------------------------------


class DropsACharacter(IncrementalDetokenizer):
    """Loses the last character of its third non-empty delta."""

    num_texts = 0

    def add_tokens(self, new_token_ids):
        out = super().add_tokens(new_token_ids)
        if out.text:
            self.num_texts += 1
            if self.num_texts == 3:
                return DetokenizerOutput(out.text[:-1], out.stop_hit)
        return out


class RepeatsTheTail(IncrementalDetokenizer):
    """Streams what `flush` releases twice."""

    def flush(self):
        tail = super().flush()
        return tail + tail


class SwapsAByteCharacter(IncrementalDetokenizer):
    """Streams U+FFFD in place of the first non-ASCII character, as a bad join of bytes would."""

    swapped = False

    def add_tokens(self, new_token_ids):
        out = super().add_tokens(new_token_ids)
        if not self.swapped and out.text and not out.text.isascii():
            self.swapped = True
            return DetokenizerOutput("\ufffd" + out.text[1:], out.stop_hit)
        return out


@pytest.mark.parametrize("broken", [DropsACharacter, RepeatsTheTail, SwapsAByteCharacter])
def test_a_broken_detokenizer_is_caught_and_logged_with_both_texts(tokenizer, broken, caplog):
    text = "你好 🙂 end"
    ids = tokenizer.encode(text, add_special_tokens=False)
    if broken is RepeatsTheTail:  # something for flush to release: a character cut at the end
        vocab = tokenizer.get_vocab()
        ids.append(vocab.get("<0xF0>") or vocab[chr(0xF0)])  # byte-fallback or byte-level: a lone F0
    reference = "".join(run_choice(tokenizer, [], ids)[0])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=CHECK_LOGGER):
        streamed, last = run_choice(tokenizer, [], ids, detokenizer_class=broken)
    assert streamed != reference and last.detokenize_mismatch
    (message,) = warnings_of_the_check(caplog)
    assert REQUEST_ID in message and "choice 0" in message
    assert repr(streamed) in message and repr(reference) in message


def test_the_log_line_shows_the_texts_around_the_first_difference(tokenizers, caplog):
    tokenizer = tokenizers["default model"]
    text = " ".join(TEXTS) * 40  # about 5000 characters
    ids = tokenizer.encode(text, add_special_tokens=False)

    class DropsLate(IncrementalDetokenizer):
        num_texts = 0

        def add_tokens(self, new_token_ids):
            out = super().add_tokens(new_token_ids)
            self.num_texts += bool(out.text)
            return DetokenizerOutput(out.text[1:], out.stop_hit) if self.num_texts == 700 and out.text else out

    with caplog.at_level(logging.WARNING, logger=CHECK_LOGGER):
        streamed, last = run_choice(tokenizer, [], ids, detokenizer_class=DropsLate)
    assert last.detokenize_mismatch
    (message,) = warnings_of_the_check(caplog)
    at = next(i for i, (a, b) in enumerate(zip(streamed, text, strict=False)) if a != b)
    assert f"at character {at}" in message
    assert len(message) < 4 * SHOWN_CHARS + 200  # two excerpts, not two 5000-character texts
    assert repr(text[at - 10 : at + 10])[1:-1] in message and repr(streamed[at - 10 : at + 10])[1:-1] in message
    assert f"({len(text)} chars)" in message and f"({len(streamed)} chars)" in message
