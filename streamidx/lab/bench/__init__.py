"""The benchmark: `python -m streamidx.bench` (see `streamidx.lab.bench.cli`)."""
