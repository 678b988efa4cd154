"""The counts issue 61 tracks, for a tree (default: this checkout): modules over 600 lines,
functions over 80, ``RUFUS_*`` names (written in product code, and declared: the names
docs/configuration.md lists, a parameter's derived ``RUFUS_<KEY>`` included), direct
environment reads and ``# type: ignore``.

    python -m lab.code_counts [TREE]

Product code only: rufus/, proxy/, follower/, deploy/ (not lab/, scripts/ or tests/).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

PRODUCT = ("rufus", "proxy", "follower", "deploy")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
ENV_READ = re.compile(r"os\.environ(?:\.get)?\s*[\[(]|os\.getenv\s*\(")


def counts(tree: Path) -> dict[str, object]:
    """Each count with the worst offenders named."""
    modules, functions, names, env_reads, ignores = [], [], set(), [], 0
    for top in PRODUCT:
        for path in sorted((tree / top).rglob("*.py")):
            src = path.read_text(encoding="utf-8")
            rel = str(path.relative_to(tree))
            lines = src.count("\n")
            if lines > MAX_MODULE_LINES:
                modules.append((rel, lines))
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        functions.append((rel, node.name, n))
            names.update(re.findall(r"\bRUFUS_[A-Z0-9_]+", src))
            env_reads += [rel] * len(ENV_READ.findall(src))
            ignores += src.count("# type: ignore")
    doc = tree / "docs" / "configuration.md"  # every declared name, derived ones included
    declared = set(re.findall(r"\bRUFUS_[A-Z0-9_]+", doc.read_text(encoding="utf-8"))) \
        if doc.is_file() else set()
    return {"modules_over_600": sorted(modules, key=lambda m: -m[1]),
            "functions_over_80": sorted(functions, key=lambda f: -f[2]),
            "rufus_names": len(names), "declared_names": len(declared),
            "env_reads": len(env_reads),
            "env_read_files": len(set(env_reads)), "type_ignores": ignores}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.code_counts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", nargs="?", type=Path, default=Path(__file__).resolve().parents[1],
                    help="a checkout (default: this one)")
    c = counts(ap.parse_args(argv).tree)
    mods, fns = c["modules_over_600"], c["functions_over_80"]
    assert isinstance(mods, list) and isinstance(fns, list)
    print(f"modules over {MAX_MODULE_LINES} lines: {len(mods)}  "
          + ", ".join(f"{m} ({n})" for m, n in mods))
    print(f"functions over {MAX_FUNCTION_LINES} lines: {len(fns)}  "
          + ", ".join(f"{m}:{f} ({n})" for m, f, n in fns))
    print(f"RUFUS_* names: {c['rufus_names']} written in product code, {c['declared_names']} "
          f"declared (docs/configuration.md); direct environment reads: {c['env_reads']} in "
          f"{c['env_read_files']} files; '# type: ignore': {c['type_ignores']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
