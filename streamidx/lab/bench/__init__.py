"""The benchmark: the kernel variants, the jitted reference, the streaming
reference and a NumPy oracle, measured side by side at DeepSeek-V4 sizes.

    python -m streamidx.bench                  # the sweep (make bench)
    python -m streamidx.bench --quick          # small shapes, for CI
    python -m streamidx.bench --long-context   # streaming reference at 1M tokens
    python -m streamidx.bench --list           # the named shapes and columns
    python -m streamidx.bench --topk           # the top-k stage's methods

Modules:

    shapes        the Shape catalogue: SWEEP, QUICK, LONG_CONTEXT, parse_shape
    memory        /proc probes (one reader): peak RSS, MemAvailable; XLA's
                  buffer assignment
    harness       the implementations, the worker-process protocol, timing,
                  agreement checks, run_sweep (bench.json)
    report        ratios, text tables, bench.png
    long_context  the streaming reference at long context (long_context.json)
    oracle        the NumPy top-k
    topk          the top-k stage: every streamidx.topk method timed beside
                  the reference (--topk), compiled per TPU generation
                  (--topk --compile)
    cli           argparse and main

For each shape, every implementation runs in a fresh subprocess:

- kernel: the token-mode variants of `streamidx.VARIANTS`, compiled on a
  TPU, Pallas's TPU interpreter elsewhere (its CPU times measure the
  interpreter, not a TPU). Column "kernel" is the vendored
  `streamindex_topk`; each other token variant NAME is a column
  "kernel:NAME" (a new variant shows up with no edit here). Block sizes come
  from `streamidx.block_sizes(variant, cache_format=, num_heads=,
  page_size=, generation=<the detected TPU generation or None>)`; each
  result records them with their source;
- reference: `streamidx.streamindex_topk_ref` (one-shot, jitted);
- streaming: `streamidx.streaming.streamindex_topk_streaming` (jitted);
- oracle: `streamidx.lab.bench.oracle.oracle_topk`, a NumPy loop, only where
  its work (2 x visible pairs x heads x head_dim FLOPs) is under
  `ORACLE_MAX_FLOPS`.

What is measured, per implementation:

- wall time: compile first (ahead of time, `jit(...).lower().compile()`,
  reported as compile_s), one warm-up call, then `repeats` calls each timed
  with `time.perf_counter` around the call and `block_until_ready`; the
  median is reported with the min and max as the spread.
- entries/s: visible (query row, entry) pairs scored, divided by the median.
  The same count for every implementation (`ref.visible_counts`).
- peak memory: the process's resident set, from Linux's /proc/self/status
  (`memory.PeakMemory`). Just before the warm-up call the peak (VmHWM) is
  reset and VmRSS is read: `peak_over_inputs` is VmHWM after the calls
  minus that VmRSS, the memory the call adds on top of its inputs and
  compiled program. Subprocesses keep one implementation's freed buffers
  from hiding another's. XLA's own buffer assignment
  (`compiled.memory_analysis()`: temp bytes) is reported next to it, a
  compile-time figure. Off Linux, the peak is ru_maxrss since the process
  started (the method is recorded).
- on a TPU: device time per call from a `jax.profiler` trace
  (`streamidx.lab.model.profiling`: the kernel's "StreamIdx*" ops, the
  top-k, the rest), against the roofline bound of the vendored kernel call
  on that generation (`streamidx.lab.model.roofline` over
  `streamidx.lab.model.tiling`'s plan of it, rates from
  `streamidx.lab.model.hardware`). Never run on CPU; not yet run on a TPU
  either.

Every result is checked twice, untimed:

- against the NumPy oracle (`oracle.oracle_topk`, float32 NumPy arithmetic
  on keys decoded by `streamidx.cache`) on every row of small batches and
  the first and last 8 rows of larger ones: tie-aware
  (`metrics.compare_topk`) with atol = 2 x `oracle.f32_score_bound`, a
  derived bound on float32 rounding, so it holds whatever order either side
  sums in. This check is independent of the reference and covers it too;
  the command exits with status 1 when any implementation fails it.
- against the reference's indices: identical arrays, or tie-aware with
  exact ties (atol 0) against the reference's scores.

Timings are never asserted anywhere; the README quotes ratios between
implementations measured in one run.

Results: a table on the terminal, `<out>/bench.json` (schema
`harness.SCHEMA`: each result names its column `impl` and, for kernel
columns, its `variant`, `cache_format` and `blocks`), `<out>/bench.png`.
"""

from streamidx.lab.bench.harness import (IMPLEMENTATIONS, ORACLE_MAX_FLOPS,
                                         SCHEMA, run_sweep)
from streamidx.lab.bench.long_context import (LONG_SCHEMA, long_context_args,
                                              random_cache, run_long_context)
from streamidx.lab.bench.report import format_long_table, format_table
from streamidx.lab.bench.shapes import (LONG_CONTEXT, LONG_CONTEXT_KS, QUICK,
                                        SWEEP, Shape, parse_shape)

__all__ = [
    "IMPLEMENTATIONS", "ORACLE_MAX_FLOPS", "SCHEMA", "LONG_SCHEMA",
    "LONG_CONTEXT", "LONG_CONTEXT_KS", "QUICK", "SWEEP", "Shape",
    "format_long_table", "format_table", "long_context_args", "parse_shape",
    "random_cache", "run_long_context", "run_sweep",
]
