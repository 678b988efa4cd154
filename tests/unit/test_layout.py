"""docs/architecture.md's layout table matches the tree: every path it names exists, every
module under rufus/, follower/ and proxy/ is named in it, and rufus/ itself stays small."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("rufus", "follower", "proxy")
MAX_TOP_LEVEL = 4  # rufus/*.py: the package marker, the client, the env reader, one spare


def layout_rows() -> list[tuple[list[str], str]]:
    """(paths, what-it-holds text) of each layout-table row."""
    text = DOC.read_text()
    section = text[text.index("## Layout: packages by process role"):]
    section = section[:section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = line.split("|")
            rows.append((re.findall(r"`([^`]+)`", cells[1]), "|".join(cells[3:])))
    return rows


def layout_paths() -> list[str]:
    """The backticked paths in the first column of the layout table."""
    return [p for paths, _ in layout_rows() for p in paths]


def test_the_table_is_found():
    paths = layout_paths()
    assert "rufus/client.py" in paths and "follower/node.py" in paths and len(paths) > 40


def test_every_path_in_the_layout_table_exists():
    missing = [p for p in layout_paths() if not (ROOT / p).exists()]
    assert not missing, f"named in docs/architecture.md's layout table but missing: {missing}"


def test_every_module_is_in_the_layout_table():
    named = set(layout_paths())
    modules = sorted(str(f.relative_to(ROOT)) for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")
                     if "__pycache__" not in f.parts)
    unnamed = [m for m in modules if m not in named]
    assert not unnamed, f"add a row to docs/architecture.md's layout table for: {unnamed}"


def test_rufus_keeps_a_handful_of_top_level_modules():
    top = sorted(f.name for f in (ROOT / "rufus").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"rufus/ top level {top}: put new code in a role package"


def test_no_script_imports_another_script():
    """scripts/ are argparse wrappers over package functions (docs/architecture.md)."""
    scripts = sorted((ROOT / "scripts").glob("*.py"))
    names = {f.stem for f in scripts}
    for f in scripts:
        text = f.read_text()
        imported = set(re.findall(r"^\s*(?:from|import)\s+(?:scripts\.)?(\w+)", text, re.M))
        assert not (imported & (names - {f.stem})) and "scripts." not in " ".join(
            re.findall(r"^\s*(?:from|import)\s+\S+", text, re.M)), f"{f.name} imports a script"
        # the only path a script may add is the project root (parents[1]), not scripts/
        assert "Path(__file__).parent)" not in text and "Path(__file__).resolve().parent)" \
            not in text, f"{f.name} puts scripts/ on sys.path"


def test_names_in_the_layout_table_exist_in_their_module():
    """A class (``EngineHost``) or function (``run_generate``) the table names for a module
    appears in that module's source: a rename or a move cannot leave the table behind."""
    stale = []
    for paths, what in layout_rows():
        sources = [ROOT / p for p in paths if p.endswith(".py") and (ROOT / p).is_file()]
        if len(sources) != 1:
            continue
        src = sources[0].read_text()
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)(?:\.\w+)?(?:\(\))?`", what):
            is_class = name[0].isupper() and any(c.islower() for c in name)
            is_func = "_" in name and name.islower()
            if (is_class or is_func) and not re.search(rf"\b{name}\b", src):
                stale.append(f"{paths[0]}: {name}")
    assert not stale, f"docs/architecture.md's layout table names what is not there: {stale}"


def test_every_module_path_in_the_docs_exists():
    """Any ``rufus/…``, ``proxy/…``, ``follower/…`` or ``scripts/…`` file the architecture
    document or the README names exists."""
    missing = []
    for doc in (DOC, ROOT / "README.md"):
        for path in set(re.findall(r"\b((?:rufus|proxy|follower|scripts)/[\w/]+\.(?:py|json))",
                                   doc.read_text())):
            if not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, f"paths named in the docs that do not exist: {sorted(missing)}"
