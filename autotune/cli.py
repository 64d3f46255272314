"""The ``grpo-tune`` command line. Thin: parse, call one function, print a rich table or JSON.

Each command lives in ``autotune/commands/<name>.py`` and registers itself here. A user's mistake
(a :class:`GrpoTuneError`) prints ``[CODE] message`` and a hint and exits 2, with no traceback.
"""
from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

from costmodel.errors import GrpoTuneError

app = typer.Typer(
    name="grpo-tune",
    help="Pick parallel strategies for GRPO training on Megatron: estimate, search, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = ("estimate", "search", "compare", "diagnose", "validate", "train", "profile", "probe", "catalog")
for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"autotune.commands.{_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"autotune.commands.{_name}":
            raise
        continue  # command not built yet
    _mod.register(app)

err_console = Console(stderr=True)


def report_error(exc: GrpoTuneError) -> None:
    err_console.print(f"[bold red][{exc.code}][/] {exc.message}", highlight=False, soft_wrap=True)
    if exc.hint:
        err_console.print(f"hint: {exc.hint}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    rc = 0
    try:
        rc = app(args=argv, standalone_mode=False)  # non-standalone click returns typer.Exit's code
    except GrpoTuneError as exc:
        report_error(exc)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return rc if isinstance(rc, int) else 0


def run() -> None:  # console-script entry point
    sys.exit(main())
