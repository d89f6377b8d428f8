"""Block sizes as data: one table, keyed by what they depend on, with sources.

Every caller asks `streamidx.block_sizes(...)`. A row matches a call when
each of its keys equals the call's or is a wildcard (`"*"` / `None`); the
most specific matching row wins (most non-wildcard keys; then the later).
Rows are only taken when legal for the page size (token mode: `page_size *
num_kv_pages_per_block` a multiple of 128); else `heuristic` builds one.

Keys:  generation (None at lookup: `modes.current_generation()`), variant,
       cache_format, num_heads, page_size, decode_q_len (None: any).
Sizes: num_kv_pages_per_block, num_queries_per_block (an int or a
       (decode, prefill, mixed) triple), decode_req_batch_size (token mode)
       and vmem_limit_bytes (None: the kernel's default).

Page mode's generic rows leave num_queries_per_block None: `lookup` derives
it for the call (`page_query_rows`: the most rows, a power of two <= 512,
within `check_page_rows`' bounds and the chip's VMEM); `streamidx.validate`
applies `check_page_rows` and `check_page_kv_block` to every page-mode call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from streamidx import cache as cache_lib
from streamidx import modes, records, semantics
from streamidx.semantics import LANES, cdiv, mib, normalize_per_case

WILDCARD = "*"

# Page mode (`page_query_rows`, `check_page_rows`).
PAGE_KV_PAGES = 128  # pages per KV block: one lane row of page maxima
PAGE_MAX_QUERY_ROWS = 512  # the vendored streamindex_page_topk's default
# Per KV block the kernel computes, unrolled whole by Mosaic, the f32 scores
# of every query row, head and entry (the score block: rows x heads x 128
# pages x page_size x 4 B), then their weighted head sums (the summed
# block, rows x 128 pages x page_size x 4 B), which it max-pools by page:
# the program the compiler schedules, and the VMEM it spills to, grow with
# both. Bounds: GLM's row, 32 query rows x 32 heads x 8192 entries.
PAGE_SCORE_BLOCK_BYTES = 32 * 2**20
PAGE_SUMMED_BLOCK_BYTES = 1 * 2**20
PAGE_BLOCK_SOURCE = (
    "GLM's row, 32 query rows x 32 heads x 8192 entries (the compile matrix "
    "and static schedule: 64 rows compiled in 45 s and 128 rows in 139 s on "
    "v6e, 32 rows in 11 s); compiled for v5e, no TPU, libtpu 0.0.42.1, one "
    "launch: the vendored 512 rows ran out of scoped VMEM (E1001) at 64 "
    "heads (at 128-entry pages no result after 16 CPU-min) and at 16 heads "
    "of 64-entry FP8 pages (65.29 MiB of 64 MiB), and took 67-147 CPU-s at "
    "16 heads of 64- and 128-entry pages; at one head "
    "compile time grows with the summed block (64-entry pages: 11.6 CPU-s "
    "at 64 rows, 62-entry pages 6.7 at 32 and 12.8 at 64; 512 rows took "
    "over 5 CPU-min and 11 GB), at 64 heads with the score block too "
    "(128-entry pages: 13.1 CPU-s at 8 rows, 20.8 at 32)")
# The MXFP4 page kernel unpacks a whole KV block in VMEM (e4m3 values, f32
# scale rows: kernels/fp4.py), whatever the query rows: its values per
# block, 128 pages x page_size x head_dim padded to 128, at most this.
PAGE_MXFP4_BLOCK_VALUES = 4 * 2**20
PAGE_MXFP4_BLOCK_SOURCE = (
    "compiled, no TPU, libtpu 0.0.42.1, one launch at 4 heads: 256-entry "
    "pages at head_dim 128 and 128-entry pages at head_dim 256 (4 Mi "
    "values) compiled on v5e, v6e and v7x; on v6e 192-entry pages at "
    "head_dim 256 (6 Mi) needed 79.80 MiB of scoped VMEM of 64 MiB (E1001) "
    "at 8 query rows, 256-entry pages (8 Mi) 114.19 MiB at one row")
# TPU v4's packed FP8 page kernel widens its KV block to bf16 (M10) and pools
# its pages by lane segments (M15): at most this many entries a KV block.
PAGE_V4_FP8_BLOCK_ENTRIES = 8192
PAGE_V4_FP8_BLOCK_SOURCE = (
    "compiled for v4, no TPU, libtpu 0.0.42.1 (python -m streamidx.aot "
    "--generations v4 --variants vendored_page --formats fp8 --shapes "
    "glm-page-prefill page-64h-prefill): 64-entry pages (8,192 entries a "
    "block) compiled; 128-entry pages (16,384) ran out of VMEM, 26.7-27.0 "
    "MiB of 16 MiB, at 8, 16, 32 and 64 heads and 4 or 8 query rows")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """One row of the table: where it applies, the sizes, and their source."""

  generation: str
  variant: str
  cache_format: str
  num_heads: int | None
  page_size: int | None
  num_kv_pages_per_block: Any
  num_queries_per_block: Any
  decode_req_batch_size: int | None = None
  vmem_limit_bytes: int | None = None
  source: str = ""
  decode_q_len: int | None = None

  specificity = property(lambda self: sum(
      k != WILDCARD for k in (self.generation, self.variant, self.cache_format)
  ) + sum(k is not None for k in (self.num_heads, self.page_size,
                                  self.decode_q_len)))

  def matches(self, *, generation, variant, cache_format, num_heads,
              page_size, decode_q_len=1) -> bool:
    return ((self.generation in (WILDCARD, generation))
            and self.decode_q_len in (None, decode_q_len)
            and self.variant in (WILDCARD, variant)
            and self.cache_format in (WILDCARD, cache_format)
            and self.num_heads in (None, num_heads)
            and self.page_size in (None, page_size))

  def kwargs(self) -> dict:
    """The kernel keyword arguments this row sets."""
    out = dict(num_kv_pages_per_block=self.num_kv_pages_per_block,
               num_queries_per_block=self.num_queries_per_block)
    if self.decode_req_batch_size is not None:
      out["decode_req_batch_size"] = self.decode_req_batch_size
    if self.vmem_limit_bytes is not None:
      out["vmem_limit_bytes"] = self.vmem_limit_bytes
    return out


def _token(generation, variant, cache_format, source, heads=None, page=None,
           kv=(3, 2, 2), **kw) -> BlockSizes:
  """A token-mode row: (1, 128, 128) query rows, 4 decode sequences."""
  return BlockSizes(generation, variant, cache_format, heads, page,
                    num_kv_pages_per_block=kv,
                    num_queries_per_block=(1, 128, 128),
                    decode_req_batch_size=4, source=source, **kw)


def _page(variant, cache_format, source, heads=None, page=None,
          rows=None) -> BlockSizes:
  """A page-mode row for any generation: 128 pages per KV block; rows
  None: derived for each call (`page_query_rows`)."""
  return BlockSizes(WILDCARD, variant, cache_format, heads, page,
                    num_kv_pages_per_block=PAGE_KV_PAGES,
                    num_queries_per_block=rows, source=source)


_TPU_INFERENCE = (
    "tpu-inference's DeepSeek-V4 indexer call site passes these to "
    "streamindex_topk, commented 'tuned based on microbenchmark results' "
    "(generation not stated); page size 128 entries there")
_PAGE_DERIVED = (
    "derived (streamidx.blocks.page_query_rows): 128 pages per KV block "
    "(page mode's only size); query rows the most, a power of two <= 512 "
    "(the vendored streamindex_page_topk's default), whose f32 scores of a "
    "KV block, over all heads and summed over them, are within GLM's row "
    "(PAGE_SCORE_BLOCK_BYTES, PAGE_SUMMED_BLOCK_BYTES; PAGE_BLOCK_SOURCE) "
    "and whose launch's VMEM scratch fits the generation's VMEM (this row "
    "was that default, 512 rows, for every call before)")
# Rows chosen from the compiler's static schedule (streamidx.lab.schedule:
# bundles per KV page of the compiled KV loop, a compute-side lower bound;
# no TPU timing exists for them). Numbers: FP8 cache, 64 heads, 128-entry
# pages, libtpu 0.0.42.1; notebook 06 section 1 recomputes them.
_SCHEDULE_V5E = (
    "static schedule (no TPU timing; python -m streamidx.lab.schedule): v5e "
    "decode KV loop 118 bundles per page at 4 pages per block vs 128 at 3 "
    "(VSTORE-bound, 2.0x the page's HBM time at the derived 1.503 GHz); "
    "prefill (128 query rows) 2193 vs 3073 bundles per page at 4 vs 2 "
    "pages, the MXU slot 93% busy vs 62%")
_SCHEDULE_V6E = (
    "static schedule (no TPU timing; python -m streamidx.lab.schedule): v6e "
    "decode KV loop 57.2 bundles per page at 4 pages per block vs 67.7 at 3 "
    "(VALU-bound; no public clock, vector-bound below 2.9 GHz); prefill (128 "
    "query rows) 1446 vs 1610 bundles per page at 4 vs 2 pages (VALU 95%)")
_SCHEDULE_GLM_PAGE = (
    "compile matrix and static schedule (no TPU timing): at GLM sizes (32 "
    "heads, 64-entry pages, 128-page blocks of 8192 entries) the vendored "
    "512 query rows per block take minutes to compile (measured on v6e: 64 "
    "rows 45 s, 128 rows 139 s, 32 rows 11 s); per page and query row the "
    "schedule gives 3.9 bundles at 32 rows vs 4.5 at 16 on v6e, 5.2 vs 6.6 on "
    "v5e")
_DENSE = ("the vendored rows (tpu-inference's production sizes), kept for "
          "the dense FP8 kernel: same launches and grid, so the same KV "
          "blocks in entries; its per-block VMEM is smaller (129 instead of "
          "256 B per entry); not tuned on a TPU")
_DENSE_PAGE_GLM = (
    "the vendored page variant's GLM row (32 query rows per block; its "
    "source: the compile matrix and static schedule), kept for the dense FP8 "
    "page kernel: at the default 512 rows it does not fit TPU v4's VMEM "
    "(compile matrix, libtpu 0.0.42.1: 'Ran out of memory in memory space "
    "vmem. Used 44.80M of 16.00M'); not tuned on a TPU")

# Speculative decoding, 2 query rows per decode sequence (M17): the decode
# KV block from the static schedule of the batched MTP decode launch (FP8 /
# dense FP8, 64 heads, 128-entry pages, B = 4, libtpu 0.0.42.1): bundles per
# page (one sequence's page, both rows) at 2/3/4/8 pages (dense: 3/4).
_MTP2 = {"v4": ("570/553/546/538", "346/333"),
         "v5e": ("146/137/127/127", "99/86"),
         "v5p": ("145/131/126/126", "93/86"),
         "v6e": ("81/78/67/63", "70/57"), "v7x": ("67/63/58/52", "60/53")}
_MTP2_NOTE = " (8 saves at most 11% but pads up to 1023 entries a sequence)"
_MTP2_ROWS = tuple(
    _token(gen, v, fmt, heads=64, page=128, decode_q_len=2,
           kv=(4,) + ((4, 4) if v == "vendored" and gen in ("v5e", "v6e")
                      else (2, 2)), source=(
        f"static schedule (no TPU timing; python -m streamidx.lab.schedule "
        f"--variant {v} --shape dsv4-mtp2-decode-4k --kv-pages "
        f"{('2 3 4 8', '3 4')[i]}): {gen} batched MTP decode, {_MTP2[gen][i]}"
        f" bundles per page at {('2/3/4/8', '3/4')[i]} pages; 4 taken"
        f"{(_MTP2_NOTE, '')[i]}; prefill and mixed as the q_len-1 row"))
    for i, (v, fmt) in enumerate((("vendored", WILDCARD),
                                  ("dense", "dense_fp8"))) for gen in _MTP2)

_LEAN = ("the dense FP8 rows, kept for the vector-lean kernel (same launches "
         "and grid); not tuned on a TPU")
_SCHEDULE_LEAN = (
    "static schedule (no TPU timing; python -m streamidx.lab.schedule "
    "--variant lean --generations v5e v6e v7x --formats dense_fp8 --launches "
    "decode --kv-pages 3 4 6 8 12 16, libtpu 0.0.42.1, score buffer and "
    "scales in HBM): lean decode KV loop bundles per page at 3 / 4 / 6 / 8 / "
    "12 / 16 pages per block: v5e 35.3 / 31.7 / 29.3 / 27.8 / 26.0 / 25.2, "
    "v6e 32.8 / 29.3 / 24.4 / 23.7 / 23.6 / 23.2, v7x 30.8 / 26.3 / 22.5 / "
    "22.0 / 21.7 / 21.5 (VALU-bound; v5e MXU-bound at 16); 8 kept: one "
    "block of a 4K-token sequence, larger ones pay at most 0.6 on v6e and "
    "v7x; prefill and mixed blocks kept at the dense rows' 2")
_FP4 = ("the vendored rows, kept for the MXFP4 kernel: same launches and "
        "grid; 68 instead of 256 B per entry of KV block; not tuned on a TPU")
_FP4_PAGE = ("the dense FP8 page kernel's GLM row (32 query rows per block), "
             "kept for the MXFP4 page kernel; not tuned on a TPU")

TABLE: tuple[BlockSizes, ...] = (
    _token(WILDCARD, "vendored", WILDCARD, _TPU_INFERENCE),
    _page("vendored_page", WILDCARD, _PAGE_DERIVED),
    _token("v5e", "vendored", WILDCARD, _SCHEDULE_V5E, 64, 128, kv=(4, 4, 4)),
    _token("v6e", "vendored", WILDCARD, _SCHEDULE_V6E, 64, 128, kv=(4, 4, 4)),
    _page("vendored_page", WILDCARD, _SCHEDULE_GLM_PAGE, 32, 64, rows=32),
    _token(WILDCARD, "dense", "dense_fp8", _DENSE),
    _page("dense_page", "dense_fp8", _PAGE_DERIVED),
    _page("dense_page", "dense_fp8", _DENSE_PAGE_GLM, 32, 64, rows=32),
    *_MTP2_ROWS,
    _token(WILDCARD, "lean", "dense_fp8", _LEAN),
    *(_token(gen, "lean", "dense_fp8", _SCHEDULE_LEAN, 64, 128, kv=(8, 2, 2))
      for gen in ("v5e", "v6e", "v7x")),
    _page("lean_page", "dense_fp8", _PAGE_DERIVED),
    _page("lean_page", "dense_fp8", _DENSE_PAGE_GLM, 32, 64, rows=32),
    _token(WILDCARD, "fp4", "mxfp4", _FP4),
    _page("fp4_page", "mxfp4", _PAGE_DERIVED),
    _page("fp4_page", "mxfp4", _FP4_PAGE, 32, 64, rows=32),
)



# The shape a chip's block-size experiments are compared at (`python -m
# streamidx.bench --ablate`'s default; the model's fit of them,
# `lab.model.roofline.kv_step_costs`). The table has no context-length key:
# at 64 x 1,048,576 tokens other blocks were faster on the v5e (docs/chip.md).
EXPERIMENT_SHAPE = "dsv4-decode-64x262144"


def _measured(variant: str = "lean") -> tuple[BlockSizes, ...]:
  """Rows measured on a chip, from the records (`streamidx.records`): per
  chip, cache format, heads and page size, the blocks of `variant`'s
  fastest scoring experiment recorded at `EXPERIMENT_SHAPE` that ran
  today's kernel as shipped (`records.as_shipped`; `python -m
  streamidx.bench --ablate`). Later in `TABLE` than
  the static schedule's row for the same call, so they win where a chip
  measured."""
  best: dict[tuple, list[dict]] = {}
  for r in records.chip_rows("experiments", variant=variant,
                             shape=EXPERIMENT_SHAPE):
    if records.as_shipped(r):
      key = (r["chip"], r["cache_format"], r["num_heads"], r["page_size"])
      best.setdefault(key, []).append(r)
  out = []
  for (chip, fmt, heads, page), rs in sorted(best.items()):
    r = min(rs, key=lambda r: r["device_s"])
    sizes = len({tuple(records.block_kwargs(x).items()) for x in rs})
    out.append(BlockSizes(
        chip, variant, fmt, heads, page, source=(
            f"measured on {chip} ({r['device_kind']}; jax {r['jax']}, libtpu "
            f"{r['libtpu']}; {r['date'][:10]}; `{r['command']}`): the "
            f"scoring launches at {r['shape']} took {r['device_s'] * 1e3:.3f}"
            f" ms at these blocks (experiment {r['experiment']!r}), the least"
            f" of the {len(rs)} experiment{'s' * (len(rs) > 1)} there, "
            f"{sizes} block size{'s' * (sizes > 1)}"),
        **records.block_kwargs(r)))
  return tuple(out)


TABLE += _measured()

# Which rows came from the compiler's static schedule rather than a TPU run.
STATIC_SCHEDULE_SOURCES = (_SCHEDULE_V5E, _SCHEDULE_V6E, _SCHEDULE_GLM_PAGE,
                           _SCHEDULE_LEAN, *(r.source for r in _MTP2_ROWS))

# Entries per KV block of the vendored rows (page size 128: 3, 2, 2 pages):
# the heuristic keeps them for other page sizes.
_HEURISTIC_ENTRIES = (384, 256, 256)


def _legal(row: BlockSizes, page_size: int | None, mode: str) -> bool:
  if page_size is None or mode == "page":
    return True
  return all((page_size * p) % LANES == 0 for p in
             normalize_per_case(row.num_kv_pages_per_block,
                                "num_kv_pages_per_block"))


def heuristic(variant: str, page_size: int, base: BlockSizes) -> BlockSizes:
  """`base` with KV blocks of about the vendored number of entries: per
  case, the fewest pages holding at least 384 / 256 / 256 entries in whole
  128-entry lane rows."""
  pages = []
  for entries in _HEURISTIC_ENTRIES:
    p = max(1, -(-entries // page_size))
    while (page_size * p) % LANES:
      p += 1
    pages.append(p)
  return dataclasses.replace(
      base, variant=variant, page_size=page_size,
      num_kv_pages_per_block=tuple(pages),
      source=(f"heuristic: {base.source.split(';')[0]}, re-cut to page_size "
              f"{page_size} ({'/'.join(map(str, _HEURISTIC_ENTRIES))} "
              f"entries per block, whole lane rows)"))


def page_block_bytes(rows: int, num_heads: int, page_size: int
                     ) -> tuple[int, int]:
  """(score block, summed block) bytes of page mode's f32 scores of one KV
  block at `rows` query rows: rows x heads x 128 pages x page_size x 4,
  and the same without heads (`PAGE_SCORE_BLOCK_BYTES`,
  `PAGE_SUMMED_BLOCK_BYTES` bound them)."""
  summed = rows * PAGE_KV_PAGES * page_size * 4
  return summed * num_heads, summed


def _page_blocks(rows: int, num_heads: int, page_size: int) -> str:
  score, summed = page_block_bytes(rows, num_heads, page_size)
  return (f"score block {mib(score)} (of {mib(PAGE_SCORE_BLOCK_BYTES)}), "
          f"summed block {mib(summed)} (of {mib(PAGE_SUMMED_BLOCK_BYTES)})")


def _page_rows_fit(rows: int, num_heads: int, page_size: int) -> bool:
  score, summed = page_block_bytes(rows, num_heads, page_size)
  return score <= PAGE_SCORE_BLOCK_BYTES and summed <= PAGE_SUMMED_BLOCK_BYTES


def check_page_rows(rows: int, num_heads: int, page_size: int) -> None:
  """The page-mode rule (`streamidx.validate` applies it to every page-mode
  call): the score and summed blocks of `rows` query rows within
  `PAGE_SCORE_BLOCK_BYTES` and `PAGE_SUMMED_BLOCK_BYTES`; a ValueError
  naming num_queries_per_block, or q's heads and the page size where not
  even one row fits."""
  if _page_rows_fit(rows, num_heads, page_size):
    return
  rule = (f"page mode's f32 scores of one KV block must be <= "
          f"{mib(PAGE_SCORE_BLOCK_BYTES)} over all heads (query rows x "
          f"num_q_heads x {PAGE_KV_PAGES} pages x page_size x 4 B) and <= "
          f"{mib(PAGE_SUMMED_BLOCK_BYTES)} summed over heads (query rows x "
          f"{PAGE_KV_PAGES} x page_size x 4 B): GLM's row, the work the "
          f"compiler unrolls (streamidx.blocks.PAGE_BLOCK_SOURCE)")
  if not _page_rows_fit(1, num_heads, page_size):
    raise ValueError(
        f"q: {rule}; at one query row: fewer heads or smaller pages (got "
        f"{num_heads} heads, page_size {page_size}: "
        f"{_page_blocks(1, num_heads, page_size)})")
  most = max(r for r in range(1, rows) if _page_rows_fit(r, num_heads,
                                                         page_size))
  raise ValueError(
      f"num_queries_per_block: {rule}: at most {most} query rows at "
      f"{num_heads} heads and page_size {page_size} (got {rows}: "
      f"{_page_blocks(rows, num_heads, page_size)})")


def check_page_kv_block(cache_format: str, page_size: int, head_dim: int,
                        generation: str | None = None) -> None:
  """Page mode's KV block: over the MXFP4 cache at most
  `PAGE_MXFP4_BLOCK_VALUES` values, over the packed FP8 cache on TPU v4 at most
  `PAGE_V4_FP8_BLOCK_ENTRIES` entries; a ValueError naming the argument."""
  entries = PAGE_KV_PAGES * page_size
  if (cache_format == "fp8" and generation == "v4"
      and entries > PAGE_V4_FP8_BLOCK_ENTRIES):
    raise ValueError(
        f"page_size: on TPU v4 the packed FP8 page kernel widens its "
        f"{PAGE_KV_PAGES}-page KV block to bf16 in VMEM, {PAGE_KV_PAGES} x "
        f"page_size must be <= {PAGE_V4_FP8_BLOCK_ENTRIES} entries "
        f"(streamidx.blocks.PAGE_V4_FP8_BLOCK_SOURCE; the bf16 and dense FP8 "
        f"caches have no such bound) (got {PAGE_KV_PAGES} x {page_size} = "
        f"{entries})")
  if cache_format != "mxfp4":
    return
  values = PAGE_KV_PAGES * page_size * cache_lib.padded_head_dim(head_dim)
  if values > PAGE_MXFP4_BLOCK_VALUES:
    raise ValueError(
        f"cache_values: page mode over the MXFP4 cache unpacks a whole "
        f"{PAGE_KV_PAGES}-page KV block in VMEM, {PAGE_KV_PAGES} x page_size "
        f"x head_dim padded to 128 must be <= {PAGE_MXFP4_BLOCK_VALUES} "
        f"values (streamidx.blocks.PAGE_MXFP4_BLOCK_SOURCE) (got "
        f"{PAGE_KV_PAGES} x {page_size} x "
        f"{cache_lib.padded_head_dim(head_dim)} = {values})")


def page_scratch_bytes(rows: int, *, cache_format: str, num_heads: int,
                       page_size: int, head_dim: int = 128,
                       pages_per_seq: int | None = None,
                       tpu_generation: int = 5) -> int:
  """VMEM bytes (tiled) of a page-mode launch's scratch at `rows` query rows
  (`semantics.launch_scratch`, a two-array format's scale buffer beside
  it): the query block taken as float32 (the larger query dtype), score
  rows for `pages_per_seq` (None: one KV block)."""
  layout = cache_lib.page_layout(cache_format, page_size, head_dim)
  scratch = semantics.launch_scratch(
      seq_batch_size=1, bq_sz=rows, bkv_p=PAGE_KV_PAGES,
      page_size_per_kv_packing=layout.rows, kv_packing=layout.packing,
      lkv_dim=layout.width, cache_dtype=layout.dtype, num_q_heads=num_heads,
      head_dim=cache_lib.padded_head_dim(head_dim), q_dtype=jnp.float32,
      weights_dtype=jnp.float32,
      num_out_sublanes=cdiv(pages_per_seq or PAGE_KV_PAGES, PAGE_KV_PAGES),
      scale_block=layout.scale_block)
  return semantics.scratch_vmem_bytes(scratch, tpu_generation)


def page_vmem_budget(generation: str | None) -> tuple[int, int, str]:
  """(bytes, TPU generation number, what): the VMEM a page-mode launch's
  scratch may take on `generation`: `PageCall`'s default vmem_limit_bytes,
  or the chip's VMEM per TensorCore where smaller (`pltpu`'s table; None or
  "*": the limit alone)."""
  limit = semantics.PAGE_VMEM_LIMIT_BYTES
  if generation in (None, WILDCARD):
    return limit, 5, f"page mode's vmem_limit_bytes {mib(limit)}"
  info = pltpu.get_tpu_info_for_chip(
      pltpu.ChipVersion({"v7x": "7x"}.get(generation, generation)), 1)
  capacity = int(info.vmem_capacity_bytes)
  return (min(limit, capacity), int(info.generation),
          f"{generation}: the least of page mode's vmem_limit_bytes "
          f"{mib(limit)} and {mib(capacity)} of VMEM per TensorCore")


def page_query_rows(*, generation: str | None, cache_format: str,
                    num_heads: int, page_size: int, head_dim: int = 128,
                    pages_per_seq: int | None = None) -> tuple[int, str]:
  """(query rows per block, why) for a page-mode call: the most, a power of
  two <= `PAGE_MAX_QUERY_ROWS`, whose f32 score and summed blocks are
  within their bounds (`check_page_rows`) and whose launch's scratch
  (`page_scratch_bytes`) fits `page_vmem_budget(generation)`. Raises a
  ValueError when one row does not fit."""
  check_page_rows(1, num_heads, page_size)
  check_page_kv_block(cache_format, page_size, head_dim, generation)
  budget, tpu_gen, budget_what = page_vmem_budget(generation)
  geometry = dict(cache_format=cache_format, num_heads=num_heads,
                  page_size=page_size, head_dim=head_dim,
                  pages_per_seq=pages_per_seq, tpu_generation=tpu_gen)
  rows = PAGE_MAX_QUERY_ROWS
  while rows > 1 and (not _page_rows_fit(rows, num_heads, page_size)
                      or page_scratch_bytes(rows, **geometry) > budget):
    rows //= 2
  scratch = page_scratch_bytes(rows, **geometry)
  if scratch > budget:
    raise ValueError(
        f"cache: a page-mode launch's VMEM scratch at one query row (the "
        f"{PAGE_KV_PAGES}-page KV block, {cache_format}, head_dim {head_dim}"
        f", {num_heads} heads, {pages_per_seq or PAGE_KV_PAGES} pages per "
        f"sequence) must fit {mib(budget)} ({budget_what}) (got page_size "
        f"{page_size}: {mib(scratch)})")
  why = (f"{rows} query rows at {num_heads} heads and page_size "
         f"{page_size}: {_page_blocks(rows, num_heads, page_size)}, scratch "
         f"{mib(scratch)} ({cache_format}, head_dim {head_dim}) of "
         f"{mib(budget)} ({budget_what})")
  return rows, why


# (variant, format) -> the (variant, format) whose rows it takes: the inline
# variant runs the lean body's KV loop over the dense pair's bytes (one row
# more a page, one DMA fewer), so lean's sizes, measured and scheduled.
SAME_BLOCKS = {("inline", "inline_fp8"): ("lean", "dense_fp8")}


def lookup(variant: str, *, mode: str, cache_format: str, num_heads: int,
           page_size: int, generation: str | None = None,
           decode_q_len: int = 1, head_dim: int = 128,
           pages_per_seq: int | None = None) -> BlockSizes:
  """The table's `BlockSizes` for one kernel call (module docstring);
  `.kwargs()` the kernel arguments, `.source` where they come from.
  `streamidx.block_sizes(variant, ...)` fills in `mode`. generation None:
  the chip the call runs on (off-TPU none: only wildcard rows match); "*":
  only wildcard rows. head_dim, pages_per_seq: for `page_query_rows`.
  A (variant, format) of `SAME_BLOCKS` takes the rows it names."""
  if generation is None:
    generation = modes.current_generation()
  gen = WILDCARD if generation is None else generation
  variant, cache_format = SAME_BLOCKS.get((variant, cache_format),
                                          (variant, cache_format))
  found = [r for r in TABLE if r.matches(
      generation=gen, variant=variant, cache_format=cache_format,
      num_heads=num_heads, page_size=page_size, decode_q_len=decode_q_len)]
  if not found:
    raise ValueError(f"variant: no block-size row for {variant!r} "
                     f"(cache_format={cache_format!r}, generation={generation!r})")

  most_specific = lambda rs: max(enumerate(rs), key=lambda ir: (  # pylint: disable=unnecessary-lambda-assignment
      ir[1].specificity, ir[0]))[1]
  legal = [r for r in found if _legal(r, page_size, mode)]
  if not legal:
    return heuristic(variant, page_size, most_specific(found))
  row = most_specific(legal)
  if row.num_queries_per_block is None:  # page mode, derived for the call
    rows, why = page_query_rows(
        generation=gen, cache_format=cache_format, num_heads=num_heads,
        page_size=page_size, head_dim=head_dim, pages_per_seq=pages_per_seq)
    row = dataclasses.replace(row, num_queries_per_block=rows,
                              source=f"{row.source}: {why}")
  return row


def rows(variant: str | None = None) -> list[BlockSizes]:
  """The table's rows (of one variant, wildcard rows included)."""
  return [r for r in TABLE if variant is None or r.variant in (WILDCARD, variant)]
