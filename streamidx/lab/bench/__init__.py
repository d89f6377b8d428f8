"""The benchmark, `python -m streamidx.bench` (docs/benchmarks.md; its modules:
ARCHITECTURE.md).
"""
