"""The benchmark (`python -m streamidx.bench`, flags in `cli`): every
token-mode kernel variant of `streamidx.VARIANTS` (column "kernel" the
vendored one, "kernel:NAME" any other: a new variant shows up with no edit
here; compiled on a TPU, interpreted elsewhere, block sizes from
`streamidx.block_sizes` for the detected generation), the reference (the
engine of `streamidx.ref`, one chunk per sequence, jitted), the streaming
reference (chunks of entries) and the float64 `oracle` loop (under
`ORACLE_MAX_FLOPS`), each on each shape in a fresh worker process.

Measured (`harness.worker`): compile time; one warm-up call, then `repeats`
calls (median, min, max of `time.perf_counter` around call and
`block_until_ready`); visible entries per second; peak RSS over the inputs
(`memory.PeakMemory`) beside XLA's buffer assignment; on a TPU, device time
from a profiler trace against the roofline (`harness.device_times`).
Checked, untimed (`harness.agreement`): against the oracle, tie-aware within
2 x `oracle.f32_score_bound` (the oracle shares only `ref.score_entries`
with the reference, so it checks the reference too; the command exits 1 when
a result fails it), and against the reference's indices (identical, or
exact ties). Timings are never asserted.

Modules: `shapes`, `memory`, `oracle`, `harness` (worker protocol, checks,
`run`: one JSON schema), `report` (ratios, the table writer, bench.png),
`long_context` (streamed against one chunk at 1M tokens), `topk` (the top-k
stage, --topk), `cli`.
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
