"""The Pallas kernels: kernel bodies, the one driver, the entry points.

    vendored   the vendored StreamIndex top-k kernel body (tpu-inference,
               Apache-2.0) with its local modifications (ledger M1-Mn in
               LEDGER.md beside it); packed FP8 or bf16 cache, one array;
               the one pipeline body, with hooks for the other variants (M16)
    dense      the dense FP8 cache's hooks into that body (values and e8m0
               scales in two arrays, 129 B/entry) and a core-parallel grid
               axis (`num_cores`)
    block_max  the "block_max" output every token body writes for
               "fused_blockmax": its buffer and the one hook that writes it
    lean       the dense FP8 cache with its own vector-lean pipeline (word
               loads, a one-block KV loop, e4m3b11fnuz on v5e/v6e)
    fp4        the MXFP4 cache's hooks into that body (e2m1 codes two per
               byte, an e8m0 scale per 32 values, 68 B/entry; M18, M19)
    select_blocktop  the "blocktop" top-k method: a Pallas selection
               kernel over the score buffer (each block's best entries,
               then the k winners sorted in the kernel), its
               `streamidx.topk` method record beside it
    tpu        the project's TPU helpers the bodies share (VMEM check, v4
               paths)
    driver     the wrapper pipeline every body shares (`KernelBody`, `run`,
               `checked_run`, `Entry`)
    entries    the drop-in entry points: `streamindex_topk`,
               `streamindex_page_topk`, `streamindex_topk_dense`,
               `streamindex_page_topk_dense`, `streamindex_topk_lean`,
               `streamindex_page_topk_lean`, `streamindex_topk_fp4`,
               `streamindex_page_topk_fp4`

A body imports `streamidx.semantics`, `kernels.tpu` and `kernels.block_max`
(dense also `kernels.vendored`, whose body it runs; fp4 also
`kernels.dense`, whose scale DMA it reuses); the driver imports
`streamidx.validate`, `modes`, `topk` and the vendored input preparation;
nothing imports `entries` except `streamidx.variants` and the package's top
level; `select_blocktop` imports `streamidx.modes` and
`streamidx.topk`'s base and "sort" method, and only `streamidx.topk`'s
registry imports it.
"""
