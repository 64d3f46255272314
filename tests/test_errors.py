"""core/errors.py and the CLI's one error boundary (cli/main.py): every code has a hint, every failure prints
``[CODE] message`` + ``hint:`` with no traceback."""

import errno

import pytest

import grpo_tune.core.errors as E
from grpo_tune.core.errors import CODES, HINTS, GrpoTuneError


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_code_has_a_default_hint():
    missing = sorted(c for c in CODES if not HINTS.get(c, "").strip())
    assert not missing, f"codes without a hint in core/errors.py HINTS: {missing}"


def test_every_error_class_has_a_registered_code_and_hint():
    import grpo_tune.autotune  # noqa: F401 - load the packages that may subclass GrpoTuneError
    import grpo_tune.core.config  # noqa: F401

    for cls in [GrpoTuneError, *_subclasses(GrpoTuneError)]:
        assert cls.code in CODES, cls
        assert cls("x").hint == HINTS[cls.code], cls


def test_an_explicit_hint_wins_and_unknown_codes_are_refused():
    assert E.ConfigError("x", hint="do y").hint == "do y"
    assert GrpoTuneError("x", code="OOM_RISK").hint == HINTS["OOM_RISK"]
    with pytest.raises(ValueError):
        GrpoTuneError("x", code="NOT_A_CODE")


def _main_raising(monkeypatch, exc):
    import grpo_tune.cli.main as M

    def boom(**_kw):
        raise exc

    monkeypatch.setattr(M, "app", boom)
    return M.main([])


@pytest.mark.parametrize(
    "exc, code, rc",
    [
        (E.UnknownModelError("unknown model 'x' [in profiles]"), "UNKNOWN_MODEL", 2),
        (PermissionError(errno.EACCES, "Permission denied", "/root/out"), "IO_ERROR", 2),
        (ZeroDivisionError("division by zero"), "INTERNAL_ERROR", 1),
    ],
)
def test_cli_prints_code_message_and_hint_without_traceback(monkeypatch, capsys, exc, code, rc):
    monkeypatch.delenv("GRPO_TUNE_DEBUG", raising=False)
    assert _main_raising(monkeypatch, exc) == rc
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[0].startswith(f"[{code}] ") and lines[1] == f"hint: {HINTS[code]}"
    assert "Traceback" not in err
    if code == "UNKNOWN_MODEL":
        assert "[in profiles]" in lines[0]  # rich markup in a message is printed as is
    if code == "IO_ERROR":
        assert "Permission denied (/root/out)" in lines[0]


def test_debug_env_adds_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("GRPO_TUNE_DEBUG", "1")
    assert _main_raising(monkeypatch, KeyError("k")) == 1
    assert "Traceback" in capsys.readouterr().err
