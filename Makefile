# The dev loop in tiers, fastest first. `make check` runs the first three; `./dev test` (what CI runs) runs it and then
# the whole suite. Benchmarks write docs/bench/*.csv, *.png and regenerate docs/BENCHMARKS.md.
PY ?= .venv/bin/python
CODE = imp_core tests benchmarks dags plugins
WORKERS ?= $(or $(IMP_TEST_WORKERS),2)
# the unit tier: no Spark, Postgres, Airflow or browser, nothing marked slow; a quarter of each property test's
# examples (the hypothesis profile `unit`, tests/conftest.py). The whole suite runs every test and every example.
UNIT = not spark and not postgres and not airflow and not browser and not slow

.PHONY: lint types unit check test constraints bench bench-quick bench-report demo

# `ruff format --check` skips the files listed in pyproject.toml's [tool.ruff.format] exclude: they predate the
# formatter and are formatted in one commit when no branch is open (formatting them now would conflict with every
# branch). Every other file, new ones included, must be formatted: `$(PY) -m ruff format FILE`.
lint:
	$(PY) -m ruff check $(CODE)
	$(PY) -m ruff format --check $(CODE)

# mypy over imp_core as configured in pyproject.toml ([tool.mypy]: strict for plan/ and sketch/)
types:
	$(PY) -m mypy

# exit code 5 (no tests collected) is a failure too
unit:
	$(PY) -m pytest -q -n $(WORKERS) --hypothesis-profile=unit -m "$(UNIT)"

check: lint types unit

test:
	./dev test

# constraints.txt: the versions the suite passes with, which ./dev setup installs (pip -c). After upgrading
# packages in .venv and running the whole suite green, refresh it and commit it.
constraints:
	$(PY) -m pip freeze --exclude-editable | grep -v -i -E '^(imp-spark|imp_spark)[ =@]' > constraints.txt

bench:
	$(PY) -m benchmarks

bench-quick:
	$(PY) -m benchmarks --quick

# regenerate docs/BENCHMARKS.md's tables from docs/bench/*.csv without running anything
bench-report:
	$(PY) -m benchmarks --report

demo:
	./dev demo
