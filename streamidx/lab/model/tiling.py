"""How the kernel tiles a batch: launches, grid, loops, DMAs and VMEM; a model
of the kernels checked against them (docs/tpu.md, "The tiling model").
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import batch as batch_lib
from streamidx import cache as cache_lib
from streamidx import call as call_lib
from streamidx import modes, semantics
from streamidx import topk as topk_lib
from streamidx import variants as variants_lib
from streamidx.kernels import driver as driver_lib
from streamidx.kernels import tpu as tpu_lib
from streamidx.semantics import LANES as _LANES, align_to, cdiv

TOKEN_CASES = ("decode", "decode_rest", "prefill", "mixed")
# The kernels this module models (lean: not its DMA order).
MODELLED_VARIANTS = ("vendored", "vendored_page", "dense", "dense_page",
                     "lean", "lean_page", "inline", "fp4", "fp4_page")


def _dtype(name):
  return np.dtype(jnp.dtype(name))  # jnp: NumPy alone has no bfloat16


@dataclasses.dataclass(frozen=True)
class Geometry:
  """The kernel's static shapes; heads and head_dim after its padding
  (`prepare_q_inputs`: the query dtype's packing, 128)."""

  fmt: str  # cache format: a `cache.CACHE_FORMATS` name
  page_size: int  # entries per page
  pages_per_seq: int
  max_num_seqs: int
  num_tokens: int  # rows of q
  total_num_pages: int
  num_q_heads: int
  head_dim: int
  q_dtype: str  # "bfloat16" or "float32"

  layout = property(lambda self: cache_lib.page_layout(  # one page's arrays
      self.fmt, self.page_size, self.head_dim))

  # The layout's: values and scales in two arrays (dense, MXFP4), a page's
  # u8 scales, the packing axis, a row's elements, a page's value rows.
  dense = property(lambda self: self.layout.scale_block is not None)
  scale_block = property(lambda self: self.layout.scale_block)
  kv_packing = property(lambda self: self.layout.packing)
  lkv_dim = property(lambda self: self.layout.width)
  page_size_per_kv_packing = property(lambda self: self.layout.rows)
  cache_dtype = property(lambda self: np.dtype(self.layout.dtype))

  # One entry's bytes of data (dense: head_dim + 1); the values' DMA of a
  # page; what a page's KV DMAs move (dense: its scale rows, padding
  # rows included); the whole cache as a TPU stores it; a query
  # element's bytes.
  record_bytes = property(lambda self: cache_lib.CACHE_FORMATS[
      self.fmt].bytes_per_entry(self.head_dim))
  value_page_bytes = property(lambda self: (
      self.page_size_per_kv_packing * self.kv_packing * self.lkv_dim
      * self.cache_dtype.itemsize))
  page_bytes = property(lambda self: self.value_page_bytes + (
      math.prod(self.scale_block) if self.dense else 0))
  cache_bytes = property(lambda self: self.total_num_pages * self.page_bytes)
  q_itemsize = property(lambda self: _dtype(self.q_dtype).itemsize)


def geometry(batch, *, fmt: str = "fp8", num_heads: int = 8, head_dim: int = 128,
             q_dtype: str = "bfloat16") -> Geometry:
  """The kernel's static shapes for `batch` (a `RaggedBatch`)."""
  if fmt not in cache_lib.CACHE_FORMATS:
    raise ValueError(f"fmt must be one of {tuple(cache_lib.CACHE_FORMATS)}"
                     f", got {fmt!r}")
  if q_dtype not in ("bfloat16", "float32"):
    raise ValueError(f"q_dtype must be 'bfloat16' or 'float32', got {q_dtype!r}")
  q_packing = 32 // (_dtype(q_dtype).itemsize * 8)
  return Geometry(fmt=fmt, page_size=int(batch.page_size),
                  pages_per_seq=batch.pages_per_seq,
                  max_num_seqs=batch.max_num_seqs, num_tokens=int(batch.num_tokens),
                  total_num_pages=int(batch.total_num_pages),
                  num_q_heads=align_to(num_heads, q_packing),
                  head_dim=align_to(head_dim, 128), q_dtype=q_dtype)


@dataclasses.dataclass(frozen=True)
class Program:
  """One grid step of a launch: `seqs` scored together."""

  index: int  # pl.program_id(0)
  seqs: tuple[int, ...]  # sequence ids, seq_batch_size of them
  q_lens: tuple[int, ...]  # query rows per sequence
  kv_lens: tuple[int, ...]  # entries per sequence (seq_len // ratio)
  num_bq: int
  num_bkv: int
  # [start, end) rows of q scored per sequence (decode: the first only).
  q_rows: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class PlannedLaunch:
  """One `pallas_call` as the model plans it: the driver's `spec`
  (`kernels.driver.Launch`), the sequences [start_seq, end_seq) it covers,
  its programs and VMEM scratch."""

  spec: driver_lib.Launch
  start_seq: int
  end_seq: int
  num_score_sublanes: int  # page mode: 128-lane rows of the pooled output
  programs: tuple[Program, ...]
  scratch: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, dtype)

  case = property(lambda self: self.spec.case)
  seq_batch_size = property(lambda self: self.spec.seq_batch_size)
  bq_sz = property(lambda self: self.spec.bq_sz)
  bkv_p = property(lambda self: self.spec.bkv_p)
  static_q_len = property(lambda self: self.spec.static_q_len)

  bkv_sz = property(lambda self: self.bkv_p * self.spec.page_size)  # entries
  grid = property(lambda self: len(self.programs))

  # The vendored kernel's pallas_call name (in profiles); "decode[B]" (B
  # sequences a program) or the case; a query row's f32 scores DMA'd to HBM.
  name = property(lambda self: tpu_lib.launch_name(
      "", self.case, self.bq_sz, self.bkv_p))
  label = property(lambda self: f"decode[{self.seq_batch_size}]"
                   if self.case.startswith("decode") else self.case)
  out_row_bytes = property(lambda self: 4 * (
      self.num_score_sublanes * _LANES if self.case == "page" else self.bkv_sz))

  num_steps = property(lambda self: sum(p.num_bq * p.num_bkv
                                        for p in self.programs))
  # Scratch bytes, logical shapes (no padding).
  vmem_bytes = property(lambda self: sum(math.prod(s) * np.dtype(d).itemsize
                                         for _, s, d in self.scratch))


@dataclasses.dataclass(frozen=True)
class Plan:
  """Every launch of one kernel call, with the batch they run on."""

  mode: str  # "token" or "page"
  geometry: Geometry
  launches: tuple[PlannedLaunch, ...]
  seq_lens: tuple[int, ...]
  q_lens: tuple[int, ...]
  cu_q_lens: tuple[int, ...]
  page_indices: np.ndarray  # [max_num_seqs * pages_per_seq]
  compression_ratio: int
  num_score_cols: int  # columns of the [T, cols] f32 score buffer in HBM
  # Slot j scores sequence order[j] (`sort_decode`); all fields above are
  # in slot order.
  order: tuple[int, ...] = ()

  # The launches with programs (an empty range launches nothing, M14).
  executed = property(lambda self: tuple(l for l in self.launches if l.grid))

  @property
  def selected_cols(self) -> int:
    """Columns the selection reads (M24): token mode, the entries the page
    table addresses, whole 128-lane rows; page mode, its pages."""
    g = self.geometry
    return (semantics.align_to(g.pages_per_seq * g.page_size, _LANES)
            if self.mode == "token" else g.pages_per_seq)

  def counts(self) -> dict:
    """DMA starts ("dma_kv", "dma_kv_scale", "dma_q", "dma_w", "dma_out"),
    their bytes ("hbm_bytes_kv": with the TPU's tile padding), grid steps and
    steps over the launches: closed form, equal to counting
    `expected_dma_events` (tests/test_tiling.py)."""
    g = self.geometry
    cu = self.cu_q_lens
    q_row = g.num_q_heads * g.head_dim * g.q_itemsize
    c = dict(grid_steps=0, steps=0, dma_kv=0, bytes_kv=0, dma_kv_scale=0,
             dma_q=0, bytes_q=0, dma_w=0, bytes_w=0, dma_out=0, bytes_out=0)
    for launch in self.launches:
      b, bq, out_row = launch.seq_batch_size, launch.bq_sz, launch.out_row_bytes
      c["grid_steps"] += launch.grid
      for pr in launch.programs:
        steps = pr.num_bq * pr.num_bkv
        c["steps"] += steps
        # M7: a sequence without queries fetches no KV; a query block
        # without rows moves nothing.
        c["dma_kv"] += steps * launch.bkv_p * sum(
            cu[s + 1] > cu[s] for s in pr.seqs)
        blocks = sum(min(pr.num_bq, cdiv(cu[s + 1] - cu[s], bq))
                     for s in pr.seqs)
        c["dma_q"] += blocks
        c["dma_w"] += blocks
        # Rows fetched over the query blocks: min(q_len, num_bq * bq) each.
        rows = sum(min(cu[s + 1] - cu[s], pr.num_bq * bq) for s in pr.seqs)
        c["bytes_q"] += rows * q_row
        c["bytes_w"] += rows * g.num_q_heads * 4
        first = min(cu[pr.seqs[0] + 1] - cu[pr.seqs[0]], pr.num_bq * bq)
        sent = min(pr.num_bq, cdiv(first, bq))  # query blocks with rows
        if launch.case == "page":
          c["dma_out"] += sent
          c["bytes_out"] += first * out_row
        else:
          c["dma_out"] += sent * pr.num_bkv
          c["bytes_out"] += pr.num_bkv * b * first * out_row
    if g.dense:  # one scale DMA per values DMA
      c["dma_kv_scale"] = c["dma_kv"]
    c["bytes_kv"] = c["dma_kv"] * g.page_bytes
    # In a TPU's HBM a page's u8 scales pad to whole (4, 128) tiles.
    c["hbm_bytes_kv"] = c["dma_kv"] * (g.value_page_bytes + (
        cache_lib.tpu_scale_bytes(*g.scale_block) if g.dense else 0))
    c["dma_total"] = (c["dma_kv"] + c["dma_kv_scale"] + c["dma_q"] + c["dma_w"]
                      + c["dma_out"])
    return c

  # The largest launch's (one runs at a time).
  vmem_bytes = property(lambda self: max(
      (l.vmem_bytes for l in self.executed), default=0))

  def programs(self) -> Iterator[tuple[int, Program]]:
    """(launch index, program) for every program, in execution order."""
    for li, launch in enumerate(self.launches):
      for pr in launch.programs:
        yield li, pr

  def grid_points(self) -> list[tuple[int]]:
    """The grid points an interpreted run visits (what
    `InterpretParams(grid_point_recorder=...)` records), launch after launch."""
    return [(pr.index,) for _, pr in self.programs()]

  def covered_rows(self) -> np.ndarray:
    """bool[num_tokens]: query rows some program computes scores for."""
    out = np.zeros(self.geometry.num_tokens, bool)
    for _, pr in self.programs():
      for lo, hi in pr.q_rows:
        out[lo:hi] = True
    return out

  def summary(self) -> str:
    """E.g. "decode[4] x1, decode[1] x1, prefill x2, mixed x2"."""
    return ", ".join(f"{l.label} x{l.grid}" for l in self.launches if l.grid)


def _scratch(case, g: Geometry, seq_batch_size, bq_sz, bkv_p,
             num_score_sublanes, kv_slots: int = 2):
  """The kernel's VMEM scratch (`semantics.launch_scratch`, with the scale
  buffer of a two-array cache; `kv_slots` KV blocks buffered)."""
  out_sublanes = (num_score_sublanes if case == "page"
                  else bkv_p * g.page_size // _LANES)
  out = semantics.launch_scratch(
      seq_batch_size=seq_batch_size, bq_sz=bq_sz, bkv_p=bkv_p,
      page_size_per_kv_packing=g.page_size_per_kv_packing,
      kv_packing=g.kv_packing, lkv_dim=g.lkv_dim, cache_dtype=g.cache_dtype,
      num_q_heads=g.num_q_heads, head_dim=g.head_dim, q_dtype=g.q_dtype,
      weights_dtype="float32", num_out_sublanes=out_sublanes,
      scale_block=g.scale_block, kv_slots=kv_slots)
  return tuple((name, shape, np.dtype(dtype).name)
               for name, shape, dtype in out)


def resolve_variant(variant: str | None = None, mode: str | None = None
                    ) -> variants_lib.Variant:
  """The modelled variant for `variant` and/or `mode` (default: "token"'s);
  a mode that disagrees with the variant's is refused."""
  if mode not in (None, *variants_lib.MODES):
    raise ValueError(f"mode: must be one of {variants_lib.MODES} "
                     f"(got {mode!r})")
  if variant is None:
    variant = next(name for name in MODELLED_VARIANTS
                   if variants_lib.get(name).mode == (mode or "token"))
  v = variants_lib.get(variant)
  if v.name not in MODELLED_VARIANTS:
    raise ValueError(f"variant: the tiling model covers {MODELLED_VARIANTS} "
                     f"(got {v.name!r})")
  if mode is not None and mode != v.mode:
    raise ValueError(f"mode: variant {v.name!r} runs in {v.mode!r} mode "
                     f"(got {mode!r})")
  return v


def plan(batch, *, fmt: str = "fp8", num_heads: int = 8, head_dim: int = 128,
         q_dtype: str = "bfloat16", mode: str | None = None,
         variant: str | None = None, num_kv_pages_per_block=None,
         num_queries_per_block=None, decode_req_batch_size: int | None = None,
         generation: str | None = None, sort_decode: bool = True,
         decode_q_len: int | None = None) -> Plan:
  """The launches, programs and loop trip counts of one kernel call on
  `batch` (a `RaggedBatch`) with the inputs `make_inputs` makes (fmt,
  num_heads, head_dim, q_dtype): `variant` (a `MODELLED_VARIANTS` name) or
  `mode`'s first; block sizes as the kernel takes them (None: the table's
  row for `generation`, None: this chip); `sort_decode` as the kernel's
  (`Plan.order`); `decode_q_len` None: the batch's (M17)."""
  v = resolve_variant(variant, mode)
  dq = int(batch.decode_q_len if decode_q_len is None else decode_q_len)
  row = v.block_sizes(cache_format=fmt, num_heads=int(num_heads),
                      page_size=int(batch.page_size),
                      generation=generation,
                      decode_q_len=dq if v.mode == "token" else 1,
                      head_dim=int(head_dim),
                      pages_per_seq=int(batch.pages_per_seq)).kwargs()
  blocks = {name: row.get(name, 1) if val is None else val for name, val in (
      ("num_kv_pages_per_block", num_kv_pages_per_block),
      ("num_queries_per_block", num_queries_per_block),
      ("decode_req_batch_size", decode_req_batch_size))}
  ratio = int(batch.compression_ratio)
  # The call's own checks (`streamidx.call`); k does not change the tiling.
  if v.mode == "token":
    c = call_lib.TopkCall(k=1, compression_ratio=ratio, decode_q_len=dq,
                          sort_decode=sort_decode, **blocks)
  else:
    del blocks["decode_req_batch_size"]
    c = call_lib.PageCall(k=1, compression_ratio=ratio, **blocks)
  nkv, drb = c.num_kv_pages_per_block, int(c.decode_req_batch_size)
  g = geometry(batch, fmt=fmt, num_heads=num_heads, head_dim=head_dim,
               q_dtype=q_dtype)
  seq_lens = [int(x) for x in batch.seq_lens]
  page_indices = np.asarray(batch.page_indices)
  order = tuple(range(len(seq_lens)))
  if v.mode == "token" and sort_decode and drb > 1:
    perm, _, _ = semantics.decode_order(
        np.asarray(batch.seq_lens), int(batch.distribution[0]),
        compression_ratio=ratio, bkv_sz=nkv[0] * g.page_size,
        decode_req_batch_size=drb)
    order = tuple(int(x) for x in np.asarray(perm))
    seq_lens = [seq_lens[o] for o in order]
    page_indices = page_indices.reshape(len(order), -1)[list(order)].reshape(-1)
  cu = [int(x) for x in batch.cu_q_lens]
  q_lens = [cu[i + 1] - cu[i] for i in range(len(seq_lens))]
  kv_lens = [s // ratio for s in seq_lens]
  d0, d1, d2 = (int(x) for x in batch.distribution)

  def programs(start, end, b, bq_sz, bkv_sz, static_q_len):
    out = []
    for p, s0 in enumerate(range(start, end, b)):
      seqs = tuple(range(s0, s0 + b))
      kv = tuple(kv_lens[s] for s in seqs)
      num_bkv = max(1, cdiv(max(kv), bkv_sz))
      if not any(q_lens[s] for s in seqs):
        num_bkv = 1  # M7: one empty step, which only prefetches
      if static_q_len is None:
        num_bq = max(1, cdiv(q_lens[s0], bq_sz))
        rows = tuple((cu[s], cu[s + 1]) for s in seqs)
      else:
        num_bq = max(1, cdiv(static_q_len, bq_sz))
        rows = tuple((cu[s], min(cu[s] + static_q_len, cu[s + 1]))
                     for s in seqs)
      out.append(Program(p, seqs, tuple(q_lens[s] for s in seqs), kv, num_bq,
                         num_bkv, rows))
    return tuple(out)

  if v.mode == "token":
    for bkv_p in nkv:  # `validate.static_validate`'s rule, without arrays
      if (g.page_size * bkv_p) % _LANES:
        raise ValueError(f"num_kv_pages_per_block: page_size * bkv_p = "
                         f"{g.page_size} * {bkv_p} must be a multiple of 128")
  rows = semantics.score_rows(v.mode, g.pages_per_seq, g.page_size, nkv)
  num_cols = rows * _LANES
  out_rows = rows if v.mode == "page" else 0
  launches = []  # the driver's, with the model's programs and scratch
  # As traced now (generation None: this machine's chip, or the interpreter)
  # or compiled for `generation`: the KV blocks each launch buffers.
  interpret = modes.resolve_interpret() if generation is None else False
  slots = v.kernel.body.kv_slots or (lambda spec, generation: 2)
  for start, end, spec in driver_lib.launches(
      c, (d0, d1, d2) if v.mode == "token" else d2, page_size=g.page_size):
    start, end = int(start), int(end)
    launches.append(PlannedLaunch(
        spec, start, end, out_rows,
        programs(start, end, spec.seq_batch_size, spec.bq_sz,
                 spec.bkv_p * g.page_size, spec.static_q_len),
        _scratch(spec.case, g, spec.seq_batch_size, spec.bq_sz, spec.bkv_p,
                 out_rows, slots(dataclasses.replace(spec, interpret=interpret),
                                 generation))))
  return Plan(v.mode, g, tuple(launches), tuple(seq_lens), tuple(q_lens),
              tuple(cu), page_indices, ratio, num_cols, order)


# ---------------------------------------------------------------------------
# The DMA sequence, step by step.


@dataclasses.dataclass(frozen=True)
class Event:
  """One DMA start or wait, as the kernel issues it."""

  launch: int
  op: str  # "start" or "wait"
  kind: str  # "kv" (a page), "kv_scale" (dense), "q", "w", "out" (scores)
  slot: int  # the buffer (0/1)
  batch_idx: int  # the sequence's place in its program
  nbytes: int
  page: int = -1  # a "kv" start's physical page (clamped)
  row: int = -1  # an "out" start's first HBM row, 128-lane column group
  col: int = -1

  def key(self) -> tuple:
    return dataclasses.astuple(self)


def expected_dma_events(p: Plan) -> list[Event]:
  """Every DMA start and wait of the call, in the order the kernel issues
  them (vendored, dense; lean starts one block more per launch, after the
  wait, and waits once per buffer)."""
  g = p.geometry
  cu = p.cu_q_lens
  table = p.page_indices
  n_idx = table.shape[0]
  q_row_bytes = g.num_q_heads * g.head_dim * g.q_itemsize
  w_row_bytes = g.num_q_heads * 4
  out = []
  # Launch numbers as the interpreter counts them: empty launches don't run.
  for li, launch in enumerate(p.executed):
    b = launch.seq_batch_size
    bq, bkv_p, out_row_bytes = launch.bq_sz, launch.bkv_p, launch.out_row_bytes
    sem = [0, 0, 0]  # bq, bkv, bo slots (sem_ids_ref)
    bo_rows = [-1, -1]  # bo_sz_ref: rows of each output slot's DMA in flight

    def q_sz(seq, bq_idx):
      start = cu[seq] + bq_idx * bq
      return max(0, min(bq, cu[seq + 1] - start))

    def fetch_bq(seq0, bq_idx, slot, wait):
      for i in range(b):
        sz = q_sz(seq0 + i, bq_idx)
        op = "wait" if wait else "start"
        if sz:  # M7: no zero-row DMA
          out.append(Event(li, op, "q", slot, i, sz * q_row_bytes))
          out.append(Event(li, op, "w", slot, i, sz * w_row_bytes))

    # Dense FP8: a values and a scales DMA per page, two waits per block.
    value_bytes = g.value_page_bytes

    def fetch_bkv(seq0, bkv_idx, slot, wait):
      for i in range(b):
        if cu[seq0 + i + 1] == cu[seq0 + i]:
          continue  # M7: a sequence without queries fetches no KV
        if wait:
          out.append(Event(li, "wait", "kv", slot, i, bkv_p * value_bytes))
          if g.dense:
            out.append(Event(li, "wait", "kv_scale", slot, i,
                             bkv_p * math.prod(g.scale_block)))
          continue
        off = (seq0 + i) * g.pages_per_seq + bkv_idx * bkv_p
        for j in range(bkv_p):
          page = min(int(table[min(off + j, n_idx - 1)]), g.total_num_pages - 1)
          out.append(Event(li, "start", "kv", slot, i, value_bytes, page=page))
          if g.dense:
            out.append(Event(li, "start", "kv_scale", slot, i,
                             math.prod(g.scale_block), page=page))

    def wait_out(slot):
      if bo_rows[slot] > 0:
        out.append(Event(li, "wait", "out", slot, 0, bo_rows[slot] * out_row_bytes))

    def start_out(slot, rows, row, col):
      bo_rows[slot] = rows
      out.append(Event(li, "start", "out", slot, 0, rows * out_row_bytes,
                       row=row, col=col))

    for pr in launch.programs:
      seq0 = pr.seqs[0]
      if pr.index == 0:  # prologue
        fetch_bq(seq0, 0, 0, False)
        fetch_bkv(seq0, 0, 0, False)
      for bq_idx in range(pr.num_bq):
        slot = sem[0]
        nxt_bq = bq_idx + 1
        nxt_seq = seq0 + b if nxt_bq == pr.num_bq else seq0
        nxt_bq = 0 if nxt_bq == pr.num_bq else nxt_bq
        if nxt_seq < launch.end_seq:
          sem[0] = 1 - slot
          fetch_bq(nxt_seq, nxt_bq, sem[0], False)
        fetch_bq(seq0, bq_idx, slot, True)
        sz = q_sz(seq0, bq_idx)
        token_start = cu[seq0] + bq_idx * bq
        if launch.case == "page":
          bo = sem[2]
          if sz:
            wait_out(bo)
        for bkv_idx in range(pr.num_bkv):
          kslot = sem[1]
          nxt_bkv = bkv_idx + 1
          nbq = bq_idx + 1 if nxt_bkv == pr.num_bkv else bq_idx
          nxt_bkv = 0 if nxt_bkv == pr.num_bkv else nxt_bkv
          nseq = seq0 + b if nbq == pr.num_bq else seq0
          if nseq < launch.end_seq:
            sem[1] = 1 - kslot
            fetch_bkv(nseq, nxt_bkv, sem[1], False)
          fetch_bkv(seq0, bkv_idx, kslot, True)
          if launch.case != "page" and sz:  # M7: no rows, nothing sent
            bo = sem[2]
            wait_out(bo)
            start_out(bo, b * sz, token_start,
                      bkv_idx * launch.bkv_sz // _LANES)
            sem[2] = 1 - bo
        if launch.case == "page":
          if sz:
            start_out(bo, sz, token_start, 0)
          sem[2] = 1 - bo
      if pr.index == launch.grid - 1:  # epilogue
        for s in range(2):
          wait_out(s)
  return out


def steps(p: Plan) -> Iterator[dict]:
  """Every step in execution order."""
  for li, launch in enumerate(p.launches):
    for pr in launch.programs:
      for bq_idx in range(pr.num_bq):
        for bkv_idx in range(pr.num_bkv):
          yield dict(launch=li, case=launch.case, program=pr.index,
                     seqs=pr.seqs, bq=bq_idx, bkv=bkv_idx,
                     kv_lens=pr.kv_lens, bkv_sz=launch.bkv_sz)


# ---------------------------------------------------------------------------
# VMEM.


def scratch_bytes(scratch) -> dict[str, int]:
  """{name: bytes} of a launch's scratch list."""
  return {n: math.prod(s) * np.dtype(d).itemsize for n, s, d in scratch}


def pallas_calls(jaxpr):
  """The `pallas_call` equations of a `core.Jaxpr`, nested ones included."""
  from jax._src import core  # pylint: disable=g-import-not-at-top

  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      yield eqn
      continue
    for v in eqn.params.values():
      # `lax.cond` holds its branches in a tuple (M14).
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        if isinstance(sub, core.ClosedJaxpr):
          yield from pallas_calls(sub.jaxpr)
        elif isinstance(sub, core.Jaxpr):
          yield from pallas_calls(sub)


def declared_scratch(eqn) -> list[tuple[tuple[int, ...], str]]:
  """[(shape, dtype name)] of a traced `pallas_call`'s VMEM scratch operands
  (its semaphores left out)."""
  n = eqn.params["grid_mapping"].num_scratch_operands
  invars = eqn.params["jaxpr"].invars
  return [(tuple(v.aval.shape), np.dtype(v.aval.dtype).name)
          for v in invars[len(invars) - n:]
          if "SEMAPHORE" not in str(getattr(v.aval, "memory_space", "")).upper()]


def launch_case(name: str) -> tuple[str, int, int]:
  """A launch's (case, bq, bkv_p) from its name (`kernels.tpu.launch_name`,
  every body's): 'StreamIdxTC-d-bq_1-bkvp_3' -> ("decode", 1, 3), any
  variant's kind ('StreamIdxDenseTC-d-...') likewise; page kernels: "page"."""
  m = re.match(r"StreamIdx(?:(?!Page)[A-Z][a-z0-9]*)?(Page)?TC-(?:([dpm])-)?"
               r"bq_(\d+)-bkvp_(\d+)", name)
  if not m:
    return ("page" if "Page" in name else name), 0, 0
  case = "page" if m.group(1) else {"d": "decode", "p": "prefill",
                                     "m": "mixed"}[m.group(2)]
  return case, int(m.group(3)), int(m.group(4))


def traced_launches(v: variants_lib.Variant, args, static: dict) -> list:
  """[(launch name, equation)] of every `pallas_call` variant `v` makes at
  `args` with keywords `static`, traced with `jax.make_jaxpr`: nothing runs,
  so `args` may be production-size `jax.ShapeDtypeStruct`s. A token variant
  whose `static` names no `topk_method` is traced with the vendored sort (the
  chip's default may be a Pallas selection kernel, `topk.defaults`, whose
  call would come last)."""
  if v.mode == "token" and "topk_method" not in static:
    static = {**static, "topk_method": topk_lib.VENDORED_TOPK_METHOD}
  fn = functools.partial(v.kernel, **static)
  return [(eqn.params.get("name") or "pallas_call", eqn)
          for eqn in pallas_calls(jax.make_jaxpr(fn)(*args).jaxpr)]


def kernel_scratch(args, *, mode: str | None = None, variant: str | None = None,
                   **kwargs) -> list[dict]:
  """The declared VMEM scratch and vmem limit of every `traced_launches` of
  the kernel (`resolve_variant(variant, mode)`): {"case", "name", "scratch",
  "vmem_limit_bytes"} each."""
  return [{"case": launch_case(name)[0], "name": name,
           "scratch": declared_scratch(eqn),
           "vmem_limit_bytes": eqn.params["compiler_params"].vmem_limit_bytes}
          for name, eqn in traced_launches(resolve_variant(variant, mode),
                                           args, kwargs)]


def vmem_budget(g: Geometry, *, bq_sz: int, bkv_p: int, seq_batch_size: int = 1,
                case: str = "prefill", num_score_sublanes: int = 0,
                tpu_generation: int = 5) -> dict:
  """VMEM bytes of one launch configuration: per scratch buffer, their logical
  total `scratch`, `scratch_tiled` (as Mosaic lays them out, what the VMEM check
  and the compiler count), `logits` (the f32 [bq_sz * num_q_heads, bkv_sz] block
  product: an estimate of Mosaic's internal scratch) and `total`."""
  scratch = _scratch(case, g, seq_batch_size, bq_sz, bkv_p, num_score_sublanes)
  s = scratch_bytes(scratch)
  logits = bq_sz * g.num_q_heads * bkv_p * g.page_size * 4
  return dict(s, scratch=sum(s.values()),
              scratch_tiled=semantics.scratch_vmem_bytes(scratch, tpu_generation),
              logits=logits, total=sum(s.values()) + logits)


# ---------------------------------------------------------------------------
# Decode batching: blocks computed for nothing.


def block_waste(p: Plan, cases: Sequence[str] = ("decode", "decode_rest")) -> dict:
  """KV blocks (and entries) computed vs needed over the launches of `cases`:
  a program computes `num_bkv` blocks for each sequence, which needs
  `max(1, cdiv(kv_len, bkv_sz))`; the rest is fetched, multiplied, masked."""
  computed = needed = entries_computed = entries_needed = 0
  for launch in (l for l in p.launches if l.case in cases):
    for pr in launch.programs:
      for kv in pr.kv_lens:
        computed += pr.num_bkv
        needed += max(1, cdiv(kv, launch.bkv_sz))
        entries_computed += pr.num_bkv * launch.bkv_sz
        entries_needed += kv
  return dict(
      blocks_computed=computed, blocks_needed=needed,
      blocks_wasted=computed - needed,
      waste_fraction=(computed - needed) / computed if computed else 0.0,
      entries_computed=entries_computed, entries_needed=entries_needed,
      entry_efficiency=(entries_needed / entries_computed
                        if entries_computed else 1.0))


SORTS = ("none", "ascending", "descending", "optimal")
# The order the kernels' `sort_decode` uses (`semantics.decode_order`), also
# accepted by `batching_order` and `decode_batch_waste`.
KERNEL_SORT = "kernel"


def batching_order(blocks: Sequence[int], decode_req_batch_size: int,
                   sort: str = "optimal") -> list[int]:
  """An order of decode sequences (`blocks[i]`: KV blocks sequence i
  needs) for the kernel's grouping: [0, n // B * B) in groups of B, each
  computing B x its largest, the last n % B alone. sort: "none",
  "ascending", "descending" (by blocks), "optimal" (fewest blocks: dynamic
  programming choosing the n % B singles) or `KERNEL_SORT`
  (`semantics.decode_order`, what `sort_decode` picks)."""
  if sort not in SORTS + (KERNEL_SORT,):
    raise ValueError(f"sort must be one of {SORTS + (KERNEL_SORT,)}, got "
                     f"{sort!r}")
  n, b = len(blocks), int(decode_req_batch_size)
  if b < 1:
    raise ValueError(f"decode_req_batch_size must be >= 1, got {b}")
  if sort == "none" or n == 0:
    return list(range(n))
  if sort == KERNEL_SORT:
    # decode_order on block counts: ratio 1, one entry per block.
    order, _, _ = semantics.decode_order(
        np.asarray(blocks, np.int32), n, compression_ratio=1, bkv_sz=1,
        decode_req_batch_size=b)
    return [int(x) for x in np.asarray(order)]
  if sort in ("ascending", "descending"):
    return sorted(range(n), key=lambda i: blocks[i], reverse=sort == "descending")
  desc = sorted(range(n), key=lambda i: -blocks[i])
  r = n % b
  inf = float("inf")
  # best[i][s]: fewest blocks for desc[i:] with s of the r singles used.
  best = [[inf] * (r + 1) for _ in range(n + 1)]
  choice = [[None] * (r + 1) for _ in range(n + 1)]
  best[n][r] = 0
  for i in range(n - 1, -1, -1):
    f = blocks[desc[i]]
    for s in range(r + 1):
      if s < r and f + best[i + 1][s + 1] < best[i][s]:
        best[i][s], choice[i][s] = f + best[i + 1][s + 1], "single"
      if i + b <= n and b * f + best[i + b][s] < best[i][s]:
        best[i][s], choice[i][s] = b * f + best[i + b][s], "group"
  groups, singles, i, s = [], [], 0, 0
  while i < n:
    if choice[i][s] == "group":
      groups.extend(desc[i:i + b])
      i += b
    else:
      singles.append(desc[i])
      i, s = i + 1, s + 1
  return groups + singles


def decode_batch_waste(seq_lens: Sequence[int], *, page_size: int,
                       compression_ratio: int, num_kv_pages_per_block: int,
                       decode_req_batch_size: int, sort: str = "none",
                       fmt: str = "fp8", num_heads: int = 8) -> dict:
  """`block_waste` of a decode-only batch of `seq_lens` (tokens) in the order
  `batching_order(sort)` gives (returned as "order")."""
  lens = [int(s) for s in seq_lens]
  bkv_sz = num_kv_pages_per_block * page_size
  blocks = [max(1, cdiv(s // compression_ratio, bkv_sz)) for s in lens]
  order = batching_order(blocks, decode_req_batch_size, sort)
  b = batch_lib.make_mixed_batch(decode=[lens[i] for i in order],
                                 page_size=page_size,
                                 compression_ratio=compression_ratio)
  p = plan(b, fmt=fmt, num_heads=num_heads,
           num_kv_pages_per_block=num_kv_pages_per_block,
           num_queries_per_block=1, decode_req_batch_size=decode_req_batch_size,
           sort_decode=False)
  out = block_waste(p)
  out["order"] = order
  return out
