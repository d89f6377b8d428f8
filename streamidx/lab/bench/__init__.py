"""The benchmark: the kernel variants, the reference (one chunk), the
streaming reference (chunks of entries) and a plain oracle loop, measured
side by side at DeepSeek-V4 sizes. Commands: `streamidx.lab.bench.cli`.

Modules: `shapes` (SWEEP, QUICK, LONG_CONTEXT, parse_shape), `memory` (/proc
probes, XLA's buffer assignment), `harness` (worker processes, timing,
agreement checks, run_sweep: bench.json), `report` (ratios, tables,
bench.png), `long_context` (one chunk against streamed chunks at 1M tokens:
long_context.json), `oracle` (the loop), `topk` (the top-k stage's methods,
--topk), `cli`.

The implementations, each on each shape in a fresh subprocess:

- kernel: every token-mode variant of `streamidx.VARIANTS` (column "kernel"
  the vendored `streamindex_topk`, "kernel:NAME" any other: a new variant
  shows up with no edit here), compiled on a TPU, Pallas's TPU interpreter
  elsewhere (its CPU times measure the interpreter). Block sizes from
  `streamidx.block_sizes(variant, cache_format=, num_heads=, page_size=,
  generation=<the detected TPU generation or None>)`, recorded with source;
- reference: `streamidx.streamindex_topk_ref`, jitted: the engine of
  `streamidx.ref` with all of a sequence's entries in one chunk;
- streaming: `streamidx.streaming.streamindex_topk_streaming`, jitted: the
  same engine over chunks of `DEFAULT_CHUNK_ENTRIES` entries;
- oracle: `oracle.oracle_topk`, a loop over rows in float64, only where its
  work (2 x visible pairs x heads x head_dim FLOPs) is under
  `ORACLE_MAX_FLOPS`.

Measured per implementation: wall time (compiled ahead of time, reported as
compile_s; one warm-up call; then `repeats` calls, each `time.perf_counter`
around the call and `block_until_ready`; median, min, max); entries/s
(visible (row, entry) pairs, `ref.visible_counts`, over the median); peak
memory (`memory.PeakMemory`: VmHWM reset just before the warm-up call, minus
VmRSS then: `peak_over_inputs`), next to XLA's buffer assignment
(`compiled.memory_analysis()`); on a TPU, device time per call from a
`jax.profiler` trace (`streamidx.lab.model.profiling`) against the roofline
bound of the vendored kernel call (`streamidx.lab.model.roofline` over
`streamidx.lab.model.tiling`'s plan; never run on CPU, not yet on a TPU).

Checked, untimed: against the oracle on every row of small batches and the
first and last 8 rows of larger ones, tie-aware (`metrics.compare_topk`)
with atol = 2 x `oracle.f32_score_bound`, a derived bound on float32
rounding (the oracle shares only `ref.score_entries` with the reference, not
its engine or float32 arithmetic, so it covers the reference too; the command
exits 1 when any implementation fails it); and against the reference's indices:
identical, or tie-aware with exact ties (atol 0) on the reference's scores.
Timings are never asserted; the README quotes ratios measured in one run.
Results: a table on the terminal, `<out>/bench.json` (`harness.SCHEMA`),
`<out>/bench.png`.
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
