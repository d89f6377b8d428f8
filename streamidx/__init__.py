"""streamidx: the StreamIndex top-k Pallas kernel, its exact reference, and
the cache formats and batches they read.

    streamindex_topk / streamindex_page_topk          the kernels (Pallas TPU;
                                                      interpreted off-TPU)
    streamindex_topk_ref / streamindex_page_topk_ref  pure-JAX twins
    interpreter(...)                                  force the TPU interpreter
    cache, batch                                      FP8/bf16 cache, ragged batches
"""

from streamidx import batch, cache, modes, ref, validate
from streamidx.batch import (IndexerInputs, RaggedBatch, make_batch,
                             make_inputs, make_mixed_batch)
from streamidx.kernel import (CAUSAL_RULES, DEFAULT_VMEM_LIMIT_BYTES,
                              streamindex_page_topk, streamindex_topk)
from streamidx.modes import (describe_machine, interpreter, kernel_mode,
                             races_found, reset_interpreter_state,
                             set_interpreter)
from streamidx.ref import (page_scores, streamindex_page_topk_ref,
                           streamindex_topk_ref, token_scores)

__version__ = "0.1.0"

__all__ = [
    "CAUSAL_RULES", "DEFAULT_VMEM_LIMIT_BYTES", "IndexerInputs", "RaggedBatch",
    "batch", "cache", "describe_machine", "interpreter", "kernel_mode",
    "make_batch", "make_inputs", "make_mixed_batch", "modes", "page_scores",
    "races_found", "ref", "reset_interpreter_state", "set_interpreter",
    "streamindex_page_topk", "streamindex_page_topk_ref", "streamindex_topk",
    "streamindex_topk_ref", "token_scores", "validate",
]
