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
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, NoSuchOption, UsageError
except ImportError:  # pragma: no cover - an older typer runs on click itself
    from click.exceptions import (  # type: ignore[assignment]
        ClickException,
        NoArgsIsHelpError,
        NoSuchOption,
        UsageError,
    )

app = typer.Typer(
    name="grpo-tune",
    help="Pick parallel strategies for GRPO training on Megatron: estimate, search, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from grpo_tune import __version__

        print(f"grpo-tune {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", help="Print grpo-tune's version and exit.", is_eager=True, callback=_version
    ),
) -> None:
    """Pick parallel strategies for GRPO training on Megatron: estimate, search, train."""


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

MIN_COLUMNS = 20
"""Below this a terminal width is not one (``COLUMNS=0`` silenced every table, ``COLUMNS=1`` printed a letter a
line): the CLI lays out for 80 columns instead."""


def _sane_terminal() -> None:
    """``COLUMNS``/``LINES`` that are no terminal size are replaced by 80x25 (rich reads them when a console is
    made); ``TERM=dumb`` and ``NO_COLOR`` are rich's own business (plain text, no colour)."""
    for name, default in (("COLUMNS", "80"), ("LINES", "25")):
        v = os.environ.get(name)
        if v is not None and not (v.strip().isdigit() and int(v) >= MIN_COLUMNS if name == "COLUMNS" else v.isdigit()):
            os.environ[name] = default


def _hold_std_fds() -> None:
    """A closed stdout or stderr (``grpo-tune ... >&-``): fd 1 or 2 is held by /dev/null, so that no file the
    command opens can land on it (its output would be written into that file), and ``sys.stdout`` is a writer
    again (Python left None there: an AttributeError traceback). The output is discarded, as the caller asked."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            got = os.open(os.devnull, os.O_WRONLY)
            if got != fd:
                os.dup2(got, fd)
                os.close(got)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 - lives as long as the process
        except OSError:
            pass


_sane_terminal()
err_console = Console(stderr=True)


def _absent_flag_note(option: str | None) -> str | None:
    """jobs/diagnose.py's answer for a flag some framework's articles describe (imported only on a usage error)."""
    from grpo_tune.jobs.diagnose import absent_flag_note

    return absent_flag_note(option) if option else None


def as_coded(exc: BaseException) -> GrpoTuneError:
    """Any exception as a coded error: a GrpoTuneError as is, a file-system error as IO_ERROR, anything else
    (a bug) as INTERNAL_ERROR. The one place that decides what a failure looks like to the user."""
    if isinstance(exc, GrpoTuneError):
        return exc
    if isinstance(exc, UsageError):  # unknown command/option, missing option, value of the wrong type
        path = exc.ctx.command_path if exc.ctx is not None else "grpo-tune"
        flag = exc.option_name if isinstance(exc, NoSuchOption) else None
        note = _absent_flag_note(flag)
        if note is not None and path.endswith(" diagnose"):
            # the flags of a framework's diagnose script that articles describe and the framework does not have
            return GrpoTuneError(
                f"{path} has no {flag}: it runs every check at once (degrees per role, batch rules, "
                "dtypes, unknown keys, memory per phase)",
                hint=f"run `{path} SCRIPT`; {note}",
                code="USAGE",
            )
        what = "no command given" if isinstance(exc, NoArgsIsHelpError) else exc.format_message()
        return GrpoTuneError(f"{path}: {what}", hint=f"run `{path} --help` for its options", code="USAGE")
    if isinstance(exc, ClickException):
        return GrpoTuneError(exc.format_message(), code="BAD_CONFIG")
    if isinstance(exc, RuntimeError) and str(exc).startswith("Symlink loop"):  # Path.resolve() on a link loop
        return GrpoTuneError(f"{exc}: links that point at each other", hint="remove the loop", code="IO_ERROR")
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return GrpoTuneError(f"{exc.strerror or exc}{where}", code="IO_ERROR")
    return GrpoTuneError(f"{type(exc).__name__}: {exc}", code="INTERNAL_ERROR")


def report_error(exc: BaseException) -> int:
    """Print ``[CODE] message`` and ``hint: ...`` on stderr; return the exit code (2: the input or the
    environment, 1: a bug). GRPO_TUNE_DEBUG=1 adds the traceback."""
    err = as_coded(exc)
    lines = [f"[{err.code}] {err.message}"] + ([f"hint: {err.hint}"] if err.hint else [])
    if os.environ.get("GRPO_TUNE_DEBUG"):
        lines.append("".join(traceback.format_exception(exc)))
    say_error(lines, bold=True)
    return 1 if err.code == "INTERNAL_ERROR" else 2


def say_error(lines: list[str], *, bold: bool = False) -> None:
    """Lines on stderr that always arrive: through rich (colour) on a terminal of a sane width, else as plain text
    (``COLUMNS=0`` silenced rich; an ASCII-only stderr is written with escapes; a closed stderr is left alone)."""
    try:
        if err_console.is_terminal and err_console.width >= 20:
            first, *rest = lines
            head = f"[bold red]{escape(first.split(' ', 1)[0])}[/] " if bold else ""
            body = escape(first.split(" ", 1)[1]) if bold and " " in first else escape(first)
            err_console.print(head + body if bold else body, highlight=False, soft_wrap=True)
            for ln in rest:
                err_console.print(ln, highlight=False, soft_wrap=True, markup=False)
            return
    except Exception:  # noqa: BLE001, S110 - fall back to plain text below
        pass
    text = "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)
    enc = getattr(sys.stderr, "encoding", None) or "utf-8"
    try:
        sys.stderr.write(text.encode(enc, errors="backslashreplace").decode(enc, errors="replace"))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


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


def _safe_streams() -> None:
    """stdout/stderr that cannot fail on a character (``PYTHONIOENCODING=ascii``): what does not encode is escaped,
    not an INTERNAL_ERROR after the run folder was written."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream.errors == "strict":
                stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            pass


EXIT_PIPE = 128 + 13
"""Exit code when the reader of stdout went away (``search | head``): 141, what the shell reports for a program
killed by SIGPIPE, so ``set -o pipefail`` still sees that the output was cut; nothing is printed."""


def _pipe_closed() -> int:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail a second time
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_PIPE


def _rich_broken_pipe(self: Console) -> None:
    # rich's own handler exits 1, which reads as a failure; the CLI's is EXIT_PIPE, quietly
    self.quiet = True
    raise BrokenPipeError


Console.on_broken_pipe = _rich_broken_pipe  # type: ignore[method-assign]


def _main(argv: list[str] | None) -> int:
    _hold_std_fds()
    _sane_terminal()
    _safe_streams()
    try:
        code = _run(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _pipe_closed()


_INT_OPTIONS: dict[tuple[str, ...], dict[str, str]] | None = None


def _int_options() -> dict[tuple[str, ...], dict[str, str]]:
    """Command path -> {option spelling: parameter name} for every integer option (built once)."""
    global _INT_OPTIONS
    if _INT_OPTIONS is None:
        import typing

        from typer.main import get_command

        out: dict[tuple[str, ...], dict[str, str]] = {}

        def walk(cmd: object, path: tuple[str, ...]) -> None:
            opts: dict[str, str] = {}
            for p in getattr(cmd, "params", []):
                ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
                if ann is int or int in typing.get_args(ann):
                    opts.update({o: p.name for o in p.opts})
            out[path] = opts
            for name, sub in getattr(cmd, "commands", {}).items():
                walk(sub, (*path, name))

        if not isinstance(app, typer.Typer):  # a test's stand-in for the CLI: nothing to check
            return {}
        walk(get_command(app), ())
        _INT_OPTIONS = out
    return _INT_OPTIONS


def _check_int_bounds(argv: list[str]) -> None:
    """Every integer option of every command, refused above its bound (core/bounds.py) before the command runs:
    ``--gpus 2**63`` spun in a divisor walk for minutes."""
    from grpo_tune.core import bounds

    table = _int_options()
    path: tuple[str, ...] = ()
    i = 0
    while i < len(argv) and (*path, argv[i]) in table:
        path, i = (*path, argv[i]), i + 1
    opts = table.get(path, {})
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok == "--":
            break
        name, eq, val = tok.partition("=")
        if name not in opts:
            continue
        if not eq:
            if i >= len(argv):
                break
            val, i = argv[i], i + 1
        try:
            v = int(val.strip())
        except ValueError:
            continue  # click says what is wrong with it
        param = opts[name]
        if param in bounds.OWN_CHECK:
            continue
        bounds.check(name, v, bounds.BY_FLAG.get(param, bounds.MAX_INT))


def contradiction(argv: list[str]) -> GrpoTuneError | None:
    """``--X`` and ``--no-X`` on one command line (``--emit --no-emit``): click lets the last one win in silence;
    grpo-tune refuses, since the user asked for both."""
    toks = argv[: argv.index("--")] if "--" in argv else argv
    for t in toks:
        if t.startswith("--no-") and len(t) > 5 and f"--{t[5:]}" in toks:
            return GrpoTuneError(
                f"--{t[5:]} and {t} contradict each other",
                hint="give only one of them",
                code="USAGE",
            )
    return None


def _run(argv: list[str] | None) -> int:
    both = contradiction(list(sys.argv[1:] if argv is None else argv))
    if both is not None:
        return report_error(both)
    try:
        _check_int_bounds(list(sys.argv[1:] if argv is None else argv))
        # not standalone: click raises its usage errors here instead of printing them itself
        status = app(args=argv, prog_name="grpo-tune", standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":  # click's answer to EPIPE on stdout: exit(1)
            return _pipe_closed()
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
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the CLI's one error boundary
        if isinstance(exc.__context__, BrokenPipeError) or isinstance(exc.__cause__, BrokenPipeError):
            raise BrokenPipeError from exc
        return report_error(exc)
    # a command returns None; click returns the code of a typer.Exit / ctx.exit(code) instead
    return status if isinstance(status, int) else 0


def run() -> None:  # console-script entry point
    sys.exit(main())
