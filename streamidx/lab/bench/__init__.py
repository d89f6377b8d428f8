"""The benchmark, `python -m streamidx.bench` (flags: `cli`; what it shows:
docs/benchmarks.md). Columns: every token-mode variant of `streamidx.VARIANTS`
("kernel" the vendored one, "kernel:NAME" any other; block sizes from
`streamidx.block_sizes` for the detected generation), the reference (one
chunk per sequence), the streaming reference and the float64 `oracle` loop,
each on each shape in a fresh worker process (`harness.worker`: compile, one
warm-up call, `repeats` timed calls; peak RSS over the inputs beside XLA's
buffer assignment; on a TPU the profiler's device time against the
roofline). Every result is checked against the oracle within twice
`oracle.f32_score_bound` (the command exits 1 when one fails) and against
the reference's indices. Timings are never asserted.

Modules: `shapes`, `memory` (probes), `oracle`, `harness` (the worker
protocol, checks, `run`: one JSON schema), `report` (ratios, the table
writer, bench.png), `long_context` (streamed chunks against one chunk at 1M
tokens), `topk` (the top-k stage, --topk), `cli`.
"""

from streamidx.lab.bench.harness import (IMPLEMENTATIONS, ORACLE_MAX_FLOPS,
                                         SCHEMA, run_sweep)
from streamidx.lab.bench.long_context import random_cache, run_long_context
from streamidx.lab.bench.report import format_table
from streamidx.lab.bench.shapes import (LONG_CONTEXT, LONG_CONTEXT_KS, QUICK,
                                        SWEEP, Shape, parse_shape)

__all__ = [
    "IMPLEMENTATIONS", "ORACLE_MAX_FLOPS", "SCHEMA", "LONG_CONTEXT",
    "LONG_CONTEXT_KS", "QUICK", "SWEEP", "Shape", "format_table",
    "parse_shape", "random_cache", "run_long_context", "run_sweep",
]
