"""The contract of ``grpo-tune tune`` (issue 38): it changes only what it prices. Over every upstream rendition
shipped in examples/ (verl colocated, one-step-off; NeMo-RL colocated and async), on the GPUs each is written for
and on others where tune does change plans: every key of the user's file that is not a priced
knob is the same in the tuned file, every key that differs is one tune reports, and every other line of a verl
script is byte for byte the user's.

The priced keys come from the frameworks' tables (``retune.priced_keys``, ``nemo_rl.tune.priced_keys``), not from
what tune reports: a tune that rewrote the data files, the reward or the optimizer fails here.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from grpo_tune.cli.main import main
from grpo_tune.frameworks.nemo_rl import recipe as R
from grpo_tune.frameworks.nemo_rl.tune import priced_keys as nemo_priced
from grpo_tune.frameworks.verl.diagnose import parse_script
from grpo_tune.frameworks.verl.launch import read_launch
from grpo_tune.frameworks.verl.retune import SWITCH_KEYS, priced_keys as verl_priced

ROOT = Path(__file__).resolve().parent.parent
VERL = sorted((ROOT / "examples" / "verl-upstream").glob("*.sh"))
NEMO = sorted((ROOT / "examples" / "nemo-rl-upstream").glob("*.yaml"))
CASES = [
    (VERL[0], "h20"),  # the one-step-off recipe (verl's own 4 + 12 H20 run)
    (VERL[1], "h100"),
    (VERL[2], "h20"),
    (VERL[3], "h20"),
    *[(p, hw) for p in NEMO for hw in ("h100", "a100")],
]
"""Every upstream rendition, on the GPUs it is written for (and NeMo-RL's on A100 too, where tune changes both);
the project's own examples/*.sh are tuned the same way in tests/test_tune.py."""


def _tune(path: Path, hw: str, out: Path, *extra: str) -> dict:
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["tune", str(path), "--hardware", hw, "--out", str(out), "--json", "--ignore-unknown", *extra])
    assert rc == 0, err.getvalue()
    return json.loads(buf.getvalue())


def _verl_keys(text: str) -> dict[str, str]:
    ovs, _, _ = parse_script(text)
    return {o.key: f"{o.prefix}{o.raw}" for o in ovs}


def _check_verl(path: Path, tuned: Path, reported: dict) -> None:
    launch = read_launch(path)
    refused = {f.key for f in launch.refused()}  # dropped or renamed with --ignore-unknown, and said so
    before, after = _verl_keys(path.read_text()), _verl_keys(tuned.read_text())
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)} - refused
    renamed = {launch.renames[k] for k in refused if k in launch.renames}
    changed -= renamed
    assert changed <= verl_priced() | set(SWITCH_KEYS), sorted(changed - verl_priced())
    assert changed == set(reported), (sorted(changed), sorted(reported))
    # every line without a changed key is the user's, in order (the header comments tune adds aside)
    touched = changed | refused | renamed

    def rest(text: str) -> list[str]:
        return [
            ln
            for ln in text.splitlines()
            if not ln.startswith("# grpo-tune tune:")
            and not any(k + "=" in ln for k in touched)
            and ln.strip() != "\\"  # what is left of a line whose refused key was dropped
        ]

    assert rest(tuned.read_text()) == rest(path.read_text())


def _check_nemo(path: Path, tuned: Path, reported: dict) -> None:
    a, b = R.load(path), R.load(tuned)
    own = {k for k in b.own if k}  # a file of nothing but defaults: own is {"": {}}
    # tuned.yaml inherits the user's recipe (defaults:) and sets only priced keys, each one reported
    assert own <= nemo_priced(), sorted(own - nemo_priced())
    assert own == set(reported), (sorted(own), sorted(reported))
    keys = set(a.resolved) | set(b.resolved)
    changed = {k for k in keys if a.resolved.get(k) != b.resolved.get(k)}
    # a key tuned.yaml does not set can only differ through NeMo-RL's own interpolations of priced keys
    # (make_sequence_length_divisible_by: ${...tensor_model_parallel_size}, logprob_mb_tokens: ${mul:...})
    for k in changed - own:
        assert k in ("policy.make_sequence_length_divisible_by",) or k.endswith("logprob_mb_tokens"), k
    for k in own:
        assert b.resolved[k] == reported[k]["new"], k


# tune changes plans in these (checked, so that the contract is not checked on unchanged files only)
CHANGES = {
    ("dapo-7b-math-megatron-one-step-off-4-12.sh", "h20"),
    ("qwen2-7b-math-megatron.sh", "h100"),
    ("grpo-qwen3-30ba3b-4n8g-async-1off.yaml", "a100"),
    ("grpo-qwen3-30ba3b-4n8g.yaml", "a100"),
}


@pytest.mark.parametrize("path,hw", CASES, ids=[f"{p.name}-{hw}" for p, hw in CASES])
def test_tune_changes_only_the_keys_it_prices(tmp_path, path, hw):
    d = _tune(path, hw, tmp_path)
    files = d["files"]
    tuned = Path(files.get("tuned.sh") or files["tuned.yaml"])
    assert tuned.parent == Path(d["run_dir"])
    (_check_verl if path.suffix == ".sh" else _check_nemo)(path, tuned, d["overrides"])
    if (path.name, hw) in CHANGES:
        assert d["overrides"], "tune changes this plan"
