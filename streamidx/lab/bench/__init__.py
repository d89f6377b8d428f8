"""The benchmark, `python -m streamidx.bench` (docs/benchmarks.md; its modules:
ARCHITECTURE.md).
"""

from streamidx.lab.bench.harness import (IMPLEMENTATIONS, ORACLE_MAX_FLOPS,
                                         SCHEMA, run_long_context, run_sweep)
from streamidx.lab.bench.long_context import random_cache
from streamidx.lab.bench.report import format_table
from streamidx.lab.bench.shapes import parse_shape
from streamidx.lab.shapes import (LONG_CONTEXT, LONG_CONTEXT_KS, QUICK, SWEEP,
                                  Shape)

__all__ = [
    "IMPLEMENTATIONS", "ORACLE_MAX_FLOPS", "SCHEMA", "LONG_CONTEXT",
    "LONG_CONTEXT_KS", "QUICK", "SWEEP", "Shape", "format_table",
    "parse_shape", "random_cache", "run_long_context", "run_sweep",
]
