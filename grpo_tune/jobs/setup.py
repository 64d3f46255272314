"""The preamble of the planning commands (search, compare, estimate, tune): which frameworks and stack the
plan is for, the output folder checked before any work (never after a long search), and the calibration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setup:
    """What a planning command plans for, settled before its work starts."""

    frameworks: tuple[str, ...] = ("verl",)
    """The frameworks whose files are written (``--framework``; ``all``: every registered one)."""
    stack: str | None = None
    """The stack profile priced under: the user's ``--stack``, or the framework's own default."""
    calibration: Path | None = None
    """``--calibration``: the calibration file applied to the time model, if any."""
    stack_chosen_by: str = ""
    """Why :attr:`stack` is the one priced: ``--stack``, ``--framework NAME`` (the stack of the release that
    framework's files are written for), or empty (none chosen: the hardware profile's default)."""

    def stack_info(self, hw_stack: str | None) -> dict[str, str] | None:
        """The stack a plan was priced under (``hw_stack``: the hardware spec's applied stack), for output: its name,
        framework, release, provenance and why it was chosen (None: no stack applied)."""
        if not hw_stack:
            return None
        from grpo_tune.core.stacks import load_stack

        st = load_stack(hw_stack)
        why = self.stack_chosen_by or "the hardware profile's default"
        return {
            "name": st.name,
            "framework": st.framework,
            "release": st.release,
            "provenance": st.provenance,
            "chosen_by": why,
        }

    def stack_line(self, hw_stack: str | None) -> str | None:
        """One line naming the stack a framework's own release chose (None where the user or the hardware did)."""
        info = self.stack_info(hw_stack)
        if info is None or not self.stack_chosen_by.startswith("--framework"):
            return None
        return (
            f"Stack: {info['name']} ({info['framework']} {info['release']}, {info['provenance']}), chosen by "
            f"{info['chosen_by']}: the release its launch files are written for (--stack NAME prices another)"
        )

    def load_calibration(self, hardware: str | None = None) -> dict[str, float] | None:
        """The calibration's parameters (None without ``--calibration``); a coded error for a bad file, or
        (``hardware`` given) for a file fitted on other hardware."""
        from grpo_tune.autotune.calibrate.fit import load_if_given

        return load_if_given(self.calibration, hardware=hardware)

    def meta(self) -> dict[str, str] | None:
        """The run folder's meta block naming the calibration (None without one)."""
        return {"calibration": str(self.calibration)} if self.calibration else None


def prepare(
    framework: str | None,
    *,
    stack: str | None = None,
    out: Path | None = None,
    calibration: Path | None = None,
    inputs: dict[str, Path] | None = None,
) -> Setup:
    """The frameworks ``--framework`` names (None: none chosen, as for tune, whose input names its own), the
    stack to price under, and ``out`` (when the command will write there) checked before the work: a file, or a
    folder that is one of the command's ``inputs`` (``--calibration`` always is), is a coded error now rather
    than after a long search."""
    from grpo_tune import frameworks as F

    fws = F.select(framework) if framework is not None else ()  # None: the input file names its framework
    if out is not None:
        from grpo_tune.rundir.outputs import check_out_dir

        check_out_dir(out, "--out", inputs={**(inputs or {}), "--calibration": calibration})
    chosen = F.default_stack(fws, stack)
    by = "--stack" if stack else (f"--framework {fws[0]}" if chosen else "")
    return Setup(frameworks=fws, stack=chosen, calibration=calibration, stack_chosen_by=by)
