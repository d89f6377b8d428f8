"""The sharded indexer compiled for a TPU slice without a TPU; its collectives
(the layouts, default shapes and byte counts: docs/multichip.md, "Compiled for
a slice without a TPU").
"""

from __future__ import annotations

import dataclasses
import re
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import streamidx as si
from streamidx import cache as cache_lib
from streamidx import modes, sharded
from streamidx.lab import dump

LAYOUTS = ("sequence-parallel", "context-parallel", "2d")
# Slices to compile for: name -> (generation, devices, 2-D mesh shape).
TOPOLOGIES = {"v6e:2x2": ("v6e", 4, (2, 2)), "tpu7x:2x2x1": ("v7x", 8, (2, 4)),}

_OPS = ("all-gather", "collective-permute", "all-reduce", "all-to-all",
        "reduce-scatter")
_LINE = re.compile(
    r"=\s*(?P<type>\(.*?\)|\S+)\s+(?P<op>(?:%s)(?:-start)?)\(" % "|".join(_OPS))
_SHAPE = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_GROUPS = re.compile(r"replica_groups=\{\{([0-9,]*)\}")


@dataclasses.dataclass(frozen=True)
class Collective:
  """One collective of a compiled program (async "-start" folded in)."""

  op: str  # "all-gather", "collective-permute", ...
  shapes: tuple[str, ...]  # its output arrays, e.g. ("s32[8,2048]",)
  output_bytes: int  # per device
  group_size: int  # devices per replica group (collective-permute: 2)
  received_bytes: int  # what one device receives (docs/multichip.md)


def collectives(hlo_text: str) -> list[Collective]:
  """The collectives of a compiled program's HLO text (`compiled.as_text()`)."""
  found = []
  for line in hlo_text.splitlines():
    m = _LINE.search(line)
    if not m:
      continue
    op = m.group("op")  # scalars (async contexts), unknown types left out:
    arrays = [(d, dims) for d, dims in _SHAPE.findall(m.group("type"))
              if d in dump.DTYPE_BYTES and dims]
    if op.endswith("-start"):  # (operands..., outputs...)
      op = op[:-len("-start")]
      arrays = arrays[len(arrays) // 2:]
    nbytes = sum(dump.array_bytes(d, dims) for d, dims in arrays)
    if op == "collective-permute":
      group, received = 2, nbytes
    else:
      g = _GROUPS.search(line)
      group = len(g.group(1).split(",")) if g and g.group(1) else 1
      received = (nbytes * (group - 1) // group if op == "all-gather"
                  else nbytes)
    found.append(Collective(op, tuple(f"{d}[{s}]" for d, s in arrays),
                            nbytes, group, received))
  return found


@dataclasses.dataclass
class ShardedCompile:
  """One compile of a sharded layout for a topology."""

  topology: str
  generation: str
  layout: str
  variant: str
  merge: str
  mesh_shape: tuple[int, int]
  rows_per_shard: int
  k: int
  ok: bool
  error: str = ""
  seconds: float = 0.0
  has_kernel: bool = False
  collectives: list[Collective] = dataclasses.field(default_factory=list)
  cache_bytes_per_device: int = 0

  # E.g. "2d/vendored/tree/v6e:2x2".
  name = property(lambda self: "/".join(
      (self.layout, self.variant, self.merge, self.topology)))
  # Bytes one device receives per step, compiled and modelled.
  received_bytes = property(lambda self: sum(
      c.received_bytes for c in self.collectives))
  model_received_bytes = property(lambda self: self.rows_per_shard
                                  * sharded.merge_bytes_per_row(
                                      self.k, self.mesh_shape[1], self.merge))

  def row(self) -> dict:
    return {
        "layout": self.layout, "variant": self.variant, "merge": self.merge,
        "topology": self.topology, "mesh (data x context)":
            f"{self.mesh_shape[0]}x{self.mesh_shape[1]}",
        "compiles": "yes" if self.ok else f"NO: {self.error[:80]}",
        "kernel": self.has_kernel,
        "collectives": ", ".join(f"{c.op} {'+'.join(c.shapes)}"
                                 for c in self.collectives) or "none",
        "received B/device/step": self.received_bytes,
        "model B/device/step": self.model_received_bytes,
        "cache B/device": self.cache_bytes_per_device,
        "compile s": round(self.seconds, 1),
    }


def compile_sharded(topology: str, layout: str, *, variant: str = "vendored",
                    merge: str = "all_gather", fmt: str = "fp8",
                    num_heads: int = 64, head_dim: int = 128,
                    page_size: int = 128, seqs_per_shard: int = 8,
                    pages_per_share: int = 16, k: int | None = None,
                    **overrides) -> ShardedCompile:
  """Compiles `streamidx.sharded.sharded_topk` for a `TOPOLOGIES` slice, no
  TPU: `seqs_per_shard` decode sequences per data shard, `pages_per_share`
  page-table columns per device, k default 512 (token mode) or 8 pages,
  `overrides` the block sizes. A compiler error is recorded (`ok` False)."""
  if topology not in TOPOLOGIES:
    raise ValueError(f"topology: must be one of {tuple(TOPOLOGIES)} "
                     f"(got {topology!r})")
  if layout not in LAYOUTS:
    raise ValueError(f"layout: must be one of {LAYOUTS} (got {layout!r})")
  generation, ndev, shape_2d = TOPOLOGIES[topology]
  nd, nc = {"sequence-parallel": (ndev, 1), "context-parallel": (1, ndev),
            "2d": shape_2d}[layout]
  v = si.VARIANTS[variant]
  page = v.mode == "page"
  k = (8 if page else 512) if k is None else k
  s = seqs_per_shard
  g = s * pages_per_share
  result = ShardedCompile(topology, generation, layout, variant, merge,
                          (nd, nc), s, k, ok=False,
                          cache_bytes_per_device=g * page_size *
                          cache_lib.record_bytes(fmt, head_dim))
  data_axis = "data" if nd > 1 else None
  context_axis = "context" if nc > 1 else None
  both = tuple(a for a in (data_axis, context_axis) if a)
  t0 = time.time()
  try:
    # `compile_for` loads libtpu for this very slice (`modes.TOPOLOGIES`) and
    # traces the kernels compiled (Mosaic), not interpreted.
    assert modes.TOPOLOGIES[generation] == topology, topology
    with modes.compile_for(generation) as target:
      mesh = sharded.make_mesh(nd, nc, devices=target.devices)

      def sds(shape, dtype, spec):
        return jax.ShapeDtypeStruct(shape, dtype,
                                    sharding=NamedSharding(mesh, P(spec)))

      rows, pages = data_axis, both if len(both) > 1 else both[0]
      packing = cache_lib.kv_packing(fmt)
      args = (sds((nd * s, num_heads, head_dim), jnp.bfloat16, rows),
              sds((nd * s, num_heads), jnp.float32, rows),
              sds((nd * nc * g, page_size // packing, packing,
                   cache_lib.lkv_dim(fmt, head_dim)),
                  cache_lib.cache_dtype(fmt), pages),
              sds((nd * s,), jnp.int32, rows),
              sds((nd * nc * g,), jnp.int32, pages),
              sds((nd * (s + 1),), jnp.int32, rows),
              sds((nd,) if page else (nd * 3,), jnp.int32, rows))
      static = v.block_sizes(cache_format=fmt, num_heads=num_heads,
                             page_size=page_size,
                             generation=generation).kwargs()
      fn = sharded.sharded_topk(v, mesh, data_axis=data_axis,
                                context_axis=context_axis, k=k,
                                compression_ratio=1 if page else 4,
                                merge=merge, **{**static, **overrides})
      text = fn.lower(*args).compile().as_text()
    result.has_kernel = 'custom_call_target="tpu_custom_call"' in text
    result.collectives = collectives(text)
    result.ok = True
  except Exception as e:  # pylint: disable=broad-except
    result.error = f"{type(e).__name__}: {e}".splitlines()[0]
  result.seconds = time.time() - t0
  return result


def compile_matrix(topologies=tuple(TOPOLOGIES), *, quick: bool = False
                   ) -> list[ShardedCompile]:
  """Every layout (and merge) for every topology; page variants unless quick."""
  runs = []
  for topo in topologies:
    for layout in LAYOUTS:
      merges = ("all_gather",) if layout == "sequence-parallel" else (
          "all_gather", "tree")
      for merge in merges:
        runs.append(compile_sharded(topo, layout, merge=merge))
      if not quick and layout != "2d":
        # Decode rows: one query block of 8 rows (the table's 512 would
        # exceed VMEM at 64 heads on v6e: E1001).
        runs.append(compile_sharded(topo, layout, variant="vendored_page",
                                    page_size=16, pages_per_share=128,
                                    num_queries_per_block=8))
  return runs
