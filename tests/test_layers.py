"""The package layers, checked on the source (AST, nothing is imported).

Every import counts, including the ones inside functions: a lazy import hides a cycle, it does not remove it.
The units below are packages or sub-packages of ``grpo_tune``; a module belongs to the longest unit that
prefixes it. Each unit may import itself and the units ``ALLOWED`` names, nothing else:

    core -> engines -> costmodel -> validate
         -> frameworks.base -> frameworks.{verl, megatron_lm, nemo_rl} -> frameworks.registry
         -> autotune.search -> autotune.calibrate -> autotune.refine -> jobs
         -> rundir (core, costmodel, validate, the framework registry; never autotune) -> autotune.refine
    trainer (core, costmodel only) ---------------------------------------------> jobs   cli on top of all

Three more rules: no import cycle between modules anywhere; typer (and click) only under ``cli/``;
torch, megatron, vLLM and TransformerEngine only under ``trainer/``. And the CLI is thin: a command parses
its flags, calls one job of ``jobs/`` and prints what it returns (``THIN_COMMANDS``).
tests/test_imports.py checks the last one at run time too (importing the CLI loads none of them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_FW = ("frameworks.verl", "frameworks.megatron_lm", "frameworks.nemo_rl")
_LOW = {"core", "engines", "costmodel"}
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    # the rollout engines' contract and data (engines/<name>/: knobs, memory/KV rules, cost parameters, key names)
    "engines": {"core"},
    "costmodel": {"core", "engines"},
    "profiles": set(),
    "validate": _LOW | {"frameworks", "frameworks.base"},
    "frameworks.base": _LOW,
    **{fw: _LOW | {"frameworks.base"} for fw in _FW},
    "frameworks": _LOW | {"frameworks.base", *_FW},  # the registry: the package's __init__
    # the search reaches a framework through the registry and the contract (its defaults come as data)
    "autotune.search": _LOW | {"frameworks", "frameworks.base"},
    # the generic layers reach a framework through the registry and the contract, never by its package
    "autotune.calibrate": _LOW | {"autotune.search", "frameworks", "frameworks.base"},
    "autotune": _LOW | {"autotune.search", "autotune.calibrate", "frameworks", "frameworks.base"},  # tune
    # the run folder is written from the cost model's results: the step metrics live in costmodel/results.py,
    # so nothing of it reaches up into the search that produced them (tests/test_seams.py)
    "rundir": _LOW | {"validate", "frameworks", "frameworks.base"},
    "autotune.refine": _LOW | {"autotune.search", "autotune.calibrate", "rundir"},
    # each command's work (cli parses, calls one job, prints)
    "jobs": _LOW
    | {"validate", "frameworks", "frameworks.base", "autotune.search", "autotune.calibrate", "autotune"}
    | {"rundir", "autotune.refine"}
    | {"trainer"},  # train and profile run the workers (trainer.launch: torch-free, imported when they run)
    "trainer": _LOW,  # an engine's adapter lives in trainer/ (engines name it by import path only)
    "cli": set(),  # anything: it is the top
}
UNITS = sorted(ALLOWED, key=len, reverse=True)
HEAVY = ("torch", "megatron", "vllm", "transformer_engine")


def _module_name(path: Path, root: Path = ROOT) -> str:
    """``grpo_tune.autotune.search.driver`` for ``root/grpo_tune/autotune/search/driver.py``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imported_names(path: Path, root: Path = ROOT, *, runtime_only: bool = False) -> set[str]:
    """Every dotted name ``path`` imports, relative imports resolved; ``from a import b`` gives ``a`` and ``a.b``.

    ``runtime_only`` leaves out the imports under ``if TYPE_CHECKING:``, which never run (for cycles)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    skip = _type_checking_only(tree) if runtime_only else set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[: len(pkg) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return found


def unit_of(name: str) -> str:
    """The unit a dotted name of ours lands in ('' if not ours)."""
    parts = name.split(".")
    if parts[0] != "grpo_tune" or len(parts) < 2:
        return ""
    rest = ".".join(parts[1:])
    return next((u for u in UNITS if rest == u or rest.startswith(u + ".")), "")


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """The units of ours that ``path`` imports (absolute or relative, at any depth)."""
    return {unit_of(n) for n in imported_names(path, root)} - {""}


def _sources() -> list[Path]:
    return sorted(p for p in (ROOT / "grpo_tune").rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_is_in_a_unit():
    inner = [p for p in _sources() if p.parent != ROOT / "grpo_tune"]
    lost = [str(p.relative_to(ROOT)) for p in inner if not unit_of(_module_name(p))]
    assert not lost, f"modules in no layer unit (add the package to ALLOWED): {lost}"


# Edges across the layers that the framework seam is still to remove (a framework reaching into tune's types or
# another framework's modules). The list may only shrink: the test fails on a new edge, and on a listed one gone.
PENDING_EDGES: set[tuple[str, str]] = set()


def _unit_edges() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for p in _sources():
        unit = unit_of(_module_name(p))
        for dst in imports_of(p) - {unit}:
            out.setdefault((unit, dst), []).append(str(p.relative_to(ROOT)))
    return out


@pytest.mark.parametrize("unit", sorted(u for u in ALLOWED if u != "cli"))
def test_unit_imports_only_lower_layers(unit):
    edges = _unit_edges().items()
    bad = {e: f for e, f in edges if e[0] == unit and e[1] not in ALLOWED[unit] and e not in PENDING_EDGES}
    assert not bad, f"{unit} may import only {sorted(ALLOWED[unit])}; found: {bad}"


def test_the_search_imports_no_framework_package(tmp_path):
    """autotune/search asks the registry (verl's defaults come as data), so no module of it imports a framework's
    own package, not even lazily; the check sees such an import (the defaults reader as it was)."""
    edges = {e: f for e, f in _unit_edges().items() if e[0] == "autotune.search" and e[1] in _FW}
    assert not edges, f"autotune/search imports a framework's package: {edges}"
    old = tmp_path / "grpo_tune" / "autotune" / "search" / "defaults.py"
    old.parent.mkdir(parents=True)
    old.write_text(
        "def verl_defaults():\n"
        "    from grpo_tune.frameworks.verl import snapshot as verl\n"
        "    from grpo_tune.frameworks.verl import table\n\n"
        '    return table.read_fields(verl.default, "strategy")\n'
    )
    assert imports_of(old, tmp_path) & set(_FW) == {"frameworks.verl"}
    assert "frameworks.verl" not in ALLOWED["autotune.search"]


def test_pending_edges_still_exist():
    gone = PENDING_EDGES - set(_unit_edges())
    assert not gone, f"remove these from PENDING_EDGES, they no longer occur: {sorted(gone)}"


def _module_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _sources()}

    def resolve(name: str) -> str:  # `grpo_tune.a.b.func` -> the module `grpo_tune.a.b`
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for mod, p in paths.items():
        names = imported_names(p, runtime_only=True)
        # `from pkg import sub` names the module pkg.sub, not the package's __init__
        targets = {resolve(n) for n in names if n.startswith("grpo_tune")}
        targets -= {t for t in targets if any(n.startswith(t + ".") and resolve(n) != t for n in names)}
        graph[mod] = targets - {"", mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_between_modules():
    """Not even through a function-level import (those count: a lazy import hides a cycle, it does not remove it)."""
    cycles = sorted(_cycles(_module_graph()))
    assert not cycles, f"modules that import each other (move the shared piece into the lower one): {cycles}"


def test_typer_only_under_cli():
    bad = [
        str(p.relative_to(ROOT))
        for p in _sources()
        if unit_of(_module_name(p)) != "cli" and {n.split(".")[0] for n in imported_names(p)} & {"typer", "click"}
    ]
    assert not bad, f"typer/click imported outside cli/: {bad}"


def test_torch_megatron_vllm_only_under_trainer():
    bad = {}
    for p in _sources():
        if unit_of(_module_name(p)) != "trainer":
            heavy = sorted({n.split(".")[0] for n in imported_names(p)} & set(HEAVY))
            if heavy:
                bad[str(p.relative_to(ROOT))] = heavy
    assert not bad, f"heavy imports outside trainer/: {bad}"


def test_the_checker_sees_lazy_relative_and_cyclic_imports(tmp_path):
    """The checker itself can fail: a lazy import, a relative import and a two-module cycle are all found."""
    src = "def f():\n    from grpo_tune.autotune.search import driver\n\nfrom . import launch\nfrom .. import cli\n"
    fake = tmp_path / "grpo_tune" / "trainer" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(src)
    assert imports_of(fake, tmp_path) == {"autotune.search", "trainer", "cli"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# The CLI is thin: a command parses its flags into a request, calls one job (grpo_tune/jobs/) and prints the
# outcome. WORK names what conducts the work: the searches, the refinement, writing run folders and output
# files, the calibration, the validation, reading logs, launching the trainer (trainer.launch, the run lock),
# listing the presets and the preamble (frameworks, stack, --out); a thin command's module imports none of
# it (the registry module `grpo_tune.frameworks` included), and calls exactly one job function, from the
# command itself. Printing helpers (tables, labels, ranks) stay allowed. The preamble and the flag parsing of
# jobs.setup / jobs.inputs are not jobs. A module's command function is named as the module, unless
# COMMAND_FUNCTIONS names its commands (one module may hold several: each calls exactly one job).
THIN_COMMANDS = ("search", "compare", "estimate", "tune", "validate", "diagnose", "calibrate", "train", "profile")
THIN_COMMANDS += ("probe", "catalog")
COMMAND_FUNCTIONS: dict[str, tuple[str, ...]] = {"probe": ("probe_cmd",), "catalog": ("models", "hardware")}
PENDING_THICK: set[str] = set()  # still conducting its work; may only shrink (a listed module that is thin fails)
WORK = {
    "grpo_tune.frameworks",
    "grpo_tune.autotune.search.driver.search",
    "grpo_tune.autotune.search.placement.search_placement",
    "grpo_tune.autotune.search.defaults.with_defaults",
    "grpo_tune.autotune.refine.refine",
    "grpo_tune.autotune.refine.loop.refine",
    "grpo_tune.autotune.refine.RefineOptions",
    "grpo_tune.autotune.tune.tune",
    "grpo_tune.rundir.emit.emit",
    "grpo_tune.rundir.emit.emit_run",
    "grpo_tune.rundir.outputs.check_out_dir",
    "grpo_tune.rundir.report.plot_compare",
    "grpo_tune.rundir.report.plot_splits",
    "grpo_tune.autotune.calibrate.fit.load",
    "grpo_tune.autotune.calibrate.fit.load_if_given",
    "grpo_tune.costmodel.estimate.estimate",
    "grpo_tune.costmodel.pools.estimate_separate",
    "grpo_tune.core.config.atomic_write",
    "grpo_tune.validate.grpo.run_grpo",
    "grpo_tune.validate.pretraining.run",
    "grpo_tune.validate.placement_pairs.score_pairs",
    "grpo_tune.autotune.calibrate.runlog.calibrate_logs",
    "grpo_tune.autotune.calibrate.runlog.read_log",
    "grpo_tune.autotune.calibrate.runlog.log_point",
    "grpo_tune.autotune.calibrate.fit.save",
    "grpo_tune.rundir.outputs.check_output",
    "grpo_tune.trainer.launch",
    "grpo_tune.trainer.profile",
    "grpo_tune.core.runlock.acquire",
    "grpo_tune.core.specs.list_models",
    "grpo_tune.core.specs.list_hardware",
    "grpo_tune.costmodel.params.total_params",
    "grpo_tune.costmodel.params.active_params",
}
NOT_JOBS = ("grpo_tune.jobs.setup", "grpo_tune.jobs.inputs")


def _job_functions(tree: ast.Module) -> set[str]:
    """Local names bound to a function of a job module (``from grpo_tune.jobs.search import run_search``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_tune.jobs."):
            if node.module not in NOT_JOBS:
                out |= {a.asname or a.name for a in node.names if a.name.startswith("run_")}
    return out


def _job_calls(node: ast.AST, jobs: set[str]) -> list[str]:
    return [
        c.func.id
        for c in ast.walk(node)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in jobs
    ]


def _thin_problems(path: Path, command: str, root: Path = ROOT) -> list[str]:
    """Why ``path`` is not a thin command module (empty: it is)."""
    tree = ast.parse(path.read_text())
    bad = [f"imports {n}" for n in sorted(imported_names(path, root) & WORK)]
    jobs = _job_functions(tree)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    commands = COMMAND_FUNCTIONS.get(command, (command,))
    for cmd in commands:
        if cmd not in funcs:
            bad.append(f"defines no command function {cmd}()")
            continue
        own = _job_calls(funcs[cmd], jobs)
        if len(own) != 1:
            bad.append(f"{cmd}() calls {len(own)} job functions ({own}), not exactly one")
    for name, f in funcs.items():
        if name not in commands and _job_calls(f, jobs):
            bad.append(f"{name}() calls a job: only the command itself may")
    return bad


@pytest.mark.parametrize("command", THIN_COMMANDS)
def test_a_thin_command_parses_calls_one_job_and_prints(command):
    bad = _thin_problems(ROOT / "grpo_tune" / "cli" / f"{command}.py", command)
    assert not bad, f"cli/{command}.py conducts work a job should: {bad}"


def test_pending_thick_commands_are_still_thick():
    thin = [c for c in sorted(PENDING_THICK) if not _thin_problems(ROOT / "grpo_tune" / "cli" / f"{c}.py", c)]
    assert not thin, f"move these to THIN_COMMANDS, they are thin now: {thin}"


def test_the_thin_check_sees_work_in_a_command(tmp_path):
    """The check fails on the command module as it was: orchestration in the CLI, no job called."""
    pkg = tmp_path / "grpo_tune" / "cli"
    pkg.mkdir(parents=True)
    thick = pkg / "search.py"
    thick.write_text(
        "from grpo_tune import frameworks as F\n"
        "from grpo_tune.rundir.emit import emit_run\n"
        "def search(out):\n"
        "    from grpo_tune.autotune.search.driver import search as run\n"
        "    emit_run(run(F.select('verl')), out=out)\n"
    )
    bad = _thin_problems(thick, "search", tmp_path)
    assert "imports grpo_tune.frameworks" in bad and "imports grpo_tune.rundir.emit.emit_run" in bad
    assert "imports grpo_tune.autotune.search.driver.search" in bad
    assert any("calls 0 job functions" in b for b in bad)
    twice = pkg / "compare.py"
    twice.write_text(
        "from grpo_tune.jobs.compare import run_compare\n"
        "from grpo_tune.jobs.setup import prepare\n"
        "def compare(r):\n"
        "    prepare('verl')\n"
        "    return run_compare(r), run_compare(r)\n"
        "def _more(r):\n"
        "    return run_compare(r)\n"
    )
    bad = _thin_problems(twice, "compare", tmp_path)
    assert any("calls 2 job functions" in b for b in bad) and "_more() calls a job: only the command itself may" in bad
