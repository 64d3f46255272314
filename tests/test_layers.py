"""The package layers, checked on the source (AST, nothing is imported): no import cycles between packages.

core -> costmodel -> autotune -> (runs/) -> trainer, with cli on top:
- core imports nothing of ours;
- costmodel imports only core;
- autotune imports core and costmodel;
- trainer imports core and costmodel (never autotune or cli);
- cli may import all of them.
Every import counts, including the ones inside functions: a lazy import hides a cycle, it does not remove it.
tests/test_imports.py checks the other rule (no torch/megatron/vllm in core, costmodel, autotune).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "costmodel", "autotune", "trainer", "cli")
ALLOWED = {
    "core": {"core"},
    "costmodel": {"core", "costmodel"},
    "autotune": {"core", "costmodel", "autotune"},
    "trainer": {"core", "costmodel", "trainer"},
    "cli": set(PACKAGES),
}


def _module_name(path: Path) -> str:
    """``grpo_tune.autotune.search`` for ``ROOT/grpo_tune/autotune/search.py``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Top-level package names of ours that ``path`` imports (absolute or relative, at any depth)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = _module_name(path).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = pkg[: len(pkg) - node.level + 1]
                if node.module:
                    names = [".".join([*base, node.module])]
                else:  # `from .. import x`: x is the module
                    names = [".".join([*base, a.name]) for a in node.names]
            else:
                names = [node.module or ""]
        else:
            continue
        found |= {_ours(n) for n in names} - {""}
    return found


def _ours(name: str) -> str:
    """The sub-package of ``grpo_tune`` that a dotted import name lands in ('' if not ours)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "grpo_tune" and len(parts) > 1 and parts[1] in PACKAGES else ""


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / "grpo_tune" / package).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_lower_layers(package):
    bad = {str(p.relative_to(ROOT)): sorted(imports_of(p) - ALLOWED[package]) for p in _sources(package)}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"{package} may import only {sorted(ALLOWED[package])}; found: {bad}"


def test_no_cycle_between_packages():
    edges = {pkg: set().union(*(imports_of(p) for p in _sources(pkg))) - {pkg} for pkg in PACKAGES}
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(n: str, path: list[str]) -> None:
        seen[n] = 1
        for m in sorted(edges[n]):
            assert seen.get(m) != 1, "import cycle: " + " -> ".join([*path, n, m])
            if m not in seen:
                visit(m, [*path, n])
        seen[n] = 2

    for pkg in PACKAGES:
        if pkg not in seen:
            visit(pkg, [])


def test_the_checker_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    """The checker itself can fail: a lazy import inside a function and a relative import are both found."""
    src = "def f():\n    from grpo_tune.autotune import search\n\nfrom . import launch\nfrom .. import cli\n"
    fake = tmp_path / "grpo_tune" / "trainer" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(src)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert imports_of(fake) == {"autotune", "trainer", "cli"}
