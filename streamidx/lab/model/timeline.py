"""The kernel's DMA and compute order, observed while the TPU interpreter runs it
(`with record() as rec:`; `rec.dma_events()` compares with
`tiling.expected_dma_events`; docs/tpu.md, "The DMA timeline").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading

import jax
import numpy as np

from streamidx import modes
from streamidx.kernels.dense import SEMAPHORE_ROWS
from streamidx.lab.model import tiling

SEMAPHORE_KINDS = SEMAPHORE_ROWS  # what each row of the kernel's `sems` guards
_WRAPPED = ("_initialize_shared_memory", "_allocate_buffer",
            "_allocate_semaphores", "dma_start", "dma_wait", "get", "swap")
_SPACE = {"vmem": "vmem", "smem": "smem", "hbm": "hbm", "any": "hbm"}
_LANE_NAMES = {"kv": "KV pages", "q": "q + weights", "w": "q + weights",
               "out": "scores -> HBM", "kv_scale": "KV scales",
               "block_max": "block maxima -> HBM"}


@dataclasses.dataclass
class Op:
  """One recorded interpreter operation: kind "launch", "alloc", "sems",
  "grid", "dma_start" / "dma_wait", "load" / "store" or "error"."""

  seq: int
  launch: int
  kind: str
  info: dict


def _range(transforms):
  from jax._src.pallas.mosaic.interpret import utils  # pylint: disable=g-import-not-at-top
  return utils.to_range(jax.tree.map(int, transforms))


def _first(rng, axis=0):
  r = rng[axis]
  return r.start if isinstance(r, slice) else int(r)


class Recorder:
  """Collects the operations of every kernel launch run inside `record()`."""

  def __init__(self):
    self.ops: list[Op] = []
    self._lock = threading.Lock()
    self._counter = itertools.count()
    self._launch = -1
    self._buffers: dict[tuple, dict] = {}  # (launch, space, id) -> alloc info
    self._sems: dict[tuple, tuple] = {}  # (launch, sem id) -> (kind, slot, b)

  # -- recording ------------------------------------------------------------

  def _add(self, kind, **info):
    with self._lock:
      self.ops.append(Op(next(self._counter), self._launch, kind, info))

  def on_grid_point(self, token, grid_point, core):
    self._add("grid", point=tuple(int(x) for x in np.ravel(grid_point)),
              core=int(core))
    return token

  @staticmethod
  def _space(idx):
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc  # pylint: disable=g-import-not-at-top
    return _SPACE.get(ipc.TPU_MEMORY_SPACE_NAMES[int(idx)], str(idx))

  def _wrap(self, name, orig):
    rec = self

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
      out = orig(*args, **kwargs)
      try:
        rec._observe(name, args, out)  # pylint: disable=protected-access
      except Exception as e:  # never break the kernel run; keep the evidence
        rec._add("error", where=name, error=repr(e))
      return out

    # The interpreter calls `get.__wrapped__` / `store.__wrapped__` for the
    # DMA engine's own reads and writes: those must stay unrecorded.
    if hasattr(orig, "__wrapped__"):
      wrapper.__wrapped__ = orig.__wrapped__
    return wrapper

  def _observe(self, name, args, out):
    if name == "_initialize_shared_memory":
      with self._lock:
        self._launch += 1
      self._add("launch")
    elif name == "_allocate_buffer":
      val = np.asarray(args[4])
      info = dict(space=self._space(args[3]), buffer=int(out[1]),
                  shape=tuple(val.shape), dtype=val.dtype.name)
      self._buffers[(self._launch, info["space"], info["buffer"])] = info
      self._add("alloc", **info)
    elif name == "_allocate_semaphores":
      ids = np.asarray(out[1])
      for idx in np.ndindex(ids.shape):
        self._sems[(self._launch, int(ids[idx]))] = (
            (SEMAPHORE_KINDS[idx[0]], idx[1], idx[2]) if len(idx) == 3
            else (str(idx), -1, -1))
      self._add("sems", shape=tuple(ids.shape))
    elif name == "dma_start":
      (_, _, _, src_space, src_id, src_tr, dst_space, dst_id, dst_tr,
       dst_sem) = args[:10]
      src = (self._space(src_space), int(src_id), _range(src_tr))
      dst = (self._space(dst_space), int(dst_id), _range(dst_tr))
      kind, slot, b = self._sems.get((self._launch, int(dst_sem)), ("?", -1, -1))
      alloc = self._buffers.get((self._launch, dst[0], dst[1]))
      covered = alloc and np.broadcast_to(0, alloc["shape"])[dst[2]].size
      nbytes = -1 if alloc is None else covered * np.dtype(alloc["dtype"]).itemsize
      self._add("dma_start", sem=kind, slot=slot, batch_idx=b, nbytes=nbytes,
                src=src, dst=dst)
    elif name == "dma_wait":
      kind, slot, b = self._sems.get((self._launch, int(args[3])), ("?", -1, -1))
      self._add("dma_wait", sem=kind, slot=slot, batch_idx=b,
                nbytes=int(args[4]))
    elif name in ("get", "swap") and self._space(args[3]) == "vmem":
      buf = int(args[4])
      alloc = self._buffers.get((self._launch, "vmem", buf), {})
      self._add("load" if name == "get" else "store", buffer=buf,
                shape=alloc.get("shape"), range=_range(args[5]))

  # -- reading --------------------------------------------------------------

  def allocations(self, space: str = "vmem") -> list[list[tuple]]:
    """Per launch, the (shape, dtype) of every buffer allocated in `space`."""
    out = [[] for _ in range(self._launch + 1)]
    for op in self.ops:
      if op.kind == "alloc" and op.info["space"] == space:
        out[op.launch].append((op.info["shape"], op.info["dtype"]))
    return out

  def errors(self) -> list[Op]:
    return [op for op in self.ops if op.kind == "error"]

  def dma_events(self) -> list[tiling.Event]:
    """The recorded DMAs as `tiling.Event`s (same fields as the model's)."""
    events = []
    for op in (o for o in self.ops if o.kind in ("dma_start", "dma_wait")):
      i, start = op.info, op.kind == "dma_start"
      page = _first(i["src"][2]) if start and i["sem"] in ("kv", "kv_scale") else -1
      row, col = ((_first(i["dst"][2]), _first(i["dst"][2], 1))
                  if start and i["sem"] == "out" else (-1, -1))
      events.append(tiling.Event(op.launch, op.kind[4:], i["sem"], i["slot"],
                                 i["batch_idx"], i["nbytes"], page, row, col))
    return events

  def lanes(self) -> list[dict]:
    """Intervals to draw, DMAs (start..wait) and compute steps (KV load..score
    store): dicts of lane, start, end, launch, count, batch_idx and sem."""
    vmem = {}
    for op in self.ops:
      if op.kind == "alloc" and op.info["space"] == "vmem":
        vmem.setdefault(op.launch, []).append(op.info["buffer"])
    out, pending, compute_start = [], {}, None
    for op in self.ops:
      i, bufs = op.info, vmem.get(op.launch, [])
      key = (op.launch, i.get("sem"), i.get("slot"), i.get("batch_idx"))
      if op.kind == "dma_start":
        pending.setdefault(key, []).append(op.seq)
      elif op.kind == "dma_wait" and pending.get(key):
        starts = pending.pop(key)
        name = _LANE_NAMES.get(i["sem"], i["sem"])
        out.append(dict(lane=f"{name} (slot {i['slot']})", start=min(starts),
                        end=op.seq, launch=op.launch, count=len(starts),
                        batch_idx=i["batch_idx"], sem=i["sem"]))
      elif (op.kind == "load" and bufs and i["buffer"] == bufs[0]
            and compute_start is None):
        compute_start = op.seq  # first read of the KV block buffer
      # The score block is the last scratch buffer (4th of the vendored
      # kernel's, 5th of the dense kernel's).
      elif (op.kind == "store" and len(bufs) >= 4 and i["buffer"] == bufs[-1]
            and compute_start is not None):
        out.append(dict(lane="compute", start=compute_start, end=op.seq,
                        launch=op.launch, count=1, batch_idx=0, sem="compute"))
        compute_start = None
    return out


@contextlib.contextmanager
def record():
  """Runs kernel calls inside the block interpreted, recorded; a `Recorder`."""
  reason = modes.interpreter_internals_missing("timeline")
  if reason:
    raise RuntimeError(f"streamidx.lab.model.timeline.record: {reason}")
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc  # pylint: disable=g-import-not-at-top
  rec = Recorder()
  saved = {n: getattr(ipc, n) for n in _WRAPPED}
  try:
    for n in _WRAPPED:
      setattr(ipc, n, rec._wrap(n, saved[n]))  # pylint: disable=protected-access
    with modes.interpreter(grid_point_recorder=rec.on_grid_point):
      yield rec
  finally:
    for n, f in saved.items():
      setattr(ipc, n, f)
