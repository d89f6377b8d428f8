"""streamidx: the StreamIndex top-k Pallas kernels (`streamindex_topk`,
`streamindex_page_topk` and their dense-FP8, lean, inline-FP8 and MXFP4
twins), their exact references, value checks, cache formats, batches and
variants. This is the core, what a serving engineer imports; it loads no
plotting or notebook code (`streamidx.lab`). ARCHITECTURE.md is the one description of the layout.
"""

from streamidx import batch, blocks, cache, metrics, modes, ref, semantics
from streamidx import records, sharded, streaming, topk, validate, variants
from streamidx.batch import (IndexerInputs, RaggedBatch, make_batch,
                             make_inputs, make_mixed_batch)
from streamidx.cache import (pack_dense_fp8_cache, pack_inline_fp8_cache,
                             pack_mxfp4_cache)
from streamidx.call import PageCall, TopkCall
from streamidx.kernels.entries import (
    streamindex_page_topk, streamindex_page_topk_dense,
    streamindex_page_topk_fp4, streamindex_page_topk_lean, streamindex_topk,
    streamindex_topk_dense, streamindex_topk_fp4, streamindex_topk_inline,
    streamindex_topk_lean)
from streamidx.modes import (compile_for, describe_machine, interpreter,
                             interpreter_internals_missing, kernel_mode,
                             race_check, races_found, reset_interpreter_state,
                             set_interpreter)
from streamidx.ref import (page_scores, streamindex_page_topk_ref,
                           streamindex_topk_ref, token_scores)
from streamidx.semantics import CAUSAL_RULES, DEFAULT_VMEM_LIMIT_BYTES
from streamidx.topk import TOPK_METHODS, select_topk
from streamidx.variants import VARIANTS, Variant, block_sizes

# Each entry point's twins: behind the value rules inside jit (checkify),
# and the eager value check (`streamidx.kernels.driver.Entry`).
checked_streamindex_topk = streamindex_topk.checked
checked_streamindex_page_topk = streamindex_page_topk.checked
checked_streamindex_topk_dense = streamindex_topk_dense.checked
checked_streamindex_page_topk_dense = streamindex_page_topk_dense.checked
validate_topk_inputs = streamindex_topk.validate
validate_page_topk_inputs = streamindex_page_topk.validate
validate_topk_dense_inputs = streamindex_topk_dense.validate
validate_page_topk_dense_inputs = streamindex_page_topk_dense.validate
# The dense entry points' reference twins: the cache pair as one argument.
streamindex_topk_dense_ref = VARIANTS["dense"].reference
streamindex_page_topk_dense_ref = VARIANTS["dense_page"].reference

__version__ = "0.1.0"

# Every public name above (the submodules `kernels` and `call` too).
__all__ = sorted(n for n in dir() if not n.startswith("_"))
