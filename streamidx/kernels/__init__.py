"""The Pallas kernels, one module per kernel.

    vendored   the vendored StreamIndex top-k kernel (tpu-inference, Apache-2.0)
               with its local modifications (ledger M1-Mn in its header):
               `streamindex_topk` (token mode) and `streamindex_page_topk`

A kernel module imports `streamidx.semantics` (shared rules),
`streamidx.validate` (static checks) and `streamidx.modes` (compiled or
interpreted); nothing imports a kernel module except `streamidx.variants`,
`streamidx.checked` and the package's top level.
"""
