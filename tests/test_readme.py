"""The README is for users: it opens with the two commands, keeps the development record in docs/, shows the
search as it prints today (realistic, stated lengths; a table within 80 columns), and names no commit or
issue."""

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


def test_user_sections_come_first_and_the_record_is_in_docs():
    heads = [ln[3:] for ln in README.splitlines() if ln.startswith("## ")]
    want = ["CPU quick start", "For verl users", "Commands", "What bad input gets", "Architecture", "More"]
    assert [h for h in heads if h in want] == want, heads  # in this order (other "For X users" may join)
    assert all(h in want or (h.startswith("For ") and h.endswith(" users")) for h in heads), heads
    for link in re.findall(r"\]\((docs/[\w.-]+\.md)\)", README):
        assert (ROOT / link).is_file(), link
    assert {"docs/design.md", "docs/measurements.md", "docs/verl.md"} <= set(re.findall(r"\((docs/[\w.-]+)\)", README))
    assert len(README.splitlines()) < 300  # was 938 lines of development log
    arch = README.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    assert len(arch.strip().splitlines()) <= 14


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
