""""fused_blockmax": "blockmax" ranked by the block maxima the scoring kernel
writes (one per `block_max_width` = 128 entries): i32[T, k]
(docs/topk-methods.md, "The selection fused into the scoring")."""

from __future__ import annotations

from streamidx.topk import base, blockmax, top_k

# Entries per block maximum the fused kernel writes: one 128-lane row.
FUSED_BLOCK_WIDTH = 128


def fused_block_size_for(n: int, k: int,
                         width: int = FUSED_BLOCK_WIDTH) -> int:
  """The block: `blockmax.block_size_for(n, k)` as a multiple of `width`,
  the entries per maximum the kernel writes (so a block is whole maxima)."""
  return max(width, blockmax.block_size_for(n, k) // width * width)


def extra_ref(scores, *, block_size=None, block_max_width=FUSED_BLOCK_WIDTH):
  """The block maxima the kernel writes: f32[T, cdiv(N, block_max_width)]."""
  del block_size
  return blockmax.block_maxima(scores, block_max_width)


def select(scores, k, block_max=None, *, block_size=None,
           block_max_width=FUSED_BLOCK_WIDTH):
  n = scores.shape[1]
  if block_max is not None:
    need = -(-n // block_max_width)
    if (getattr(block_max, "ndim", None) != 2
        or block_max.shape[0] != scores.shape[0]
        or block_max.shape[1] < need):
      raise ValueError(
          f"block_max: must be f32[T, >= cdiv(N, block_max_width)] = "
          f"[{scores.shape[0]}, >= {need}] (got shape "
          f"{getattr(block_max, 'shape', None)})")
  if block_size is not None and block_size % block_max_width:
    raise ValueError(f"block_size: must be a multiple of block_max_width "
                     f"({block_max_width}) for 'fused_blockmax' "
                     f"(got {block_size})")
  b = block_size or fused_block_size_for(n, k, block_max_width)
  return blockmax.by_blocks(scores, k, b, block_max, block_max_width)


def cost(rows, entries, k, *, block_size=None,
         block_max_width=FUSED_BLOCK_WIDTH):
  t, n, w = rows, entries, block_max_width
  b = block_size or fused_block_size_for(n, k, w)
  blocks = -(-n // b)
  if blocks <= k:
    return top_k.cost(rows, entries, k)
  maxima = -(-n // w)  # the kernel's: one per 128 entries
  kernel_out = t * (-(-maxima // 128) * 128) * base.F32  # whole 128-lane rows
  g = b // w
  grouped = t * blocks * base.F32 if g > 1 else 0  # maxima of g maxima
  gather = t * k * b * base.F32
  sw = base.sort_work
  return base.TopkCost(
      "fused_blockmax", t * maxima * base.F32 + grouped + gather,
      kernel_out + grouped + t * k * base.I32 + base.winners_bytes(t, k),
      k * b / n, t * (sw(blocks) + sw(k) + sw(k * b)), t * maxima * (g > 1),
      f"the kernel writes {maxima} maxima of {w} entries a row"
      + (f", grouped into {blocks} blocks of {b}" if g > 1 else "")
      + f"; top-{k} blocks, top-{k} of their {k * b} entries")


METHOD = base.Method(
    name="fused_blockmax", exact=True, select=select, cost=cost,
    needs="block_max", extra_ref=extra_ref,
    doc="blockmax ranked by the block maxima the scoring kernel writes",
    options=(base.Option("block_size", "entries per block, a multiple of "
                         "block_max_width (default `fused_block_size_for(N, "
                         "k)`)"),
             base.Option("block_max_width", "entries per block maximum the "
                         "kernel writes", FUSED_BLOCK_WIDTH)))
