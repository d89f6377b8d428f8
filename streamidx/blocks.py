"""Block sizes as data: one table, keyed by what they depend on, with sources.

Every caller that needs block sizes (the benchmark, the compile matrix, the
notebooks, a serving engineer) asks `streamidx.block_sizes(...)`; nobody writes
`(3, 2, 2)` again. A row matches a call when each of its keys equals the
call's or is a wildcard (`"*"` / `None`); the most specific matching row
wins (most non-wildcard keys), and among equally specific rows the later
one. Rows are only taken when their sizes are legal for the page size
(`page_size * num_kv_pages_per_block` a multiple of 128 in token mode); when
none is, the `heuristic` row for that page size is built (and says so).

Keys:  generation ("v4", "v5e", "v5p", "v6e", "v7x" or "*"; a lookup
       without one takes the chip the call runs on,
       `modes.current_generation()`, on every path), variant (a name
       of `streamidx.VARIANTS` or "*"), cache_format ("fp8", "bf16", ...
       or "*"), num_heads and page_size (ints or None for any), and
       decode_q_len (the call's, 1 or gamma + 1; None for any: a row
       without it serves every decode_q_len unless a keyed row matches).
Sizes: num_kv_pages_per_block, num_queries_per_block (an int or a
       (decode, prefill, mixed) triple, as the kernels take them),
       decode_req_batch_size (token mode) and vmem_limit_bytes (None: the
       kernel's default).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from streamidx import modes
from streamidx.semantics import LANES, normalize_per_case

WILDCARD = "*"


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

  @property
  def specificity(self) -> int:
    keys = (self.generation, self.variant, self.cache_format)
    return (sum(k != WILDCARD for k in keys)
            + (self.num_heads is not None) + (self.page_size is not None)
            + (self.decode_q_len is not None))

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
          rows=512) -> BlockSizes:
  """A page-mode row for any generation: 128 pages per KV block."""
  return BlockSizes(WILDCARD, variant, cache_format, heads, page,
                    num_kv_pages_per_block=128, num_queries_per_block=rows,
                    source=source)


_TPU_INFERENCE = (
    "tpu-inference's DeepSeek-V4 indexer call site passes these to "
    "streamindex_topk, commented 'tuned based on microbenchmark results' "
    "(generation not stated); page size 128 entries there")
_PAGE_DEFAULT = ("the vendored streamindex_page_topk's own defaults "
                 "(num_kv_pages_per_block must be 128 there)")
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
_DENSE_PAGE = ("the vendored page-mode defaults, kept for the dense FP8 page "
               "kernel (num_kv_pages_per_block must be 128 there too)")
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
_FP4_PAGE = ("the dense FP8 page rows (num_kv_pages_per_block must be 128), "
             "kept for the MXFP4 page kernel; not tuned on a TPU")

TABLE: tuple[BlockSizes, ...] = (
    _token(WILDCARD, "vendored", WILDCARD, _TPU_INFERENCE),
    _page("vendored_page", WILDCARD, _PAGE_DEFAULT),
    _token("v5e", "vendored", WILDCARD, _SCHEDULE_V5E, 64, 128, kv=(4, 4, 4)),
    _token("v6e", "vendored", WILDCARD, _SCHEDULE_V6E, 64, 128, kv=(4, 4, 4)),
    _page("vendored_page", WILDCARD, _SCHEDULE_GLM_PAGE, 32, 64, rows=32),
    _token(WILDCARD, "dense", "dense_fp8", _DENSE),
    _page("dense_page", "dense_fp8", _DENSE_PAGE),
    _page("dense_page", "dense_fp8", _DENSE_PAGE_GLM, 32, 64, rows=32),
    *_MTP2_ROWS,
    _token(WILDCARD, "lean", "dense_fp8", _LEAN),
    *(_token(gen, "lean", "dense_fp8", _SCHEDULE_LEAN, 64, 128, kv=(8, 2, 2))
      for gen in ("v5e", "v6e", "v7x")),
    _page("lean_page", "dense_fp8", _DENSE_PAGE),
    _page("lean_page", "dense_fp8", _DENSE_PAGE_GLM, 32, 64, rows=32),
    _token(WILDCARD, "fp4", "mxfp4", _FP4),
    _page("fp4_page", "mxfp4", _FP4_PAGE),
    _page("fp4_page", "mxfp4", _FP4_PAGE, 32, 64, rows=32),
)

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
  """`base` with KV blocks of about the vendored number of entries.

  Per case, the smallest number of pages holding at least 384 / 256 / 256
  entries whose block is a whole number of 128-entry lane rows.
  """
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


def lookup(variant: str, *, mode: str, cache_format: str, num_heads: int,
           page_size: int, generation: str | None = None,
           decode_q_len: int = 1) -> BlockSizes:
  """The table's `BlockSizes` for one kernel call (module docstring: the
  keys and the matching); `.kwargs()` gives the kernel arguments, `.source`
  where the numbers come from. Callers normally go through
  `streamidx.block_sizes(variant, ...)` (or `VARIANTS[name].block_sizes`),
  which fills in `mode` ("token": KV blocks of whole 128-entry lane rows, or
  "page"). generation None: the chip the call runs on
  (`modes.current_generation()`: `compile_for`'s target, else the TPU
  device's; off-TPU none, so only rows for any generation match); "*": only
  rows for any generation.
  """
  if generation is None:
    generation = modes.current_generation()
  gen = WILDCARD if generation is None else generation
  found = [r for r in TABLE if r.matches(
      generation=gen, variant=variant, cache_format=cache_format,
      num_heads=num_heads, page_size=page_size, decode_q_len=decode_q_len)]
  if not found:
    raise ValueError(f"variant: no block-size row for {variant!r} "
                     f"(cache_format={cache_format!r}, generation={generation!r})")

  def most_specific(rs):
    return max(enumerate(rs), key=lambda ir: (ir[1].specificity, ir[0]))[1]

  legal = [r for r in found if _legal(r, page_size, mode)]
  if legal:
    return most_specific(legal)
  return heuristic(variant, page_size, most_specific(found))


def rows(variant: str | None = None) -> list[BlockSizes]:
  """The table's rows (of one variant, wildcard rows included)."""
  return [r for r in TABLE if variant is None or r.variant in (WILDCARD, variant)]


__all__ = ["BlockSizes", "TABLE", "lookup", "heuristic", "rows", "WILDCARD",
           "STATIC_SCHEDULE_SOURCES"]
