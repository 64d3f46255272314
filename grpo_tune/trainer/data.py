"""Prompt datasets (JSONL, Parquet, or the shipped synthetic task) and a resumable prompt stream.

A record needs a prompt and an answer. Accepted field names: ``prompt`` (a string, or a chat list
``[{"role": ..., "content": ...}]`` whose contents are joined, as in verl's parquet files) or
``question``; ``answer`` or ``reward_model.ground_truth`` (verl) or ``ground_truth``.

The synthetic tasks (``load_dataset("synthetic")`` is ``synthetic:copy``), graded by the ``math``
reward (the last number in the response must equal the answer):

* ``copy``: the prompt is ``d=`` for a digit d, the answer is d.
* ``sum``: the prompt is ``a+b=``, the answer the one-digit sum; sums are uniform over 0..9.

Why these: an untrained ``tiny`` model samples near-uniformly from the 128 ASCII ids, so a short
response ends in the right digit by chance (about 2.5% of 4-token responses, 4% of 8-token ones:
a digit must turn up, be the last number and be the right one; tests/test_trainer_data.py checks
the exact figure), so most steps hold a rewarded response in some group and GRPO has signal
from the start. No fixed answer pays more than ~10%, so reward above that needs the prompt.
What was seen on this 2-core machine: the real trainer (tiny, megatron sampler, 16 prompts x 8,
4 response tokens, lr 3e-3, no KL; tests/test_trainer_learning.py) went from a mean reward of 0.043
over steps 1-20 to 0.198 over steps 61-80 on ``copy`` (about a minute); a plain-torch model
(tests/test_trainer_grpo.py) from ~0.03 to ~0.15-0.18 in 100 steps. ``sum`` learns far slower
(a plain-torch model of tiny's shape: ~14% after 300 steps, mostly the single-digit format), so it
is the harder option, not the one to show learning in minutes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from grpo_tune.core.config import is_synthetic
from grpo_tune.core.errors import ConfigError, GrpoTuneError, try_import

SYNTHETIC_TASKS = ("copy", "sum")


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


def synthetic_examples(n: int, seed: int = 0, *, task: str = "copy") -> list[Example]:
    """``n`` examples of the synthetic task, reproducible from ``seed`` (see module doc)."""
    if task not in SYNTHETIC_TASKS:
        raise ConfigError(f"unknown synthetic task {task!r}", hint=f"choose one of: {', '.join(SYNTHETIC_TASKS)}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if task == "copy":
            d = rng.randrange(10)
            out.append(Example(f"{d}=", str(d)))
        else:
            s = rng.randrange(10)  # the answer is uniform over 0..9, so no single guess pays more than ~10%
            a = rng.randrange(s + 1)
            out.append(Example(f"{a}+{s - a}=", str(s)))
    return out


def write_synthetic(path: str | Path, n: int, seed: int = 0, *, task: str = "copy") -> Path:
    """Write the synthetic task as JSONL with ``prompt`` and ``answer`` fields."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w") as fh:
        for ex in synthetic_examples(n, seed, task=task):
            fh.write(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n")
    return p


def _prompt_of(rec: dict, prompt_key: str) -> str | None:
    v = rec.get(prompt_key, rec.get("question"))
    if isinstance(v, list):  # chat format: join the messages' text
        parts = [m.get("content", "") for m in v if isinstance(m, dict)]
        return "\n".join(str(p) for p in parts) if parts else None
    return None if v is None else str(v)


def _answer_of(rec: dict, answer_key: str) -> str | None:
    v = rec.get(answer_key)
    if v is None and isinstance(rec.get("reward_model"), dict):
        v = rec["reward_model"].get("ground_truth")
    if v is None:
        v = rec.get("ground_truth")
    return None if v is None else str(v)


def _records_to_examples(records, where: str, prompt_key: str, answer_key: str) -> list[Example]:
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ConfigError(f"{where}: record {i + 1} is not an object")
        prompt, answer = _prompt_of(rec, prompt_key), _answer_of(rec, answer_key)
        if prompt is None or answer is None:
            missing = prompt_key if prompt is None else answer_key
            raise ConfigError(
                f"{where}: record {i + 1} has no {missing!r} field", hint=f"fields found: {', '.join(map(str, rec))}"
            )
        out.append(Example(prompt, answer))
    if not out:
        raise ConfigError(f"{where}: the dataset is empty")
    return out


def load_dataset(
    spec: str, *, n: int = 1024, seed: int = 0, prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[Example]:
    """``synthetic`` (= ``synthetic:copy``) / ``synthetic:sum`` (``n`` examples from ``seed``), or a ``.jsonl`` / ``.parquet`` file.

    A missing file raises the coded MISSING_DATASET error; malformed records raise BAD_CONFIG.
    """
    if is_synthetic(spec):
        return synthetic_examples(n, seed, task=spec.partition(":")[2] or "copy")
    p = Path(spec)
    if not p.is_file():
        raise GrpoTuneError(
            f"dataset {spec!r} does not exist",
            code="MISSING_DATASET",
            hint="give a .jsonl/.parquet file with prompt and answer fields, or 'synthetic'",
        )
    suffix = "".join(p.suffixes[-1:]).lower()
    if suffix in (".jsonl", ".json"):
        records = []
        with p.open() as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except ValueError as exc:
                    raise ConfigError(f"{p}:{lineno}: not valid JSON ({exc})") from None
        return _records_to_examples(records, str(p), prompt_key, answer_key)
    if suffix == ".parquet":
        pq = try_import("pyarrow.parquet", "train")
        try:
            records = pq.read_table(p).to_pylist()
        except Exception as exc:  # pyarrow raises its own hierarchy for corrupt files
            raise ConfigError(f"{p}: cannot read parquet ({exc})") from None
        return _records_to_examples(records, str(p), prompt_key, answer_key)
    raise ConfigError(f"dataset {p}: unknown file type {suffix!r}", hint="use .jsonl or .parquet")


class PromptStream:
    """Batches of examples in a seeded shuffled order, epoch after epoch, with resumable state.

    Epoch e visits ``examples`` in ``random.Random(f"{seed}:{e}")``'s shuffle; ``state_dict()``
    is ``{"epoch", "index"}`` and ``load_state_dict`` continues exactly where it was saved.
    """

    def __init__(self, examples: list[Example], batch_size: int, seed: int = 0):
        if not examples:
            raise ConfigError("the dataset is empty")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self.epoch, self.index = 0, 0
        self._order = self._perm(0)

    def _perm(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[Example]:
        out = []
        while len(out) < self.batch_size:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._perm(self.epoch)
            take = min(self.batch_size - len(out), len(self._order) - self.index)
            out += [self.examples[i] for i in self._order[self.index : self.index + take]]
            self.index += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._perm(self.epoch)
