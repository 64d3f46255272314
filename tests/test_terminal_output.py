"""Output that survives its terminal: a COLUMNS that is no width (0, 1, junk), TERM=dumb and NO_COLOR print the
whole report; a closed stdout (`>&-`) and a full one (/dev/full) end with a code, never a traceback. Before:
`COLUMNS=0 grpo-tune diagnose` printed 0 bytes, COLUMNS=1 one letter a line, `>&-` an AttributeError traceback
from cli/main.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_tune.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
OOM = ROOT / "examples/broken/oom.sh"
ANSI = re.compile(r"\x1b\[")


def _diagnose(capsys, monkeypatch, **env: str) -> tuple[int, str]:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc = main(["diagnose", str(OOM)])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("columns", ["0", "1", "5", "abc", "-3"])
def test_a_columns_that_is_no_width_prints_the_whole_report(capsys, monkeypatch, columns):
    rc, plain = _diagnose(capsys, monkeypatch, COLUMNS="80")
    rc2, out = _diagnose(capsys, monkeypatch, COLUMNS=columns)
    assert rc == rc2 == 1  # OOM_RISK: an error finding
    assert out == plain and "OOM_RISK" in out and len(out) > 1000
    assert max(len(ln) for ln in out.splitlines()) <= 80


@pytest.mark.parametrize("env", [{"TERM": "dumb"}, {"NO_COLOR": "1"}])
def test_dumb_and_colourless_terminals_print_plain_text(capsys, monkeypatch, env):
    rc, out = _diagnose(capsys, monkeypatch, **env)
    assert rc == 1 and "OOM_RISK" in out and not ANSI.search(out)


def test_tune_at_columns_0_prints_the_diff_and_the_wrote_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "0")
    rc = main(["tune", str(ROOT / "examples/qwen2-7b-grpo-megatron.sh"), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "wrote " in out and re.search(r"^\+ \S+=", out, re.M), out


def _cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "from grpo_tune.cli.main import run; run()"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, timeout=120, check=False, **kw)


def test_a_closed_stdout_is_no_traceback_and_no_file_gets_the_output(tmp_path):
    out = tmp_path / "runs"
    r = _cli(
        ["search", "-m", "7b", "-g", "8", "--out", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.close(1),  # `>&-`
    )
    assert "Traceback" not in r.stderr and "AttributeError" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    best = next(out.rglob("best.yaml"))  # the run folder is written, and none of its files holds stdout's lines
    for f in best.parent.iterdir():
        if f.suffix in (".yaml", ".sh", ".md", ".txt", ".json"):
            assert "wrote " not in f.read_text(errors="replace"), f


def test_a_full_stdout_is_a_coded_error():
    with open("/dev/full", "w") as full:
        r = _cli(["diagnose", str(OOM)], stdout=full, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2 and "[IO_ERROR]" in r.stderr and "Traceback" not in r.stderr, r.stderr
