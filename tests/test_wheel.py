"""The wheel installs one top-level import package, ``grpo_tune``, plus the ``grpo-tune`` console script.

Built with ``pip wheel . --no-deps`` from this checkout, as a user's pip would build it. Slow group (a wheel
build, and for the second test a fresh venv with the runtime dependencies from the registry: about a minute
with a warm pip cache): ``pytest -m slow tests/test_wheel.py``.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # from a copy: setuptools builds in ./build, and a stale build/ in the checkout would leak removed modules
    src = tmp_path_factory.mktemp("src") / "grpo-tune"
    skip = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "runs")
    shutil.copytree(ROOT, src, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
        timeout=600,
    )
    (whl,) = out.glob("grpo_tune-*.whl")
    return whl


def top_level_names(whl: Path) -> set[str]:
    """What installing ``whl`` adds to site-packages' top level, dist-info aside."""
    with zipfile.ZipFile(whl) as z:
        names = {n.split("/")[0] for n in z.namelist()}
    return {n.removesuffix(".py") for n in names if not n.endswith((".dist-info", ".data"))}


def test_the_wheel_adds_only_grpo_tune(wheel):
    assert top_level_names(wheel) == {"grpo_tune"}
    with zipfile.ZipFile(wheel) as z:
        (ep,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        scripts = configparser.ConfigParser()
        scripts.read_string(z.read(ep).decode())
        data = {n for n in z.namelist() if "/data/" in n}
    assert dict(scripts["console_scripts"]) == {"grpo-tune": "grpo_tune.cli.main:run"}
    # the package data the commands read travels with it (key snapshots, flag lists, profiles)
    assert "grpo_tune/frameworks/verl/data/verl-0.9.1-keys.json" in data
    assert "grpo_tune/frameworks/megatron_lm/data/megatron-lm-arguments-flags.txt" in data


def test_the_checker_sees_a_stray_top_level_module(tmp_path):
    whl = tmp_path / "x-0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for n in ("grpo_tune/__init__.py", "core/__init__.py", "util.py", "x-0.dist-info/RECORD"):
            z.writestr(n, "")
    assert top_level_names(whl) == {"grpo_tune", "core", "util"}


def test_the_installed_wheel_runs_a_search(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=900)
    files = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print('\\n'.join(str(f) for f in m.files('grpo-tune')))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # not this checkout, whose grpo_tune.egg-info would answer for the editable install
    ).stdout.split()
    installed = {f.split("/")[0] for f in files if not f.startswith("..")}  # `../../bin/grpo-tune`: the script
    assert {n for n in installed if not n.endswith(".dist-info")} == {"grpo_tune"}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    runs = tmp_path / "runs"
    cmd = [str(venv / "bin" / "grpo-tune"), "search", "--model", "7b", "--gpus", "8", "--json", "--out", str(runs)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    json.loads(run.stdout)
    (folder,) = runs.iterdir()
    assert {"best.yaml", "verl.sh", "megatron_args.txt", "report.md"} <= {p.name for p in folder.iterdir()}
    where = subprocess.run(
        [str(py), "-c", "import grpo_tune; print(grpo_tune.__file__)"], capture_output=True, text=True, cwd=tmp_path
    ).stdout
    assert where.startswith(str(venv))  # the installed copy ran, not this checkout
