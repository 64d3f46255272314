"""The ASCII tokenizer for tiny models and the tokenizer.json wrapper."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.specs import load_model
from grpo_tune.trainer.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer


def test_char_tokenizer_round_trip_and_specials():
    tok = CharTokenizer()
    text = "Q: 3+4=?\n#### 7\t{}"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("A0") == [65, 48]
    ids = tok.encode_prompt("7=")
    assert ids == [tok.bos_id, 55, 61]
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == "7="
    assert len({tok.pad_id, tok.bos_id, tok.eos_id}) == 3
    assert tok.encode("é€") == [63, 63]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=50))
def test_char_tokenizer_ids_fit_the_tiny_vocab(text):
    tok = CharTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text) and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.vocab_size <= load_model("tiny").vocab


def test_load_tokenizer_for_presets():
    assert isinstance(load_tokenizer(load_model("tiny")), CharTokenizer)
    small = load_model("tiny").__class__(**{**load_model("tiny").to_dict(), "vocab": 64})
    with pytest.raises(GrpoTuneError):
        load_tokenizer(small)
    with pytest.raises(GrpoTuneError):
        load_tokenizer(load_model("tiny"), hf_checkpoint="/no/such/folder")


def _write_hf(folder, config):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "<s>": 1, "hello": 2, "world": 3, "[UNK]": 4, "7": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def test_hf_tokenizer_specials_from_tokenizer_config(tmp_path):
    _write_hf(tmp_path / "a", {"bos_token": {"content": "<s>"}, "eos_token": "<|endoftext|>", "pad_token": None})
    tok = load_tokenizer(load_model("tiny"), hf_checkpoint=str(tmp_path / "a"))
    assert isinstance(tok, HFTokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 0, 0, 6)  # pad falls back to eos
    assert tok.encode("hello world 7") == [2, 3, 5]
    assert tok.encode_prompt("hello") == [1, 2]
    assert tok.decode([1, 2, 3, 0]) == "hello world"


def test_hf_tokenizer_eos_from_generation_config_and_no_bos(tmp_path):
    _write_hf(tmp_path / "b", {})
    (tmp_path / "b" / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 0]}))
    tok = HFTokenizer(tmp_path / "b" / "tokenizer.json")
    assert tok.bos_id is None and tok.eos_id == 5 and tok.encode_prompt("hello") == [2]


def test_hf_tokenizer_bigger_than_the_model_is_rejected(tmp_path):
    _write_hf(tmp_path / "c", {"eos_token": "<|endoftext|>"})
    tiny = load_model("tiny")
    small = tiny.__class__(**{**tiny.to_dict(), "vocab": 4})
    with pytest.raises(GrpoTuneError):
        load_tokenizer(small, hf_checkpoint=str(tmp_path / "c"))
