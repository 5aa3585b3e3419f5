"""Prompt sources: seeded random prompts (words, or cut to exact tokens by a local tokenizer), JSONL."""

import json

import pytest

from loadtest.prompts import WORDS, PromptSource, load_dataset


def source(**kwargs):
    defaults = dict(endpoint_kind="chat", input_len=30, output_len=8, seed=7)
    return PromptSource(**{**defaults, **kwargs})


def test_random_prompts_are_seeded_and_distinct():
    a, b = source().take(3), source().take(3)
    assert [s.prompt for s in a] == [s.prompt for s in b]
    assert len({s.prompt for s in a}) == 3  # a prefix cache cannot serve one from another
    assert source(seed=8).take(1)[0].prompt != a[0].prompt
    spec = a[0]
    assert spec.input_len == 30 and len(spec.prompt.split()) == 30
    assert set(spec.prompt.split()) <= set(WORDS)
    assert spec.max_tokens == 8 and spec.messages is None


def test_local_tokenizer_sizes_prompts_in_tokens(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    # A tiny character-level vocabulary, so a word is several tokens and counting words would be wrong.
    chars = sorted(set("".join(WORDS)))
    vocab = {"[UNK]": 0, " ": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path)

    specs = source(tokenizer_path=str(tmp_path), input_len=40).take(4)
    for spec in specs:
        assert len(spec.prompt) == 40  # one token per character
        assert spec.input_len == 40


def test_tokenizer_must_be_a_local_folder(tmp_path):
    with pytest.raises(ValueError, match="not a local folder"):
        source(tokenizer_path="HuggingFaceTB/SmolLM2-135M-Instruct")


def test_dataset_lines(tmp_path):
    path = tmp_path / "requests.jsonl"
    lines = [
        {"prompt": "hello there world", "max_tokens": 3},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "model": "sql"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    specs = source(dataset_path=str(path)).take(3)
    assert (specs[0].prompt, specs[0].max_tokens, specs[0].input_len) == ("hello there world", 3, 3)
    assert specs[1].messages[1] == {"role": "user", "content": "hi"} and specs[1].max_tokens == 8
    assert (specs[0].model, specs[1].model) == (None, "sql")  # a line's own model (a LoRA adapter)
    assert specs[2].prompt == "hello there world"  # wraps around
    with pytest.raises(ValueError, match="needs --endpoint chat"):
        load_dataset(str(path), "completions")


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "not JSON"),
        ('{"text": "x"}', "exactly one of"),
        ('{"prompt": "x", "messages": []}', "exactly one of"),
        ('{"prompt": "x", "max_tokens": 0}', "positive integer"),
        ('{"messages": "hi"}', "list of objects"),
    ],
)
def test_dataset_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        load_dataset(str(path), "chat")
    assert ":2:" in str(info.value)
