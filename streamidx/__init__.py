"""streamidx: the StreamIndex top-k Pallas kernel, its exact reference, and
the cache formats and batches they read.

    streamindex_topk / streamindex_page_topk          the kernels (Pallas TPU;
                                                      interpreted off-TPU)
    streamindex_topk_ref / streamindex_page_topk_ref  pure-JAX twins
    interpreter(...), race_check()                    force the TPU interpreter
    validate_topk_inputs / checked_streamindex_topk   value checks (and in jit)
    cache, batch                                      FP8/bf16 cache, ragged batches
    metrics                                           tie-aware parity, recall

Further modules, imported on demand: layout, quant, plots (notebooks 01-02),
hardware, roofline, tiling, timeline, profiling (03, 05), parity (04),
streaming, bench (the benchmark), workbook (the notebook runner).
"""

from streamidx import batch, cache, metrics, modes, params, ref, validate
from streamidx.batch import (IndexerInputs, RaggedBatch, make_batch,
                             make_inputs, make_mixed_batch)
from streamidx import kernel as _kernel
from streamidx.kernel import CAUSAL_RULES, DEFAULT_VMEM_LIMIT_BYTES
from streamidx.modes import (describe_machine, interpreter, kernel_mode,
                             race_check, races_found, reset_interpreter_state,
                             set_interpreter)
from streamidx.ref import (page_scores, streamindex_page_topk_ref,
                           streamindex_topk_ref, token_scores)
from streamidx.validate import (checked_streamindex_page_topk,
                                checked_streamindex_topk,
                                validate_page_topk_inputs,
                                validate_topk_inputs)

# The vendored jitted kernels, returning finished results when they run
# interpreted (see `streamidx.modes.blocking_when_interpreted`);
# `streamidx.kernel.*` are the bare jitted functions.
streamindex_topk = modes.blocking_when_interpreted(_kernel.streamindex_topk)
streamindex_page_topk = modes.blocking_when_interpreted(
    _kernel.streamindex_page_topk)

__version__ = "0.1.0"

__all__ = [
    "CAUSAL_RULES", "DEFAULT_VMEM_LIMIT_BYTES", "IndexerInputs", "RaggedBatch",
    "batch", "cache", "checked_streamindex_page_topk",
    "checked_streamindex_topk", "describe_machine", "interpreter",
    "kernel_mode", "make_batch", "make_inputs", "make_mixed_batch", "metrics",
    "modes", "page_scores", "params", "race_check", "races_found", "ref",
    "reset_interpreter_state", "set_interpreter",
    "validate_page_topk_inputs", "validate_topk_inputs",
    "streamindex_page_topk", "streamindex_page_topk_ref", "streamindex_topk",
    "streamindex_topk_ref", "token_scores", "validate",
]
