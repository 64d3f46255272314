"""Tokenizers: a byte-level ASCII tokenizer for the random-init test models, and a wrapper around
the ``tokenizers`` library for a Hugging Face ``tokenizer.json``.

Both expose ``encode(text) -> list[int]`` (no special tokens), ``encode_prompt(text)`` (BOS first
when the tokenizer has one), ``decode(ids) -> str`` (special tokens dropped), and ``pad_id``,
``eos_id``, ``bos_id`` (may be None for HF tokenizers without one) and ``vocab_size``.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_tune.core.errors import ConfigError, GrpoTuneError, try_import


class CharTokenizer:
    """One id per 7-bit ASCII character: id = ord(c), 128 ids in all.

    Three ASCII control codes double as specials: NUL (0) is padding, STX "start of text" (2) is
    BOS and ETX "end of text" (3) is EOS. A character outside printable ASCII (and not tab or
    newline) encodes as ``?``. An untrained model samples near-uniformly over all 128 ids, so a
    digit turns up with probability ~10/128 per token, which is what lets the synthetic task pay
    some reward by chance.
    """

    pad_id = 0
    bos_id = 2
    eos_id = 3
    vocab_size = 128
    _KEEP = frozenset(range(32, 127)) | {9, 10}

    def encode(self, text: str) -> list[int]:
        return [o if o in self._KEEP else 63 for o in map(ord, text)]

    def encode_prompt(self, text: str) -> list[int]:
        return [self.bos_id, *self.encode(text)]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in map(int, ids) if i in self._KEEP)

    def __repr__(self) -> str:
        return "CharTokenizer(vocab_size=128)"


class HFTokenizer:
    """A ``tokenizer.json`` through the ``tokenizers`` library.

    Special tokens come from ``tokenizer_config.json`` next to it (``bos_token``, ``eos_token``,
    ``pad_token``; strings or ``{"content": ...}``), ``generation_config.json``'s
    ``eos_token_id`` as a fallback for EOS, and PAD falls back to EOS (as verl does).
    """

    def __init__(self, path: str | Path):
        tokenizers = try_import("tokenizers", "train")
        p = Path(path)
        folder = p if p.is_dir() else p.parent
        file = folder / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise GrpoTuneError(
                f"no tokenizer.json at {file}",
                hint="point hf_checkpoint at a Hugging Face model folder",
                code="BAD_CONFIG",
            )
        self.path = file
        self._tok = tokenizers.Tokenizer.from_file(str(file))
        cfg = _read_json(folder / "tokenizer_config.json")
        gen = _read_json(folder / "generation_config.json")
        self.bos_id = self._special(cfg.get("bos_token"))
        self.eos_id = self._special(cfg.get("eos_token"))
        if self.eos_id is None:
            eos = gen.get("eos_token_id")
            self.eos_id = eos[0] if isinstance(eos, list) else eos
        if self.eos_id is None:
            for name in ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|im_end|>", "<eos>"):
                if self._tok.token_to_id(name) is not None:
                    self.eos_id = self._tok.token_to_id(name)
                    break
        if self.eos_id is None:
            raise ConfigError(f"{folder}: cannot tell the EOS token", hint="add eos_token to tokenizer_config.json")
        pad = self._special(cfg.get("pad_token"))
        self.pad_id = self.eos_id if pad is None else pad
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._specials = {i for i in (self.bos_id, self.eos_id, self.pad_id) if i is not None}

    def _special(self, tok) -> int | None:
        if isinstance(tok, dict):
            tok = tok.get("content")
        return None if not tok else self._tok.token_to_id(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        ids = self.encode(text)
        return ids if self.bos_id is None else [self.bos_id, *ids]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids if int(i) not in self._specials], skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def load_tokenizer(model_spec, hf_checkpoint: str | None = None):
    """The tokenizer for a run: the checkpoint's ``tokenizer.json`` when given, else the ASCII
    :class:`CharTokenizer` (random-init models; needs a model vocabulary of at least 128)."""
    if hf_checkpoint:
        p = Path(hf_checkpoint)
        if not p.exists():
            raise ConfigError(f"hf_checkpoint {p} does not exist", hint="give a folder with tokenizer.json")
        tok = HFTokenizer(p)
        if model_spec is not None and tok.vocab_size > model_spec.vocab:
            raise ConfigError(f"{p}: tokenizer has {tok.vocab_size} tokens but the model's vocab is {model_spec.vocab}")
        return tok
    vocab = getattr(model_spec, "vocab", CharTokenizer.vocab_size)
    if vocab < CharTokenizer.vocab_size:
        raise ConfigError(
            f"model vocab {vocab} is smaller than the 128-id ASCII tokenizer",
            hint="use a model with vocab >= 128 or give hf_checkpoint",
        )
    return CharTokenizer()
