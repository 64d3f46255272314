"""The ``grpo-tune`` command line. Thin: parse, call one function, print a rich table or JSON.

Each command lives in ``cli/<name>.py`` and registers itself here; a missing module is an error. Every failure
goes through :func:`report_error`: ``[CODE] message`` and a ``hint:`` line on stderr, no traceback; exit 2 for a
user's mistake (a :class:`GrpoTuneError`, a file that cannot be read or written), 1 for a bug (INTERNAL_ERROR).
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer
from rich.console import Console
from rich.markup import escape

from core.errors import GrpoTuneError

app = typer.Typer(
    name="grpo-tune",
    help="Pick parallel strategies for GRPO training on Megatron: estimate, search, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = ("estimate", "search", "compare", "diagnose", "validate", "train", "profile", "probe", "catalog",
                   "tune",
                   "calibrate")
for _name in COMMAND_MODULES:
    importlib.import_module(f"cli.{_name}").register(app)

err_console = Console(stderr=True)


def as_coded(exc: BaseException) -> GrpoTuneError:
    """Any exception as a coded error: a GrpoTuneError as is, a file-system error as IO_ERROR, anything else
    (a bug) as INTERNAL_ERROR. The one place that decides what a failure looks like to the user."""
    if isinstance(exc, GrpoTuneError):
        return exc
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return GrpoTuneError(f"{exc.strerror or exc}{where}", code="IO_ERROR")
    return GrpoTuneError(f"{type(exc).__name__}: {exc}", code="INTERNAL_ERROR")


def report_error(exc: BaseException) -> int:
    """Print ``[CODE] message`` and ``hint: ...`` on stderr; return the exit code (2: the input or the
    environment, 1: a bug). GRPO_TUNE_DEBUG=1 adds the traceback."""
    err = as_coded(exc)
    err_console.print(f"[bold red]\\[{err.code}][/] {escape(err.message)}", highlight=False, soft_wrap=True)
    if err.hint:
        err_console.print(f"hint: {escape(err.hint)}", highlight=False, soft_wrap=True)
    if os.environ.get("GRPO_TUNE_DEBUG"):
        err_console.print("".join(traceback.format_exception(exc)), highlight=False, markup=False)
    return 1 if err.code == "INTERNAL_ERROR" else 2


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code. Usage errors are shown by click (exit 2), every other failure by
    :func:`report_error`."""
    try:
        app(args=argv, standalone_mode=True)  # click shows usage errors itself and raises SystemExit
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        err_console.print(str(code))
        return 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's one error boundary
        return report_error(exc)
    return 0


def run() -> None:  # console-script entry point
    sys.exit(main())
