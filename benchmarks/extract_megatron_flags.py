"""Extract the typed flag table of Megatron-LM's argument parser into grpo_tune/autotune/data/.

    python benchmarks/extract_megatron_flags.py PATH/TO/megatron/training/arguments.py COMMIT > \
        grpo_tune/autotune/data/megatron-lm-arguments.json

Reads ``arguments.py`` with :mod:`ast` (nothing of Megatron is imported or copied): for every
``*.add_argument(...)`` call, its option strings and the keywords argparse checks a command line with
(``action``, ``type``, ``nargs``, ``choices``), as literals. A ``type`` that is not int/float/str (one of
Megatron's own converters) is recorded as ``"custom"`` and accepted as a string; a non-literal ``choices`` as
none. ``tests/test_export_megatron.py`` builds an ``argparse`` parser from the table and parses every
emitted ``megatron_args.txt`` with it, as Megatron's ``parse_args`` would (``allow_abbrev=False``).
"""

from __future__ import annotations

import ast
import json
import sys


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return None


def extract(source: str) -> list[dict]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not flags or not all(f.startswith("-") for f in flags):
            continue
        row: dict = {"flags": flags}
        for kw in node.keywords:
            if kw.arg == "action":
                v = kw.value
                row["action"] = (
                    v.value if isinstance(v, ast.Constant) else v.attr if isinstance(v, ast.Attribute) else "custom"
                )
            elif kw.arg == "type":
                name = kw.value.id if isinstance(kw.value, ast.Name) else None
                row["type"] = name if name in ("int", "float", "str") else "custom"
            elif kw.arg == "nargs":
                row["nargs"] = _literal(kw.value)
            elif kw.arg == "choices":
                ch = _literal(kw.value)
                if isinstance(ch, (list, tuple)):
                    row["choices"] = list(ch)
            elif kw.arg == "const":
                row["const"] = True
        out.append(row)
    out.sort(key=lambda r: r["flags"][0])
    return out


def main(argv: list[str]) -> int:
    path, commit = argv[1], argv[2]
    rows = extract(open(path, encoding="utf-8").read())
    doc = {
        "source": "github.com/NVIDIA/Megatron-LM megatron/training/arguments.py",
        "commit": commit,
        "extracted_by": "benchmarks/extract_megatron_flags.py",
        "arguments": rows,
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
