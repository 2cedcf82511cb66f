# Benchmarks write docs/bench/*.csv, *.png and regenerate the tables in docs/BENCHMARKS.md.
PY ?= .venv/bin/python

.PHONY: bench bench-quick test demo

bench:
	$(PY) -m benchmarks

bench-quick:
	$(PY) -m benchmarks --quick

test:
	./dev test

demo:
	./dev demo
