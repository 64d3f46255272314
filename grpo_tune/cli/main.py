"""The ``grpo-tune`` command line. Thin: parse, call one function, print a rich table or JSON.

Each command lives in ``cli/<name>.py`` and registers itself here; a missing module is an error. Every failure
goes through :func:`report_error`: ``[CODE] message`` and a ``hint:`` line on stderr, no traceback; exit 2 for a
user's mistake (a :class:`GrpoTuneError`, a command line click cannot parse, a file that cannot be read or written),
1 for a bug (INTERNAL_ERROR).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer
from rich.console import Console
from rich.markup import escape

from grpo_tune.core.errors import GrpoTuneError

try:  # typer >= 0.22 carries its own copy of click; its exceptions are not click's
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - an older typer runs on click itself
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[assignment]

app = typer.Typer(
    name="grpo-tune",
    help="Pick parallel strategies for GRPO training on Megatron: estimate, search, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = (
    "estimate",
    "search",
    "compare",
    "diagnose",
    "validate",
    "train",
    "profile",
    "probe",
    "catalog",
    "tune",
    "calibrate",
)
for _name in COMMAND_MODULES:
    importlib.import_module(f"grpo_tune.cli.{_name}").register(app)

err_console = Console(stderr=True)


def as_coded(exc: BaseException) -> GrpoTuneError:
    """Any exception as a coded error: a GrpoTuneError as is, a file-system error as IO_ERROR, anything else
    (a bug) as INTERNAL_ERROR. The one place that decides what a failure looks like to the user."""
    if isinstance(exc, GrpoTuneError):
        return exc
    if isinstance(exc, UsageError):  # unknown command/option, missing option, value of the wrong type
        path = exc.ctx.command_path if exc.ctx is not None else "grpo-tune"
        what = "no command given" if isinstance(exc, NoArgsIsHelpError) else exc.format_message()
        return GrpoTuneError(f"{path}: {what}", hint=f"run `{path} --help` for its options", code="USAGE")
    if isinstance(exc, ClickException):
        return GrpoTuneError(exc.format_message(), code="BAD_CONFIG")
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


class Interrupted(SystemExit):
    """A signal that ends the command (SIGTERM, SIGHUP, SIGQUIT), raised where the program is, so that the
    ``finally`` blocks that take child process groups down run (the default action ends Python without
    unwinding and orphans them). Exits with 128 + the signal's number, as the shell reports it."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def _terminated(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def ending_signals() -> tuple[int, ...]:
    import signal

    return tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code. Every failure, click's usage errors included, is shown by
    :func:`report_error`."""
    import signal
    import threading

    old: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in ending_signals():
            old[sig] = signal.signal(sig, _terminated)
    try:
        return _main(argv)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _main(argv: list[str] | None) -> int:
    try:
        # not standalone: click raises its usage errors here instead of printing them itself
        status = app(args=argv, prog_name="grpo-tune", standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        err_console.print(str(code))
        return 1
    except NoArgsIsHelpError as exc:
        exc.show()  # the help, then the coded line
        return report_error(exc)
    except typer.Abort:  # end of input at a prompt; what click prints in standalone mode
        err_console.print("Aborted!")
        return 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's one error boundary
        return report_error(exc)
    # a command returns None; click returns the code of a typer.Exit / ctx.exit(code) instead
    return status if isinstance(status, int) else 0


def run() -> None:  # console-script entry point
    sys.exit(main())
