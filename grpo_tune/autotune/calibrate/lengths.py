"""``--lengths FILE``: prompt and response length statistics for the workload.

Two kinds of file:

- a dataset of prompts (``.jsonl`` or ``.parquet``; ``prompt`` as text or a chat list, as the
  trainer reads them, and optionally a ``response``). Tokens are counted with the model's tokenizer
  when a ``tokenizer.json`` is on disk (the model's folder, or the Hugging Face cache for its
  ``hf_id``; the ``tokenizers`` package, no network), else estimated as characters / 4 (the
  usual rule of thumb for English text with BPE vocabularies; stated in ``lengths_source``);
- the metrics of an earlier run: our ``metrics.jsonl`` (``response_len`` mean per step), or a
  framework's run log whose lines state the mean lengths (verl's file-logger JSONL and console lines, read by
  :meth:`grpo_tune.frameworks.base.Framework.log_lengths` through the registry).

It returns Workload fields; a run log gives per-step means, so its response histogram is that of the per-step
maxima and means is not claimed: only means are set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, TextIO

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import ModelSpec
from grpo_tune.costmodel.lengths import quantiles_from_samples
from grpo_tune.frameworks.base.runlog import json_object

CHARS_PER_TOKEN = 4.0
MAX_RECORDS = 200_000
MAX_LINE_CHARS = 4 << 20
"""A line longer than this is skipped unread: a file without newlines (a weights file given by mistake) was read
whole into memory, ~2 bytes of RSS per byte of file."""


def _lines(fh: TextIO) -> Iterator[str]:
    """At most MAX_RECORDS lines of ``fh``, each at most MAX_LINE_CHARS long (longer ones are skipped)."""
    n = 0
    while n < MAX_RECORDS:
        line = fh.readline(MAX_LINE_CHARS)
        if not line:
            return
        if len(line) >= MAX_LINE_CHARS and not line.endswith("\n"):
            while (rest := fh.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass  # the rest of an over-long line, in bounded pieces
            continue
        n += 1
        yield line


def read_lengths(path: str, *, model: ModelSpec | None, prompt_len: int, response_len: int) -> dict[str, object]:
    """Workload fields (``prompt_len_mean``, ``response_len_mean``, ``response_len_quantiles``,
    ``lengths_source``) from ``path``; a missing or unreadable file is a BAD_CONFIG error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"--lengths: no file {path}", hint="pass a .jsonl/.parquet dataset or a run's metrics/log file"
        )
    steps = _run_metrics(p)
    if steps:
        return _from_run(steps, p, prompt_len, response_len)
    prompts, responses = _dataset(p)
    count, how = _counter(model)
    pl = [count(t) for t in prompts]
    out: dict[str, Any] = {"lengths_source": f"{p} ({len(pl)} prompts, {how})"}
    if pl:
        clipped = [min(x, prompt_len) for x in pl]
        out["prompt_len_mean"] = max(1, round(sum(clipped) / len(clipped)))
    if responses:
        rl = [min(count(t), response_len) for t in responses]
        out["response_len_mean"] = max(1, round(sum(rl) / len(rl)))
        out["response_len_quantiles"] = quantiles_from_samples(rl)
        out["lengths_source"] += f", {len(rl)} responses"
    if not pl and not responses:
        raise ConfigError(
            f"--lengths: {path} has no prompts or length metrics",
            hint="a dataset needs a 'prompt' field; a run log needs response_length/mean",
        )
    return out


_Lengths = tuple[list[float], list[float]]
"""One logged step's response and prompt mean lengths (a log may state one twice: our metrics.jsonl carries its
own ``response_len`` and the same number under verl's name)."""


def _from_run(steps: list[_Lengths], p: Path, prompt_len: int, response_len: int) -> dict[str, Any]:
    def mean_of(vals: list[float]) -> float | None:
        return sum(vals) / len(vals) if vals else None

    out: dict[str, Any] = {"lengths_source": f"{p} (run metrics, {len(steps)} steps)"}
    r = mean_of([v for s in steps for v in s[0]])
    pr = mean_of([v for s in steps for v in s[1]])
    if r is not None:
        out["response_len_mean"] = max(1, min(response_len, round(r)))
    if pr is not None:
        out["prompt_len_mean"] = max(1, min(prompt_len, round(pr)))
    if len(out) == 1:
        raise ConfigError(f"--lengths: {p} has no response_length/mean or prompt_length/mean")
    return out


def _ours(obj: dict[str, object]) -> list[float] | None:
    """Our metrics.jsonl record's response mean (``response_len``); None: not such a record."""
    if not ("response_len" in obj and "step" in obj and "phases_s" in obj):
        return None
    v = obj["response_len"]
    return [float(v)] if isinstance(v, (int, float)) and not isinstance(v, bool) else []


def _step(line: str, obj: dict[str, object] | None) -> _Lengths | None:
    """One line's step lengths: a framework's log line (through the registry), our record, or both; None: neither."""
    from grpo_tune.frameworks import log_lengths

    theirs = log_lengths(line, obj)
    ours = _ours(obj) if obj is not None else None
    if theirs is None and ours is None:
        return None
    t = theirs or {}
    resp = [t["response_len_mean"]] if "response_len_mean" in t else []
    return resp + (ours or []), [t["prompt_len_mean"]] if "prompt_len_mean" in t else []


def _run_metrics(p: Path) -> list[_Lengths]:
    """Per-step lengths if ``p`` is a run log (ours, or a framework's), else []."""
    steps: list[_Lengths] = []
    try:
        with open(p, "r", errors="replace") as fh:
            for line in _lines(fh):
                line = line.strip()
                if not line:
                    continue
                obj = None
                if line.startswith("{"):
                    obj = json_object(line)
                    if obj is None:
                        continue
                if (got := _step(line, obj)) is not None:
                    steps.append(got)
    except (OSError, UnicodeDecodeError):
        return []
    return steps


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list):  # a chat: [{"role", "content"}, ...]
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in x)
    return "" if x is None else str(x)


def _dataset(p: Path) -> tuple[list[str], list[str]]:
    rows: list[dict[str, Any]] = []
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(
                "--lengths: reading .parquet needs pyarrow", hint="pip install pyarrow, or pass .jsonl"
            ) from None
        try:
            rows = pq.read_table(p).slice(0, MAX_RECORDS).to_pylist()
        except Exception as exc:  # noqa: BLE001 - any parquet error is the user's file
            raise ConfigError(f"--lengths: cannot read {p}: {exc}") from None
    else:
        with open(p, "r", errors="replace") as fh:
            for line in _lines(fh):
                obj = json_object(line)
                if obj is not None:
                    rows.append(obj)
    prompts = [_text(r["prompt"]) for r in rows if "prompt" in r]
    responses = [_text(r.get("response", r.get("completion"))) for r in rows if ("response" in r or "completion" in r)]
    return prompts, responses


def _counter(model: ModelSpec | None):
    tok = _tokenizer(model)
    if tok is not None:
        return (lambda t: len(tok.encode(t).ids)), "counted with the model's tokenizer.json"
    return (
        lambda t: max(1, round(len(t) / CHARS_PER_TOKEN))
    ), f"estimated at {CHARS_PER_TOKEN:g} characters per token (no tokenizer.json on disk)"


def _tokenizer(model: ModelSpec | None):
    if model is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    cands: list[Path] = []
    src = Path(model.source) if model.source else None
    if src is not None and src.name == "config.json":
        cands.append(src.parent / "tokenizer.json")
    if model.hf_id:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(model.hf_id, "tokenizer.json")
            if isinstance(hit, str):
                cands.append(Path(hit))
        except Exception:  # noqa: BLE001 - no hub client or no cache: fall back to the estimate
            pass
    for c in cands:
        if c.is_file():
            try:
                return Tokenizer.from_file(str(c))
            except Exception:  # noqa: BLE001
                continue
    return None
