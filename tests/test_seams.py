"""The framework seam and the typed seams, checked on the source (AST; nothing is imported but the key snapshot).

- verl's keys are spelled only under ``grpo_tune/frameworks/verl/``: a string literal elsewhere that is a key of
  verl 0.9.1's composed config (or a dotted prefix of one under ``actor_rollout_ref``) is a finding.
  Prose (docstrings, help texts) may name keys; a literal that *is* a key is code that reads or writes it.
- verl's metric names (``timing_s/gen``, ``perf/throughput``, ...: the prefixes of :data:`VERL_METRIC_PREFIXES`)
  likewise: its log reader is frameworks/verl/logs.py; calibrate asks the registry for it.
- ``Any`` in the public signatures of ``core/``, ``costmodel/``, ``autotune/``, ``frameworks/`` and ``jobs/``:
  module-level functions and the methods of module-level classes whose names have no leading underscore; and in
  the fields of their public dataclasses, NamedTuples and TypedDicts. An alias of ``Any`` (``JSON = dict[str,
  Any]``, followed through imports and other aliases) counts as ``Any``.
What is still to move is listed (verl) or counted (``Any``) and may only shrink: each test fails on a new finding
and on a listed one gone.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "grpo_tune"
VERL_KEYS_FILE = PKG / "frameworks" / "verl" / "data" / "verl-0.9.1-keys.json"


def _sources(*under: str) -> list[Path]:
    dirs = [PKG / u for u in under] if under else [PKG]
    return sorted(p for d in dirs for p in d.rglob("*.py") if "__pycache__" not in p.parts)


def _docstrings(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def verl_keys() -> set[str]:
    data = json.loads(VERL_KEYS_FILE.read_text())
    keys = data.get("keys", data) if isinstance(data, dict) else data
    return set(keys)


def verl_spellings(path: Path, keys: set[str], prefixes: set[str]) -> list[str]:
    """The string literals of ``path`` that spell a verl key (docstrings aside)."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            v = node.value.lstrip("+")
            if v in keys or v in prefixes:
                found.append(node.value)
    return found


# Spellings of verl keys outside frameworks/verl/ still to move; the list may only shrink.
VERL_PENDING: dict[str, list[str]] = {}

VERL_PREFIX_NAMES = {"ARO", "ACTOR", "REF", "ROLLOUT", "MEG", "OTC", "REF_OTC", "OPTIM", "OOC"}
"""The verl table's key prefixes (frameworks/verl/table.py): importing one elsewhere is spelling verl keys there,
``f"{ACTOR}.ppo_mini_batch_size"``, which the literal check alone does not see."""


def verl_prefix_imports(path: Path) -> list[str]:
    """``import NAME`` for each verl key prefix that ``path`` imports from a module of frameworks/verl/."""
    tree = ast.parse(path.read_text())
    return [
        f"import {a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_tune.frameworks.verl")
        for a in node.names
        if a.name in VERL_PREFIX_NAMES
    ]


def _verl_findings() -> dict[str, list[str]]:
    keys = verl_keys()
    prefixes = {k.rsplit(".", i)[0] for k in keys if k.startswith("actor_rollout_ref.") for i in range(1, 4)}
    prefixes = {p for p in prefixes if "." in p} | {"actor_rollout_ref"}
    out = {}
    for p in _sources():
        rel = str(p.relative_to(ROOT))
        if rel.startswith("grpo_tune/frameworks/verl/"):
            continue
        hits = verl_spellings(p, keys, prefixes) + verl_prefix_imports(p)
        if hits:
            out[rel] = sorted(hits)
    return out


def test_verl_keys_are_spelled_only_in_frameworks_verl():
    assert _verl_findings() == {k: sorted(v) for k, v in VERL_PENDING.items()}


def test_the_verl_check_can_fail(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        '"""Docstrings may name data.train_batch_size."""\n'
        'A = "+actor_rollout_ref.actor.optim.lr"\nB = "policy.model_name"\nC = "actor_rollout_ref.rollout"\n'
    )
    keys = {"actor_rollout_ref.actor.optim.lr", "data.train_batch_size"}
    assert verl_spellings(src, keys, {"actor_rollout_ref.rollout"}) == [
        "+actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.rollout",
    ]
    assert len(verl_keys()) > 500  # the snapshot is read, not an empty set
    imp = tmp_path / "y.py"
    imp.write_text(
        "from grpo_tune.frameworks.verl.launch import ACTOR, Launch\n"
        "from grpo_tune.frameworks.verl.table import OTC as O\n"
        "from grpo_tune.core.config import ACTOR as NOT_VERL\n"
        'KEY = f"{ACTOR}.ppo_mini_batch_size"\n'
    )
    assert verl_prefix_imports(imp) == ["import ACTOR", "import OTC"]


VERL_METRIC_PREFIXES = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/",
    "actor/",
    "critic/",
    "response_length/",
    "prompt_length/",
    "val-core/",
    "val-aux/",
    "training/",
    "global_seqlen/",
)
"""The prefixes of verl 0.9.1's per-step metric names (``verl/trainer/ppo/metric_utils.py``, ``ray_trainer.py``):
a string literal that starts with one reads or writes a verl metric."""

# Modules outside frameworks/verl/ that spell verl's metric names on purpose, with why; may only shrink.
VERL_METRICS_ELSEWHERE = {
    # our trainer logs its metrics under verl's names too (TensorBoard, wandb, metrics.jsonl) so that a verl
    # user's dashboards read a grpo-tune run; trainer/ imports core and costmodel only, so it cannot ask
    # frameworks/verl/ for them (test_the_trainer_logs_timers_verls_reader_reads keeps the two in step)
    "grpo_tune/trainer/tracking.py",
}


def verl_metric_spellings(path: Path) -> list[str]:
    """The string literals of ``path`` (docstrings aside, f-string parts included) that start with a verl metric
    prefix."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and node.value.startswith(VERL_METRIC_PREFIXES)
    ]


def _verl_metric_findings() -> dict[str, list[str]]:
    out = {}
    for p in _sources():
        rel = str(p.relative_to(ROOT))
        if not rel.startswith("grpo_tune/frameworks/verl/") and (hits := verl_metric_spellings(p)):
            out[rel] = sorted(set(hits))
    return out


def test_verl_metric_names_are_spelled_only_in_frameworks_verl():
    found = _verl_metric_findings()
    assert sorted(found) == sorted(VERL_METRICS_ELSEWHERE), {k: v for k, v in found.items()}
    assert not any(k.startswith("grpo_tune/autotune/") for k in found)


# verl's log reader as it stood inside autotune/calibrate/runlog.py (its lines as they were, cut to a few, and an
# f-string added): the check must see every metric name in it, and none in the docstring.
_OLD_CALIBRATE_RUNLOG = '''"""verl's timers map to our phases (timing_s/gen wraps vLLM's sleep): prose, no finding."""
VERL_PHASES: dict[str, str] = {
    "timing_s/gen": "rollout",  # includes vLLM sleep (verl 0.9.1 ray_trainer.py l.1510-1514)
    "timing_s/update_weights": "weight_sync",
}
_VERL_KEYS = {
    "response_length/mean": "response_len_mean",
    "perf/max_memory_allocated_gb": "max_memory_allocated_gib",
}


def _bad_timings(fmt, obj):
    return [k for k, v in obj.items() if isinstance(k, str) and k.startswith("timing_s/") and _non_finite(v)]


def _verl_record(step, data):
    step_s = timing.get("timing_s/step")
    if step_s is None:
        step_s = _num(data.get("perf/time_per_step"))
    return f"actor/{step}"
'''


def test_the_verl_metric_check_can_fail(tmp_path):
    old = tmp_path / "runlog.py"
    old.write_text(_OLD_CALIBRATE_RUNLOG)
    assert sorted(verl_metric_spellings(old)) == [
        "actor/",
        "perf/max_memory_allocated_gb",
        "perf/time_per_step",
        "response_length/mean",
        "timing_s/",
        "timing_s/gen",
        "timing_s/step",
        "timing_s/update_weights",
    ]
    assert verl_metric_spellings(PKG / "frameworks" / "verl" / "logs.py")  # where they live now: seen there


def test_the_trainer_logs_timers_verls_reader_reads(tmp_path):
    """The trainer's verl-named metrics (trainer/tracking.py), written as verl's file logger writes a step, read
    back by verl's log reader: the same phases and step time, so the two spellings cannot drift apart."""
    import math

    from grpo_tune.core.phases import MEASURED_PHASES
    from grpo_tune.frameworks.verl.logs import read
    from grpo_tune.trainer.tracking import verl_metrics

    phases = {p.value: 1.0 + i for i, p in enumerate(MEASURED_PHASES)}
    m = {"step_s": 20.0, "phases_s": phases, "response_len": 321.0, "tokens": 4096, "tokens_per_s_per_gpu": 7.5}
    log = tmp_path / "verl.jsonl"
    log.write_text(json.dumps({"step": 1, "data": verl_metrics(m)}) + "\n")
    (rec,) = read(log, log.read_text()).records
    assert rec.phases_s == phases and rec.step_s == 20.0
    assert (rec.response_len_mean, rec.total_tokens, rec.throughput_tok_s_gpu) == (321.0, 4096.0, 7.5)
    assert not math.isnan(rec.step_s)


def _module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


class Names:
    """What stands for ``Any`` in one module: ``Any`` itself, its module-level aliases (``Plan = dict[str, Any]``,
    ``X: TypeAlias = ...``, transitively) and the aliases it imports from another grpo_tune module, by name or as
    ``module.Alias``."""

    def __init__(self, aliases: set[str] | None = None, modules: dict[str, set[str]] | None = None) -> None:
        self.aliases = aliases if aliases is not None else set()
        self.modules = (
            modules if modules is not None else {}
        )  # local name of an imported grpo_tune module -> its aliases

    def mentioned(self, node: ast.expr | None) -> bool:
        """``Any`` in an annotation, bare, as ``typing.Any``, through an alias, or inside a quoted annotation."""
        for n in ast.walk(node) if node is not None else ():
            if isinstance(n, ast.Name) and (n.id == "Any" or n.id in self.aliases):
                return True
            if isinstance(n, ast.Attribute) and (
                n.attr == "Any" or (isinstance(n.value, ast.Name) and n.attr in self.modules.get(n.value.id, ()))
            ):
                return True
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                try:
                    inner = ast.parse(n.value, mode="eval").body
                except SyntaxError:
                    inner = None
                if inner is not None and self.mentioned(inner):
                    return True
                words = {"Any", *self.aliases}
                if inner is None and any(re.search(rf"\b{re.escape(w)}\b", n.value) for w in words):
                    return True
        return False


def _mentions_any(node: ast.expr | None) -> bool:
    return Names().mentioned(node)


def _alias_candidates(tree: ast.Module) -> list[tuple[str, ast.expr]]:
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out.append((node.targets[0].id, node.value))
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
            and "TypeAlias" in ast.unparse(node.annotation)
        ):
            out.append((node.target.id, node.value))
        elif type(node).__name__ == "TypeAlias":  # ``type X = ...`` (Python 3.12)
            out.append((getattr(node, "name").id, getattr(node, "value")))
    return out


def names_for_any(paths: list[Path], root: Path = ROOT) -> dict[Path, Names]:
    """Each module's :class:`Names`, aliases followed across grpo_tune's modules to a fixed point."""
    trees = {p: ast.parse(p.read_text()) for p in paths}
    mod_of = {p: _module_of(p, root) for p in paths}
    aliases: dict[str, set[str]] = {m: set() for m in mod_of.values()}
    imported: dict[Path, list[tuple[str, str, str]]] = {}  # local name, module, name there
    modules: dict[Path, dict[str, str]] = {}  # local name -> grpo_tune module
    for p, tree in trees.items():
        imported[p], modules[p] = [], {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                src = _absolute(mod_of[p], p.name == "__init__.py", node)
                for a in node.names:
                    local = a.asname or a.name
                    if f"{src}.{a.name}" in aliases:
                        modules[p][local] = f"{src}.{a.name}"
                    elif src in aliases:
                        imported[p].append((local, src, a.name))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in aliases and a.asname:
                        modules[p][a.asname] = a.name
    names = {p: Names(aliases[mod_of[p]], {}) for p in paths}
    changed = True
    while changed:
        changed = False
        for p, tree in trees.items():
            mine = aliases[mod_of[p]]
            names[p].modules = {local: aliases[m] for local, m in modules[p].items()}
            found = {n for n, value in _alias_candidates(tree) if names[p].mentioned(value)}
            found |= {local for local, m, n in imported[p] if n in aliases[m]}
            if not found <= mine:
                mine |= found
                changed = True
    return names


def any_in_public_signatures(path: Path, names: Names | None = None) -> list[str]:
    """``name`` for every public function or method of ``path`` with ``Any`` (or an alias of it) in an annotation."""
    tree = ast.parse(path.read_text())
    names = names if names is not None else names_for_any([path], path.parent)[path]
    out = []

    def check(fn: ast.FunctionDef | ast.AsyncFunctionDef, owner: str = "") -> None:
        if fn.name.startswith("_") and not (fn.name.startswith("__") and fn.name.endswith("__")):
            return
        a = fn.args
        args = [
            *a.posonlyargs,
            *a.args,
            *a.kwonlyargs,
            *([a.vararg] if a.vararg else []),
            *([a.kwarg] if a.kwarg else []),
        ]
        if any(names.mentioned(x.annotation) for x in args) or names.mentioned(fn.returns):
            out.append(f"{owner}{fn.name}")

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            check(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    check(item, f"{node.name}.")
    return out


SEAM_PACKAGES = ("core", "costmodel", "autotune", "frameworks", "jobs")


def any_counts() -> Counter[str]:
    names = names_for_any(_sources())
    return Counter(
        {
            str(p.relative_to(ROOT)): len(found)
            for p in _sources(*SEAM_PACKAGES)
            if (found := any_in_public_signatures(p, names[p]))
        }
    )


def _base_name(node: ast.expr) -> str:
    f = node.func if isinstance(node, ast.Call) else node
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def typed_dict_names(paths: list[Path]) -> set[str]:
    """The names of the TypedDicts the modules define, subclasses of one another's included (by name)."""
    classes = [n for p in paths for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)]
    found = {"TypedDict"}
    changed = True
    while changed:
        new = {c.name for c in classes if any(_base_name(b) in found for b in c.bases)}
        changed = not new <= found
        found |= new
    return found - {"TypedDict"}


def any_in_public_fields(path: Path, names: Names | None = None, typed_dicts: set[str] = frozenset()) -> list[str]:
    """``Class.field`` for every field of a public record class of ``path`` (a dataclass, a NamedTuple or a
    TypedDict, nested ones included; public: no leading underscore in the class name) whose annotation holds
    ``Any`` or an alias of it. ``ClassVar`` attributes are not fields."""
    tree = ast.parse(path.read_text())
    names = names if names is not None else names_for_any([path], path.parent)[path]
    records = {"NamedTuple", "TypedDict", *typed_dicts}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        if not (
            any(_base_name(d) == "dataclass" for d in node.decorator_list)
            or any(_base_name(b) in records for b in node.bases)
        ):
            continue
        for item in node.body:
            if (
                isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and "ClassVar" not in ast.unparse(item.annotation)
                and names.mentioned(item.annotation)
            ):
                out.append(f"{node.name}.{item.target.id}")
    return out


def any_field_counts() -> Counter[str]:
    names = names_for_any(_sources())
    seams = _sources(*SEAM_PACKAGES)
    tds = typed_dict_names(seams)
    return Counter(
        {str(p.relative_to(ROOT)): len(found) for p in seams if (found := any_in_public_fields(p, names[p], tds))}
    )


def test_no_any_in_public_fields():
    """No public dataclass, NamedTuple or TypedDict of core/, costmodel/, autotune/, frameworks/ or jobs/ holds
    ``Any`` (or an alias of it) in a field: what crosses the seams as a record is typed too."""
    counts = any_field_counts()
    assert not counts, counts.most_common(10)


def test_the_field_counter_can_fail(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        "import dataclasses\nfrom dataclasses import dataclass, field\n"
        "from typing import Any, ClassVar, NamedTuple, TypedDict\nJSON = dict[str, Any]\n"
        "@dataclass(frozen=True)\nclass A:\n    x: Any\n    y: int\n    z: ClassVar[Any] = None\n"
        "    w: 'list[JSON]' = field(default_factory=list)\n"
        "@dataclasses.dataclass\nclass _Private:\n    x: Any\n"
        "class B(NamedTuple):\n    x: dict[str, Any]\n"
        "class C(TypedDict, total=False):\n    x: object\n    y: Any\n"
        "class D(C):\n    z: Any\n"
        "class Plain:\n    x: Any\n"
        "class Outer:\n    @dataclass\n    class Inner:\n        x: Any | None\n"
    )
    tds = typed_dict_names([src])
    assert tds == {"C", "D"}
    assert any_in_public_fields(src, typed_dicts=tds) == ["A.x", "A.w", "B.x", "C.y", "D.z", "Inner.x"]


def test_no_any_in_public_signatures():
    """No public function or method of core/, costmodel/, autotune/, frameworks/ or jobs/ takes or returns
    ``Any`` (or an alias of it): the seams between the layers are typed."""
    counts = any_counts()
    assert not counts, counts.most_common(10)


def test_the_any_counter_can_fail(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        "from typing import Any\n"
        "def f(x: Any) -> int: ...\n"
        "def g(x: int) -> 'dict[str, Any]': ...\n"
        "def _h(x: Any) -> Any: ...\n"
        "class C:\n    def m(self, *a: Any) -> None: ...\n    def _p(self, x: Any) -> None: ...\n"
        "def ok(x: int) -> str: ...\n"
    )
    assert any_in_public_signatures(src) == ["f", "g", "C.m"]


def test_the_any_counter_sees_aliases(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import Any, Callable, TypeAlias\n"
        "JSON = Any\nPlan = dict[str, JSON]\nGet: TypeAlias = 'Callable[[str], Any]'\nFine = dict[str, object]\n"
        "def f(x: Plan) -> None: ...\ndef ok(x: Fine) -> None: ...\n"
    )
    (pkg / "b.py").write_text(
        "from . import a\nfrom .a import Get as G\nfrom pkg.a import Fine\n"
        "def g(x: a.Plan) -> None: ...\ndef h(x: 'G') -> None: ...\ndef ok(x: Fine, y: a.Fine) -> None: ...\n"
    )
    files = sorted(pkg.glob("*.py"))
    names = names_for_any(files, tmp_path)
    assert names[pkg / "a.py"].aliases == {"JSON", "Plan", "Get"}
    assert any_in_public_signatures(pkg / "a.py", names[pkg / "a.py"]) == ["f"]
    assert any_in_public_signatures(pkg / "b.py", names[pkg / "b.py"]) == ["g", "h"]


def test_a_verl_config_is_claimed_by_verl_before_any_other_framework(tmp_path):
    """verl's detector claims a YAML config by its top section, so NeMo-RL's recipe detector needs no verl key:
    a config with verl's section and NeMo-RL-looking ones goes to verl; without verl's section, to NeMo-RL."""
    from grpo_tune import frameworks as F

    both = tmp_path / "both.yaml"
    both.write_text(
        "actor_rollout_ref:\n  rollout:\n    tensor_model_parallel_size: 2\npolicy:\n  generation: {}\ngrpo: {}\n"
    )
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text("policy:\n  generation: {}\ngrpo: {}\n")
    assert F.reader_for(both).name == "verl"
    assert F.reader_for(nemo).name == "nemo-rl"


def plan_names(paths: list[Path]) -> dict[str, list[str]]:
    """Where the plan vocabulary is defined: ``class``/alias names that are or end in ``Plan``/``Plans``, and
    every function or method called ``plan_of``, ``read_plan`` or ``sections_of`` with its return annotation
    (``path:name -> annotation``)."""
    out: dict[str, list[str]] = {"types": [], "functions": []}
    for p in paths:
        tree = ast.parse(p.read_text())
        rel = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and re.search(r"Plans?$", node.name):
                out["types"].append(f"{rel}:{node.name}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in (
                "plan_of",
                "read_plan",
                "sections_of",
            ):
                ret = ast.unparse(node.returns) if node.returns is not None else ""
                out["functions"].append(f"{rel}:{node.name} -> {ret}")
        for name, _ in _alias_candidates(tree):
            if name in ("Plan", "Plans"):
                out["types"].append(f"{rel}:{name}")
    return out


def test_one_name_per_plan_concept():
    """One name per concept (docs/architecture.md, "Plans and their names"): the one plan class is the
    ``LaunchPlan`` a framework's file is read back into (no ``Plan``/``Plans`` type anywhere); ``read_plan`` (the
    registry's and each framework's) returns it; ``sections_of`` is the one run config -> ``Sections`` function; no
    ``plan_of`` is left to mean two things."""
    found = plan_names(_sources())
    assert found["types"] == ["grpo_tune/frameworks/base/plan.py:LaunchPlan"]
    funcs = found["functions"]
    assert not [f for f in funcs if ":plan_of " in f], funcs
    assert [f for f in funcs if ":sections_of " in f] == [
        "grpo_tune/frameworks/base/sections.py:sections_of -> Sections"
    ]
    readers = [f for f in funcs if ":read_plan " in f]
    assert len(readers) == 6, readers  # the registry's, the base contract's, verl's and NeMo-RL's (module + method)
    assert all(f.endswith("-> LaunchPlan") or f.endswith("-> LaunchPlan | None") for f in readers), readers


def test_the_plan_name_check_can_fail(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        "from typing import TypedDict\n"
        "class Plan(TypedDict): ...\n"
        "Plans = dict[str, int]\n"
        "class OtherPlan: ...\n"
        "def plan_of(cfg) -> dict: ...\n"
        "def read_plan(path) -> 'LaunchPlan': ...\n"
    )
    found = plan_names([src])
    assert found["types"] == ["x.py:Plan", "x.py:OtherPlan", "x.py:Plans"]
    assert found["functions"] == ["x.py:plan_of -> dict", "x.py:read_plan -> 'LaunchPlan'"]


# --- issue 37's seams ------------------------------------------------------------------------------------------


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every dotted name ``path`` imports (absolute; relative ones resolved), function-level and TYPE_CHECKING
    imports included: an annotation-only import is still an arrow in the layering."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(root).with_suffix("").parts
    pkg = list(rel[:-1] if rel[-1] != "__init__" else rel[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[: len(pkg) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return out


def arrows_into(under: str, target: str, root: Path = ROOT) -> dict[str, list[str]]:
    """The modules under ``grpo_tune/<under>`` that import anything of ``grpo_tune.<target>``."""
    hits = {}
    for p in sorted((root / "grpo_tune" / under).rglob("*.py")):
        names = _imports(p, root)
        bad = sorted(n for n in names if n == f"grpo_tune.{target}" or n.startswith(f"grpo_tune.{target}."))
        if bad:
            hits[p.relative_to(root).as_posix()] = bad
    return hits


def test_no_arrow_from_rundir_into_autotune():
    """The run folder (rundir/) is written from the cost model's results: the step metrics (step_s,
    tokens_per_s_per_gpu) are defined once in costmodel/results.py, the layout key in core/strategy.py, the
    workload lines in costmodel/lengths.py; nothing of rundir reaches up into the search that produced them."""
    assert not arrows_into("rundir", "autotune"), arrows_into("rundir", "autotune")


def test_the_arrow_check_sees_an_import_up(tmp_path):
    """rundir/report.py as it was (a lazy import of the rank's step metric, an annotation-only import): found."""
    fake = tmp_path / "grpo_tune" / "rundir" / "report.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from grpo_tune.autotune.search.placement import PlacementResult\n"
        "def table(e):\n    from grpo_tune.autotune.search.rank import step_s\n    return step_s(e)\n"
    )
    found = arrows_into("rundir", "autotune", tmp_path)
    assert found == {
        "grpo_tune/rundir/report.py": [
            "grpo_tune.autotune.search.placement",
            "grpo_tune.autotune.search.placement.PlacementResult",
            "grpo_tune.autotune.search.rank",
            "grpo_tune.autotune.search.rank.step_s",
        ]
    }


def test_the_step_metrics_are_defined_once():
    """``def step_s`` / ``def tokens_per_s_per_gpu`` at module level only in costmodel/results.py (Estimate's
    properties there call them)."""
    defs = {}
    for p in _sources():
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in ("step_s", "tokens_per_s_per_gpu"):
                defs.setdefault(node.name, []).append(str(p.relative_to(ROOT)))
    assert defs == {
        "step_s": ["grpo_tune/costmodel/results.py"],
        "tokens_per_s_per_gpu": ["grpo_tune/costmodel/results.py"],
    }


# CLI modules that still import a framework's own package (past the registry and the contract); may only shrink.
# (cli/main.py's verl diagnose.py flag names now come through jobs/diagnose.py and Framework.absent_diagnose_flags.)
CLI_FRAMEWORK_PENDING: set[str] = set()


def test_the_cli_reaches_frameworks_through_jobs():
    """cli/ imports no framework's own package (frameworks.verl, .nemo_rl, .megatron_lm): tune asks jobs/tune.py
    for the launch's key findings and the diff lines, and an unknown ``diagnose --check-*`` flag asks
    jobs/diagnose.py, both of which ask the framework contract."""
    found = {
        f: names
        for fw in ("verl", "nemo_rl", "megatron_lm")
        for f, names in arrows_into("cli", f"frameworks.{fw}").items()
    }
    assert set(found) == CLI_FRAMEWORK_PENDING, found


def test_one_list_of_framework_names():
    """core/stacks.py's FRAMEWORKS is the one list: the registry holds one integration per name (the trainer's
    aside), in that order, and `--framework`'s hint is built from it."""
    from grpo_tune import frameworks as F
    from grpo_tune.core.stacks import FRAMEWORKS, TRAINER

    assert tuple(f.name for f in F.REGISTRY) == tuple(n for n in FRAMEWORKS if n != TRAINER)
    literal = [
        p.relative_to(ROOT).as_posix()
        for p in _sources()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Tuple)
        and {"verl", "nemo-rl"} <= {e.value for e in node.elts if isinstance(e, ast.Constant)}
    ]
    assert literal == ["grpo_tune/core/stacks.py"], literal


def test_read_plan_takes_one_request():
    """The read-back contract takes a ReadRequest (frameworks/base/plan.py): no ``read_plan`` of the registry or of
    a Framework spells the seven parameters again (the readers' own modules, verl/read.py and nemo_rl/read.py,
    take them unpacked)."""
    wide = []
    for p in _sources("frameworks"):
        if p.name == "read.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "read_plan":
                n = (
                    len(node.args.args)
                    + len(node.args.kwonlyargs)
                    - (node.args.args[:1] and node.args.args[0].arg == "self")
                )
                if n > 1:
                    wide.append(f"{p.relative_to(ROOT).as_posix()}:{node.lineno} ({n} parameters)")
    assert not wide, wide


POOLS_PENDING: set[str] = set()
"""Modules defining a second ``Pools`` (may only shrink; now none: trainer/separate.py's one process's place in a
separate-pool job is ``PoolRank``)."""


def test_one_placement_vocabulary():
    """core/placement.py defines the placement's types and names (Placement, the knobs, the pools of a separate
    placement); core/choices.py its modes. Elsewhere a module is named for what it does with them: the search over
    the placement (autotune/search/placement.py), the pricing of separate pools (costmodel/pools.py), the weight
    sync's transports (costmodel/weight_sync.py), the published pairs' scores (validate/placement_pairs.py)."""
    named = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "grpo_tune").rglob("placement.py"))
    assert named == ["grpo_tune/autotune/search/placement.py", "grpo_tune/core/placement.py"]
    modes: list[str] = []
    pools: list[str] = []
    for p in (ROOT / "grpo_tune").rglob("*.py"):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple) and [getattr(e, "value", None) for e in node.elts[:2]] == [
                "colocated",
                "separate",
            ]:
                modes.append(p.relative_to(ROOT).as_posix())
        rel = p.relative_to(ROOT).as_posix()
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in ("Pools", "pools"):
                pools.append(rel)
    assert modes == ["grpo_tune/core/choices.py"], modes
    assert sorted(p for p in pools if p not in POOLS_PENDING) == ["grpo_tune/core/placement.py"] * 2
    assert POOLS_PENDING <= set(pools)


_HW_PRICING_FIELDS = {"stack_engine", "engine_costs"}
"""HardwareSpec fields that name an engine as pricing state set from the stack (:func:`core.hardware.apply_stack`),
never read from a profile (``to_dict`` leaves them out): which engine the stack was fitted on, which of its
``[engines.<name>]`` tables the plan's engine brought in."""


def engine_in_hardware(root: Path = ROOT) -> list[str]:
    """Where the hardware still carries a rollout engine: a key naming one in a hardware profile, a HardwareSpec
    field naming one (less the stack's pricing state), an attribute ``native_rollout`` or a ``rollout_engine`` read
    off a hardware object (``hw``, ``hardware``, ``hw_r``, ``.hardware``) anywhere in the package."""
    out = []
    for p in sorted((root / "grpo_tune" / "profiles" / "hardware").glob("*.toml")):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            key = line.split("#", 1)[0].split("=", 1)[0].strip()
            if "=" in line.split("#", 1)[0] and "engine" in key:
                out.append(f"{p.relative_to(root).as_posix()}:{n}: {key}")
    hw_src = root / "grpo_tune" / "core" / "hardware.py"
    for node in ast.walk(ast.parse(hw_src.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "HardwareSpec":
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    name = st.target.id
                    if "engine" in name and name not in _HW_PRICING_FIELDS:
                        out.append(f"grpo_tune/core/hardware.py: HardwareSpec.{name}")
    hw_names = {"hw", "hardware", "hw_r", "hw0"}
    for p in sorted((root / "grpo_tune").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            base = node.value
            on_hw = (isinstance(base, ast.Name) and base.id in hw_names) or (
                isinstance(base, ast.Attribute) and base.attr == "hardware"
            )
            if node.attr == "native_rollout" or (node.attr == "rollout_engine" and on_hw):
                out.append(f"{p.relative_to(root).as_posix()}:{node.lineno}: .{node.attr}")
    return out


def test_the_engine_is_the_plans_not_the_hardwares():
    """Issue 37: the rollout engine left the hardware profile for the plan (``Strategy.rollout.engine``). A profile
    says what the platform is (``memory_is_host``: the cpu default engine, ``HardwareSpec.default_engine``); no
    profile names an engine and nothing reads one off the hardware."""
    assert not engine_in_hardware(), engine_in_hardware()


def test_the_engine_check_can_fail(tmp_path):
    """The tree as it was: a profile key, the HardwareSpec field, a cost-model read of each kind."""
    (tmp_path / "grpo_tune" / "profiles" / "hardware").mkdir(parents=True)
    (tmp_path / "grpo_tune" / "profiles" / "hardware" / "x.toml").write_text(
        'name = "x"\nrollout_engine = "vllm"   # engine\n# rollout_engine = "old"\n'
    )
    (tmp_path / "grpo_tune" / "core").mkdir()
    (tmp_path / "grpo_tune" / "core" / "hardware.py").write_text(
        "class HardwareSpec:\n    rollout_engine: str = 'vllm'\n    stack_engine: str = 'vllm'\n"
    )
    (tmp_path / "grpo_tune" / "timing.py").write_text(
        "def f(hw, cfg, t):\n    return hw.native_rollout, cfg.hardware.rollout_engine, t.rollout_engine\n"
    )
    assert engine_in_hardware(tmp_path) == [
        "grpo_tune/profiles/hardware/x.toml:2: rollout_engine",
        "grpo_tune/core/hardware.py: HardwareSpec.rollout_engine",
        "grpo_tune/timing.py:2: .native_rollout",
        "grpo_tune/timing.py:2: .rollout_engine",
    ]
