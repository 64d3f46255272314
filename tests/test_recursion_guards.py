"""Coded errors for recursion and loops wherever a reader recurses. Before, each of these gave [INTERNAL_ERROR]
exit 1: a YAML alias loop (`rec: &r` / `  - *r`) in a recipe, a 5,000-deep `+x.y=[[[...]]]` override, and two log
files linked to each other for `calibrate --from-log`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_tune.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples/nemo-rl-upstream/grpo-qwen3-30ba3b-4n8g.yaml"
DEEP = "+x.y=" + "[" * 5000 + "]" * 5000


def _coded(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "INTERNAL_ERROR" not in err and err.startswith("["), err
    return err


@pytest.mark.parametrize("loop", ["rec: &r\n  - *r\n", "rec: &r\n  a:\n    b: *r\n"])
@pytest.mark.parametrize("cmd", ["diagnose", "tune"])
def test_a_yaml_alias_loop_in_a_recipe_is_a_coded_error(tmp_path, capsys, loop, cmd):
    p = tmp_path / "recipe.yaml"
    p.write_text(RECIPE.read_text().replace("\ngrpo:\n", f"\n{loop}grpo:\n", 1))
    err = _coded(capsys, [cmd, str(p), *(["--no-emit"] if cmd == "tune" else [])])
    assert "[BAD_CONFIG]" in err or "[UNKNOWN_KEY]" in err


def test_the_alias_loop_is_named(tmp_path, capsys):
    p = tmp_path / "recipe.yaml"
    p.write_text(RECIPE.read_text().replace("\ngrpo:\n", "\nrec: &r\n  - *r\ngrpo:\n", 1))
    assert "refers to itself" in _coded(capsys, ["diagnose", str(p)])


def test_a_shared_alias_that_is_no_loop_still_reads(tmp_path):
    from grpo_tune.frameworks.base.inputs import load_yaml

    data, _ = load_yaml("a: &x\n  b: 1\nc: *x\nd: [*x, *x]\n", "t.yaml")
    assert data == {"a": {"b": 1}, "c": {"b": 1}, "d": [{"b": 1}, {"b": 1}]}


def test_a_5000_deep_override_is_a_coded_error(tmp_path, capsys):
    lst = tmp_path / "launch.overrides"
    lst.write_text(f"trainer.nnodes=1\n{DEEP}\n")
    assert "nests lists deeper" in _coded(capsys, ["diagnose", str(lst)])
    assert "nests lists deeper" in _coded(capsys, ["diagnose", str(RECIPE), DEEP])  # a recipe's extra override


def test_a_nested_list_within_the_limit_reads():
    from grpo_tune.frameworks.base.inputs import parse_value

    assert parse_value("[[1]]") == [[1]] and parse_value("[" * 10 + "]" * 10) is not None


def test_two_logs_linked_to_each_other_are_a_coded_error(tmp_path, capsys):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    os.symlink(b, a)
    os.symlink(a, b)
    launch = ROOT / "examples/qwen2-7b-grpo-megatron.sh"
    for log in (a, b):
        err = _coded(
            capsys, ["calibrate", "--from-log", str(log), "--launch", str(launch), "--out", str(tmp_path / "c.json")]
        )
        assert "symbolic links" in err or "loop" in err
    assert not (tmp_path / "c.json").exists()
