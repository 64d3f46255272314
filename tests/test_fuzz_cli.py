"""Fuzz every ``grpo-tune`` command in-process (cli.main.main, the console script's error boundary, inside
typer's CliRunner isolation) with hostile values for its options and input files (issue 14).

The invariant, for every case:
- exit status 0, 1 or 2, and never INTERNAL_ERROR (a bug) nor a traceback;
- every exit 2 carries a ``[CODE] message`` line and a ``hint:`` line, a usage error included (a value of
  the wrong type, an unknown or missing option: ``[USAGE]``; see docs/reliability.md, "What bad input gets");
- no input file changed (checksums before and after) and nothing new written next to the inputs;
- each case ends within CASE_LIMIT_S (a SIGALRM turns a hang into a failure).

Commands that would start real work on good input (train, profile, probe-hardware) only get inputs
that are refused before anything starts. ~30 s in CI; ``pytest --hypothesis-profile=long
tests/test_fuzz_cli.py`` runs many more cases.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from _hostile import within
from grpo_tune.cli.main import app, main

CASE_LIMIT_S = 60
# The CI profile runs a few cases per command; --hypothesis-profile=long (tests/conftest.py) many.
N = 100 if settings.default.max_examples <= 100 else settings.default.max_examples
FUZZ = settings(
    max_examples=N,
    deadline=None,
    derandomize=N <= 100,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

LAUGHS = (
    "\n".join(
        ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        + [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    )
    + "\n"
)
FILES: dict[str, bytes] = {
    "empty.yaml": b"",
    "binary.toml": bytes(range(256)) * 4,
    "binary.json": b"\x00\xff\xfe" * 100,
    "laughs.yaml": LAUGHS.encode(),
    "deep.yaml": b"[" * 3000 + b"]" * 3000,
    "deep.json": b"[" * 3000 + b"]" * 3000,
    "list.json": b"[]",
    "null.json": b"null",
    "inf.json": b'{"architectures": ["LlamaForCausalLM"], "num_attention_heads": Infinity}',
    "neg.json": b'{"architectures": ["LlamaForCausalLM"], "num_attention_heads": -8, "hidden_size": 64, '
    b'"num_hidden_layers": 2, "vocab_size": 10}',
    "crlf.sh": b"#!/bin/bash\r\npython3 -m verl.trainer.main_ppo \\\r\n  data.train_batch_size=8\r\n",
    "inject.sh": b"#!/bin/bash\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$(touch pwned) "
    b"actor_rollout_ref.model.path='$(touch pwned)' ${A:-${B:-${C:-2}}}=1 x=$((1/0))\n",
    "fullwidth.txt": "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=\uff14\n".encode(),
    "dupes.yaml": b"schema_version: 1\nschema_version: 2\nstrategy: {tp: 0}\n",
    "junk_config.yaml": b"schema_version: 1\nmodel: tiny\nhardware: cpu\ncluster: {gpus: 0}\nstrategy: {tp: -1}\n",
    "nan.csv": b"id,gpus,tp\nx,nan,0\n",
    "header.csv": b"id,gpus,tp,pp\n",
    "big.sh": b"#!/bin/bash\n" + b"x" * (5 * 1024 * 1024),
    "long_line.txt": b"a.b=" + b"1" * (2 * 1024 * 1024) + b"\n",
    "unicode\u202e.yaml": b"model: \xe2\x80\xae\n",
    "spaces and 'quotes' $(x).yaml": b"schema_version: 1\n",
    "cal_nan.json": b'{"version": 1, "params": {"compute_efficiency_scale": NaN}}',
    "cal_types.json": b'{"version": 1, "params": {"compute_efficiency_scale": "0.5", "rollout_overhead_s": [1]}}',
    "cal_deep.json": b'{"version": 1, "params": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "cal_huge.json": b'{"version": 1, "pad": "' + b"x" * (2 * 1024 * 1024) + b'"}',
    "grpo_inf.csv": b"id,split,framework,backend,source,model,hardware,gpus,step_s\n"
    b"x,holdout,verl,megatron,s,tiny,cpu,inf,inf\n",
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    for name, data in FILES.items():
        (d / name).write_bytes(data)
    os.mkfifo(d / "fifo.yaml")
    (d / "folder.yaml").mkdir()
    for kind in ("models", "hardware"):  # a $GRPO_TUNE_PROFILES folder of hostile profiles
        (d / "profiles" / kind).mkdir(parents=True)
        for name in ("binary.toml", "laughs.yaml", "deep.yaml", "empty.yaml", "junk_config.yaml"):
            (d / "profiles" / kind / (Path(name).stem + ".toml")).write_bytes(FILES[name])
    return d


def _snapshot(d: Path) -> dict[str, str]:
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and not p.is_fifo():
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[p.name] = "fifo" if p.is_fifo() else "dir"
    return out


runner = CliRunner()


def check(argv: list[str], inputs: Path, cwd: Path) -> int:
    before = _snapshot(inputs)
    old = os.getcwd()
    os.chdir(cwd)  # relative outputs land in a scratch folder
    try:
        with within(CASE_LIMIT_S), runner.isolation() as (out, err, _):
            exit_status = main(argv)  # what the console script runs: the one error boundary
            sys.stdout.flush()
            sys.stderr.flush()
            text = out.getvalue().decode(errors="replace") + err.getvalue().decode(errors="replace")
    finally:
        os.chdir(old)
    assert "still running after" not in text, (argv, text[-2000:])  # within()'s TimeoutError
    assert "Traceback" not in text, (argv, text[-2000:])
    assert "[INTERNAL_ERROR]" not in text, (argv, text[-2000:])
    assert exit_status in (0, 1, 2), (argv, exit_status, text[-2000:])
    if exit_status == 2:
        assert re.search(r"^\[[A-Z_]+\] ", text, re.M) and re.search(r"^hint: ", text, re.M), (argv, text[-2000:])
    assert _snapshot(inputs) == before, argv  # no input changed, nothing written beside them
    assert not (cwd / "pwned").exists() and not (inputs / "pwned").exists()
    return exit_status


INTS = st.sampled_from(
    ["0", "-1", "1", "3", "7", "1000000000", "99999999999999999999", "abc", "1e3", "\uff14", "2.5", ""]
)
FLOATS = st.sampled_from(["nan", "inf", "-inf", "-0.5", "0", "1", "1.5", "1e-300", "abc", "0.6"])
TEXT = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "../../etc/passwd",
            "a\nb",
            "$(touch pwned)",
            "\x1b[31mred",
            "tiny",
            "qwen2-7b",
            "cpu",
            "h100",
            "-1",
            "--help",
        ]
    ),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
)


def _file(inputs: Path):
    return st.sampled_from(sorted([*FILES, "fifo.yaml", "folder.yaml", "missing.yaml"])).map(lambda n: str(inputs / n))


def _opts(draw, table: dict[str, st.SearchStrategy], k: int) -> list[str]:
    names = draw(st.lists(st.sampled_from(sorted(table)), max_size=k, unique=True))
    out: list[str] = []
    for n in names:
        v = draw(table[n])
        out += [n] if v is True else [f"{n}={v}"]
    return out


PLAN = {
    "--gpus": INTS,
    "--gpus-per-node": INTS,
    "--tp": INTS,
    "--pp": INTS,
    "--vpp": INTS,
    "--cp": INTS,
    "--ep": INTS,
    "--mbs": INTS,
    "--rollout-tp": INTS,
    "--gpu-memory-utilization": FLOATS,
    "--max-tokens-per-gpu": INTS,
    "--prompts": INTS,
    "--mini-batch": INTS,
    "--n": INTS,
    "--prompt-len": INTS,
    "--response-len": INTS,
    "--recompute": TEXT,
    "--offload": TEXT,
    "--hardware": TEXT,
    "--first-stage-layers": INTS,
    "--cpu-optimizer": FLOATS,
    "--max-num-seqs": INTS,
    "--calibration": None,  # a hostile file (drawn in _plan_opts)
    "--lengths": None,
}


def _plan_opts(draw, inputs: Path, k: int) -> list[str]:
    table = {n: (v if v is not None else _file(inputs)) for n, v in PLAN.items()}
    return _opts(draw, table, k)


@FUZZ
@given(data=st.data(), cmd=st.sampled_from(["estimate", "search", "compare"]))
def test_plan_commands(inputs, tmp_path, data, cmd):
    model = data.draw(st.one_of(TEXT, _file(inputs), st.just("tiny")))
    argv = [cmd, "--model", model] + _plan_opts(data.draw, inputs, 4)
    if cmd != "estimate" and "--gpus" not in " ".join(argv):
        argv += ["--gpus", "2"]
    if "--hardware" not in " ".join(argv):
        argv += ["--hardware", data.draw(st.one_of(st.just("cpu"), _file(inputs)))]
    check(argv, inputs, tmp_path)


@FUZZ
@given(data=st.data())
def test_diagnose(inputs, tmp_path, data):
    argv = ["diagnose", data.draw(_file(inputs))] + _opts(
        data.draw, {"--model": TEXT, "--hardware": TEXT, "--json": st.just(True)}, 2
    )
    check(argv, inputs, tmp_path)


def _fuzz_one_of(data, inputs: Path, tmp_path: Path, cases: dict[str, Callable[[str], list[str]]]) -> None:
    """Draw an input file and one of ``cases`` (name -> the argv it builds around that file); check() it."""
    f = data.draw(_file(inputs))
    which = data.draw(st.sampled_from(list(cases)))
    check(cases[which](f), inputs, tmp_path)


@FUZZ
@given(data=st.data())
def test_validate_tune_calibrate(inputs, tmp_path, data):
    def calibrate(f: str) -> list[str]:
        # --out is a scratch file, or one of the inputs (it must never be written over)
        out = data.draw(st.one_of(st.just(str(tmp_path / "c.json")), st.just(f), _file(inputs)))
        return ["calibrate", "--from-log", f, "--launch", data.draw(_file(inputs)), "--out", out]

    tune_opts = {"--model": TEXT, "--hardware": TEXT, "--keep": INTS, "--calibration": _file(inputs), "--tp": INTS}
    cases = {
        "validate": lambda f: (
            ["validate", "--data", f] + _opts(data.draw, {"--tolerance": FLOATS, "--hardware": TEXT}, 2)
        ),
        "validate_grpo": lambda f: (
            ["validate", "--grpo", "--data", f] + _opts(data.draw, {"--tolerance": FLOATS, "--refit": st.just(True)}, 1)
        ),
        "tune": lambda f: ["tune", f, "--out", str(tmp_path / "o")] + _opts(data.draw, tune_opts, 2),
        "calibrate": calibrate,
    }
    _fuzz_one_of(data, inputs, tmp_path, cases)


@FUZZ
@given(data=st.data())
def test_commands_that_would_start_work_refuse_first(inputs, tmp_path, data):
    """train/profile/probe-hardware with inputs that must be refused before any process starts."""

    def f_or_another(f: str) -> str:
        return data.draw(st.one_of(st.just(f), _file(inputs)))

    def probe(f: str) -> list[str]:
        # never a writable .toml path: that is a good --out, and the probe would really run
        bad = [str(inputs / "folder.yaml"), str(inputs / "nowhere" / "x.toml"), str(inputs / "x.txt")]
        bad_out = data.draw(st.sampled_from(bad + ([f] if not f.endswith(".toml") else [])))
        return ["probe-hardware", "--out", bad_out] + _opts(data.draw, {"--name": TEXT, "--nproc": INTS}, 1)

    train_opts = {"--steps": INTS, "--nnodes": INTS, "--node-rank": INTS, "--out": TEXT}
    cases = {
        "train": lambda f: ["train", "--config", f, "--dry-run"] + _opts(data.draw, train_opts, 2),
        "slurm": lambda f: ["train", "--config", f, "--slurm", f_or_another(f)],
        "profile": lambda f: ["profile", "--config", f, "--json", f_or_another(f), "--steps", "1"],
        "probe": probe,
    }
    _fuzz_one_of(data, inputs, tmp_path, cases)


def test_every_command_is_fuzzed():
    names = set(typer.main.get_command(app).commands)
    covered = {
        "estimate",
        "search",
        "compare",
        "diagnose",
        "validate",
        "tune",
        "calibrate",
        "train",
        "profile",
        "probe-hardware",
        "models",
        "hardware",
    }
    assert names <= covered, names - covered


@pytest.mark.parametrize(
    "argv",
    [
        ["models", "--json"],
        ["hardware", "--json"],
        ["models"],
        ["hardware"],
        ["estimate", "--model", "qwen2-7b", "--hardware", "h100"],
        ["search", "--model", "tiny", "--gpus", "2", "--hardware", "cpu", "--prompt-len", "64", "--response-len", "64"],
    ],
)
def test_catalog_with_a_hostile_profiles_folder(inputs, tmp_path, monkeypatch, argv):
    """Unreadable files in $GRPO_TUNE_PROFILES are skipped with a warning: they break no other command."""
    monkeypatch.setenv("GRPO_TUNE_PROFILES", str(inputs / "profiles"))
    assert check([*argv, *(["--out", str(tmp_path / "runs")] if argv[0] == "search" else [])], inputs, tmp_path) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "--gpus", "abc", "--model", "tiny"],
        ["estimate", "--bogus", "1"],
        ["estimate"],
        ["no-such-command"],
        [],
    ],
)
def test_usage_errors_are_coded(argv, capsys):
    """A command line click cannot parse gets [USAGE], the click message and a hint naming the command."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    cmd = " ".join(["grpo-tune", *argv[:1]]) if argv and argv[0] != "no-such-command" else "grpo-tune"
    assert re.search(rf"^\[USAGE\] {cmd}: ", err, re.M), err
    assert f"hint: run `{cmd} --help`" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("flag", ["--check-parallel", "--check-memory", "--check-data-types"])
def test_the_articles_diagnose_flags_point_to_the_real_check(flag, capsys):
    """The flags of the scripts/diagnose.py that articles on verl describe (verl's own has none of them) are
    recognised: grpo-tune diagnose runs every check at once, and says so."""
    assert main(["diagnose", flag, "launch.sh"]) == 2
    err = capsys.readouterr().err
    assert f"[USAGE] grpo-tune diagnose has no {flag}: it runs every check at once" in err, err
    assert "hint: run `grpo-tune diagnose SCRIPT`" in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "--model", "7b", "--gpus", "12"],  # 8 per node by default: verl would start 2 x 8
        ["estimate", "--model", "7b", "--gpus", "16", "--gpus-per-node", "3"],
        ["compare", "--model", "7b", "--gpus", "12", "--hardware", "h100,h200"],
    ],
)
def test_a_gpu_count_that_is_not_whole_nodes_is_refused(argv, capsys):
    """torchrun, Slurm and verl start the same number of ranks on every node: 12 GPUs at 8 per node used to be
    priced as 12 and emitted as trainer.nnodes=2 x n_gpus_per_node=8, a 16-GPU launch."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"^\[BAD_CONFIG\] \d+ GPUs are not a whole number of \d+-GPU nodes", err, re.M), err
    assert "Traceback" not in err


def test_whole_nodes_and_one_partial_node_are_clusters():
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.core.strategy import Cluster

    assert Cluster(gpus=7, gpus_per_node=8).nnodes == 1  # one node, 7 of its GPUs
    assert Cluster(gpus=12, gpus_per_node=6).nnodes == 2
    with pytest.raises(ConfigError, match="12 GPUs are not a whole number of 8-GPU nodes") as ei:
        Cluster(gpus=12, gpus_per_node=8)
    assert (ei.value.hint or "").startswith("use 8 or 16 GPUs (8 per node), or 6 per node (2 nodes of 6)")


def test_validate_grpo_refuses_a_hardware_it_would_ignore(capsys):
    """The GRPO rows name their own GPUs: --hardware (the pretraining rows' profile) is refused, not dropped."""
    assert main(["validate", "--grpo", "--hardware", "h100"]) == 2
    err = capsys.readouterr().err
    assert "[USAGE] validate --grpo takes no --hardware" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--model", "7b", "--gpus", "8"],
        ["estimate", "--model", "7b", "--gpus", "8", "--placement", "separate", "--rollout-gpus", "4"],
        ["compare", "--model", "7b", "--gpus", "8", "--hardware", "h100", "--placement", "separate"],
        ["search", "--model", "7b", "--gpus", "8", "--placement", "auto"],
        ["tune", "launch.sh"],
    ],
)
def test_a_negative_staleness_is_refused_by_every_command(argv, capsys):
    """``--staleness -1`` was priced as if on-policy by estimate with --placement separate; every command that
    takes the placement options refuses it the same way, before any work."""
    assert main([*argv, "--staleness", "-1"]) == 2
    err = capsys.readouterr().err
    assert "[BAD_CONFIG] --staleness must be an integer >= 0, got -1" in err, err
