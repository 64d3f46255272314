"""A hardware profile whose reserved memory is not below its HBM is refused at load (fix pass 1):
it used to give a zero or negative capacity and price every plan against it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from grpo_tune.cli.main import main as cli_main
from grpo_tune.core import tomlwrite
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import HardwareSpec, load_hardware

H100 = Path(__file__).resolve().parent.parent / "grpo_tune" / "profiles" / "hardware" / "h100-sxm-80gb.toml"


def _h100_with(tmp_path: Path, **kw: float) -> Path:
    data = tomllib.loads(H100.read_text())
    data.update(kw)
    p = tmp_path / "hw.toml"
    p.write_text(tomlwrite.dumps(data))
    return p


@pytest.mark.parametrize("factor", [1.0, 1.5])
def test_reserved_not_below_hbm_refused(tmp_path, factor):
    hbm = load_hardware("h100").hbm_bytes
    p = _h100_with(tmp_path, reserved_memory_bytes=hbm * factor)
    with pytest.raises(ConfigError) as e:
        load_hardware(str(p))
    assert e.value.code == "BAD_CONFIG" and "reserved_memory_bytes" in str(e.value) and e.value.hint


def test_reserved_refused_by_the_cli_with_a_coded_line(tmp_path, capsys):
    p = _h100_with(tmp_path, reserved_memory_bytes=200e9)
    assert cli_main(["estimate", "--model", "7b", "--gpus", "8", "--hardware", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("[BAD_CONFIG]") and "hint:" in err and "Traceback" not in err


def test_shipped_profiles_leave_capacity():
    for name in ("h100", "h200", "cpu"):
        hw = load_hardware(name)
        assert hw.hbm_bytes - hw.reserved_memory_bytes > 0
    d = load_hardware("h100").to_dict()
    d["reserved_memory_bytes"] = d["hbm_bytes"] - 1
    assert HardwareSpec.from_dict(d).reserved_memory_bytes == d["hbm_bytes"] - 1
