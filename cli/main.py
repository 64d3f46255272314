"""The ``grpo-tune`` command line. Thin: parse, call one function, print a rich table or JSON.

Each command lives in ``cli/<name>.py`` and registers itself here; a missing module is an error. A user's mistake
(a :class:`GrpoTuneError`) prints ``[CODE] message`` and a hint and exits 2, with no traceback.
"""
from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

from core.errors import GrpoTuneError

app = typer.Typer(
    name="grpo-tune",
    help="Pick parallel strategies for GRPO training on Megatron: estimate, search, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = ("estimate", "search", "compare", "diagnose", "validate", "train", "profile", "probe", "catalog", "tune",
                   "calibrate")
for _name in COMMAND_MODULES:
    importlib.import_module(f"cli.{_name}").register(app)

err_console = Console(stderr=True)


def report_error(exc: GrpoTuneError) -> None:
    err_console.print(f"[bold red][{exc.code}][/] {exc.message}", highlight=False, soft_wrap=True)
    if exc.hint:
        err_console.print(f"hint: {exc.hint}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code. Usage errors are shown by click (exit 2), coded errors here."""
    try:
        app(args=argv, standalone_mode=True)  # click shows usage errors itself and raises SystemExit
    except GrpoTuneError as exc:
        report_error(exc)
        return 2
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        err_console.print(str(code))
        return 1
    return 0


def run() -> None:  # console-script entry point
    sys.exit(main())
