"""docs/architecture.md's layout table matches the tree: every path it names exists, every
module under rufus/, follower/, proxy/ and lab/ is named in it, and rufus/ itself stays small.
Its layer table orders the packages: every import points down it, and none closes a cycle.
The product never imports the lab, and scripts/ stay thin wrappers."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("rufus", "follower", "proxy", "lab")
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
    """scripts/ are thin wrappers over package functions (docs/architecture.md)."""
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
    """Any ``rufus/…``, ``proxy/…``, ``follower/…``, ``lab/…`` or ``scripts/…`` file the README
    or a document under docs/ names exists (not docs/benchmarks-history.md, whose dated rounds
    name the files of their day)."""
    missing = []
    docs = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks-history.md")
    for doc in dict.fromkeys((DOC, ROOT / "README.md", *docs)):
        for path in set(re.findall(r"\b((?:rufus|proxy|follower|lab|scripts)/[\w/]+\.(?:py|json))",
                                   doc.read_text())):
            if not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, f"paths named in the docs that do not exist: {sorted(missing)}"


# --- layers: imports point one way -------------------------------------------------------

SOURCES = ("rufus", "proxy", "follower", "lab", "scripts", "tests", "model_repository", "deploy",
           "docker")
# Cycles that stay until the code they join is split; each entry says what removes it.
KNOWN_CYCLES: dict[frozenset[str], str] = {}
# Who may import the lab (lab/): the lab itself, the scripts that run it, the tests.
LAB_IMPORTERS = ("lab/", "scripts/", "tests/")
# A script's usage text (its docstring, what --help prints) and the call of a package's
# main(): the longest today is 27 such lines.
MAX_SCRIPT_LINES = 40


@dataclass(frozen=True)
class Layers:
    """The rows of docs/architecture.md's "## Layers" table, top first: (name, paths)."""

    rows: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def read(cls, text: str | None = None) -> Layers:
        text = DOC.read_text() if text is None else text
        section = text[text.index("\n## Layers\n"):]
        section = section[:section.index("\n## ", 1)]
        rows = []
        for line in section.splitlines():
            cells = line.split("|")
            if len(cells) > 3 and cells[2].strip().startswith("`"):
                rows.append((cells[1].strip(), tuple(re.findall(r"`([^`]+)`", cells[2]))))
        return cls(tuple(rows))

    def place(self, rel: str) -> tuple[int, str] | None:
        """(height, layer) of the module at ``rel``: the row of the longest path that is the
        module or a folder above it; a higher row is a greater height. None: in no row."""
        best: tuple[int, int, str] | None = None
        for i, (name, paths) in enumerate(self.rows):
            for path in paths:
                if rel == path or (path.endswith("/") and rel.startswith(path)):
                    if best is None or len(path) > best[0]:
                        best = (len(path), len(self.rows) - i, name)
        return None if best is None else best[1:]


def module_name(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def project_modules() -> dict[str, str]:
    """Dotted name -> path of every module under SOURCES."""
    return {module_name(rel): rel for rel in sorted(
        str(f.relative_to(ROOT)) for top in SOURCES for f in (ROOT / top).rglob("*.py")
        if "__pycache__" not in f.parts)}


def _is_main_guard(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and [getattr(c, "value", None) for c in test.comparators] == ["__main__"])


def imports(rel: str, source: str) -> list[tuple[str, int]]:
    """(imported dotted name, line) of every import in a module, at any depth (functions,
    methods, ``TYPE_CHECKING``), relative ones resolved; not those under a top-level
    ``if __name__ == "__main__":`` (the program's). ``from a import b`` gives ``a.b``."""
    tree = ast.parse(source)
    package = module_name(rel) if rel.endswith("__init__.py") else module_name(rel).rpartition(".")[0]
    program = {id(n) for top in tree.body if _is_main_guard(top) for n in ast.walk(top)}
    found = []
    for node in ast.walk(tree):
        if id(node) in program:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[:len(parts) - node.level + 1], *filter(None, [base])])
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return found


def resolve(name: str, modules: dict[str, str]) -> str | None:
    """The path of the project module ``name`` is or lies in (None: not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return modules.get(name)


def uphill(rel: str, source: str, layers: Layers, modules: dict[str, str]) -> list[str]:
    """Each import of the module at ``rel`` that reaches a higher row than its own."""
    own = layers.place(rel)
    found: dict[str, None] = {}  # one entry per import line and module
    for name, line in imports(rel, source):
        target = resolve(name, modules)
        theirs = layers.place(target) if target else None
        if own and theirs and theirs[0] > own[0]:
            found[f"{rel}:{line} ({own[1]}) imports {module_name(target or '')} "
                  f"({theirs[1]})"] = None
    return list(found)


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module path -> the project modules it imports (every import, as :func:`imports`)."""
    modules = project_modules()
    graph = {}
    for rel in modules.values():
        targets = (resolve(n, modules) for n, _ in imports(rel, (ROOT / rel).read_text()))
        graph[rel] = frozenset(t for t in targets if t and t != rel)
    return graph


def cycles(graph: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_layer_table_is_found_and_names_what_exists():
    layers = Layers.read()
    assert len(layers.rows) >= 8 and layers.rows[0][0] == "programs"
    paths = [p for _, ps in layers.rows for p in ps]
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md's layer table names what is not there: {missing}"
    assert len(paths) == len(set(paths)), "a path in two rows of the layer table"


def test_every_module_has_a_layer():
    layers = Layers.read()
    unplaced = [rel for rel in project_modules().values() if layers.place(rel) is None]
    assert not unplaced, f"add to a row of docs/architecture.md's layer table: {unplaced}"


def test_no_uphill_import():
    """Every import, function-level ones included, points down docs/architecture.md's
    layer table (or stays in its row)."""
    layers, modules = Layers.read(), project_modules()
    found = [f for rel in modules.values()
             for f in uphill(rel, (ROOT / rel).read_text(), layers, modules)]
    assert not found, "uphill imports (docs/architecture.md, Layers):\n" + "\n".join(found)


def test_no_import_cycles():
    found = set(cycles(import_graph()))
    assert found <= set(KNOWN_CYCLES), "import cycles (function-level imports included): " + \
        "; ".join(" <-> ".join(sorted(c)) for c in found - set(KNOWN_CYCLES))
    gone = set(KNOWN_CYCLES) - found
    assert not gone, f"no longer a cycle, remove it from KNOWN_CYCLES: {gone}"


def test_the_checker_flags_an_uphill_import():
    """A module of the machine-and-settings row that learns a name from the CLI client, asks
    the planner's forward pass inside a function, or reaches the request path through a
    relative import in a method, is flagged: each import at its line. The same row, the row
    below, and the program under ``if __name__ == "__main__":`` are not."""
    layers, modules = Layers.read(), project_modules()
    source = (
        "import json\n"
        "from rufus.machine import cpu\n"
        "from rufus.errors import InvalidInput\n"
        "from rufus.client import CONVERSATION_HEADER\n"
        "def measure():\n"
        "    from rufus.qp.decoder.torch_llama import TorchLlama\n"
        "class Record:\n"
        "    def load(self):\n"
        "        from ..serving.triton_backend import TritonModel\n"
        "if __name__ == '__main__':\n"
        "    import rufus.qp.measure\n"
    )
    found = uphill("rufus/machine/precision.py", source, layers, modules)
    assert [f.split(" (")[0] for f in found] == [
        "rufus/machine/precision.py:4", "rufus/machine/precision.py:6",
        "rufus/machine/precision.py:9"], found
    assert "imports rufus.qp.decoder.torch_llama (models)" in found[1]
    assert "imports rufus.serving.triton_backend (Triton stub)" in found[2]
    # downhill, from the top row and through a parent-relative import: fine
    assert not uphill("scripts/x.py", "from rufus.launch.server import ROOT\n", layers, modules)
    assert not uphill("rufus/qp/decoder/x.py", "from ..plan import SEED_FILE\n", layers, modules)
    # a table in which the same import points up
    flipped = Layers((("low", ("rufus/machine/cpu.py",)), ("high", ("rufus/serving/",))))
    assert uphill("rufus/serving/metrics.py", "from rufus.machine import cpu\n", flipped,
                  modules) == ["rufus/serving/metrics.py:1 (high) imports "
                               "rufus.machine.cpu (low)"]


def test_the_cycle_finder_finds_a_hidden_cycle():
    graph = {"a.py": frozenset({"b.py"}), "b.py": frozenset({"c.py"}),
             "c.py": frozenset({"a.py"}), "d.py": frozenset({"a.py"})}
    assert cycles(graph) == [frozenset({"a.py", "b.py", "c.py"})]


# --- product apart from lab --------------------------------------------------------------

def lab_imports(source: str) -> list[tuple[str, int]]:
    """(name, line) of each import of the lab in ``source``, at any depth, those under
    ``if __name__ == "__main__":`` included; relative imports are never the lab's."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [(n, node.lineno) for n in names if n == "lab" or n.startswith("lab.")]
    return found


def test_nothing_but_scripts_and_tests_imports_the_lab():
    """The product never depends on the lab: no module outside lab/, scripts/ and tests/
    imports it."""
    found = [f"{rel}:{line} imports {name}" for rel in project_modules().values()
             if not rel.startswith(LAB_IMPORTERS)
             for name, line in lab_imports((ROOT / rel).read_text())]
    assert not found, "the product imports the lab:\n" + "\n".join(found)


def test_the_lab_checker_sees_every_kind_of_import():
    source = ("import lab.loadgen\nfrom lab import goodput\n"
              "def f():\n    from lab.qp.plan_bench import run\n"
              "if __name__ == '__main__':\n    import lab\n")
    assert lab_imports(source) == [("lab.loadgen", 1), ("lab", 2), ("lab.qp.plan_bench", 4), ("lab", 6)]
    assert lab_imports("import labels\nfrom rufus.lab import x\nfrom . import lab\n") == []


def test_scripts_are_thin_wrappers():
    """Every script is its usage text and the call of a package's ``main``: it defines no
    class and no function, and has at most MAX_SCRIPT_LINES lines that are neither blank nor
    comments. Logic goes to lab/ (or to the product, where it is product)."""
    fat = []
    for f in sorted((ROOT / "scripts").glob("*.py")):
        text = f.read_text()
        tree = ast.parse(text)
        defined = [n.name for n in ast.walk(tree)
                   if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        lines = [x for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]
        calls = re.findall(r"^from [\w.]+ import main\b", text, re.M)
        if defined or len(lines) > MAX_SCRIPT_LINES or len(calls) != 1:
            fat.append(f"{f.name}: defines {defined}, {len(lines)} lines, "
                       f"{len(calls)} `from <package> import main`")
    assert not fat, "scripts/ must stay thin wrappers:\n" + "\n".join(fat)
