"""The kernel's DMA and compute order, observed while the TPU interpreter runs it.

`record()` is a context manager. Inside it, kernel calls run in Pallas's TPU
interpreter, and the interpreter's own Python-level operations are wrapped
for the duration of the block, so that each one the kernel triggers is
recorded, in order, with a sequence number:

- a launch starting (`_initialize_shared_memory`: one per `pallas_call`),
- VMEM/SMEM/HBM buffer allocation (`_allocate_buffer`) and the DMA
  semaphore array (`_allocate_semaphores`: the kernel's `sems[4, 2, B]`),
- each grid point (`InterpretParams.grid_point_recorder`),
- DMA starts and waits (`dma_start`, `dma_wait`),
- loads from and stores to VMEM (`get`, `swap`): the kernel reading a KV
  block (the start of a compute step) and writing a block of scores (its end).

Nothing in `kernel.py` changes; the recorder watches the kernel as it runs.
The x axis of a timeline is this sequence number (the order in which the
kernel issued the operations), not time: the interpreter executes a DMA
when it is waited for, and its clock measures Python, not a TPU.

    with streamidx.lab.model.timeline.record() as rec:
      idx = streamidx.streamindex_topk(*inp.args, **kw)
    events = rec.dma_events()    # comparable to tiling.expected_dma_events
    rec.plot(ax)

Written against the interpreter of jax 0.10.2
(`jax._src.pallas.mosaic.interpret.interpret_pallas_call`); on a JAX whose
interpreter lacks these functions `record()` raises a RuntimeError naming
them (`streamidx.modes.interpreter_internals_missing("timeline")`, which a
notebook can ask first). Every call traced inside the block is traced afresh (the recorder's
`InterpretParams` are new, and they are part of the jit cache key), so the
first call inside costs a compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading
from typing import Any

import numpy as np

from streamidx import modes
from streamidx.lab.model import tiling

__all__ = ["Op", "Recorder", "record", "SEMAPHORE_KINDS", "plot_timeline"]

# First axis of the kernel's `sems` scratch: what each semaphore row guards
# (the dense FP8 kernel has a fifth row, its scale DMAs, and a sixth, its
# block maxima under "fused_blockmax": `streamidx.kernels.dense.SEMAPHORE_ROWS`).
SEMAPHORE_KINDS = ("kv", "q", "out", "w", "kv_scale", "block_max")
_WRAPPED = ("_initialize_shared_memory", "_allocate_buffer",
            "_allocate_semaphores", "dma_start", "dma_wait", "get", "swap")
_SPACE = {"vmem": "vmem", "smem": "smem", "hbm": "hbm", "any": "hbm"}


@dataclasses.dataclass
class Op:
  """One recorded interpreter operation.

  kind: "launch", "alloc", "sems", "grid", "dma_start", "dma_wait", "load",
  "store". For DMAs: sem (its kind: kv/q/w/out), slot, batch_idx, nbytes;
  src/dst: (memory space, buffer id, index range). For loads and stores:
  buffer (scratch name when known), range. For allocations: space, shape,
  dtype, buffer id.
  """

  seq: int
  launch: int
  kind: str
  info: dict


def _ints(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(int, tree)


def _range(transforms):
  from jax._src.pallas.mosaic.interpret import utils  # pylint: disable=g-import-not-at-top
  return utils.to_range(_ints(transforms))


def _extent(rng, shape):
  """Elements covered by an index range over a buffer of `shape`."""
  n = 1
  for i, d in enumerate(shape):
    r = rng[i] if i < len(rng) else None
    if r is None:
      n *= d
    elif isinstance(r, slice):
      step = r.step or 1
      n *= max(0, -(-(r.stop - r.start) // step))
  return n


def _first(rng):
  r = rng[0]
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

  def _space(self, idx):
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
      space = self._space(args[3])
      val = np.asarray(args[4])
      buf = int(out[1])
      info = dict(space=space, buffer=buf, shape=tuple(val.shape),
                  dtype=val.dtype.name)
      self._buffers[(self._launch, space, buf)] = info
      self._add("alloc", **info)
    elif name == "_allocate_semaphores":
      ids = np.asarray(out[1])
      for idx in np.ndindex(ids.shape):
        kind = SEMAPHORE_KINDS[idx[0]] if len(idx) == 3 else str(idx)
        slot = idx[1] if len(idx) == 3 else -1
        b = idx[2] if len(idx) == 3 else -1
        self._sems[(self._launch, int(ids[idx]))] = (kind, slot, b)
      self._add("sems", shape=tuple(ids.shape))
    elif name == "dma_start":
      (_, _, _, src_space, src_id, src_tr, dst_space, dst_id, dst_tr,
       dst_sem) = args[:10]
      src = (self._space(src_space), int(src_id), _range(src_tr))
      dst = (self._space(dst_space), int(dst_id), _range(dst_tr))
      kind, slot, b = self._sems.get((self._launch, int(dst_sem)), ("?", -1, -1))
      alloc = self._buffers.get((self._launch, dst[0], dst[1]))
      nbytes = -1
      if alloc is not None:
        nbytes = _extent(dst[2], alloc["shape"]) * np.dtype(alloc["dtype"]).itemsize
      self._add("dma_start", sem=kind, slot=slot, batch_idx=b, nbytes=nbytes,
                src=src, dst=dst)
    elif name == "dma_wait":
      kind, slot, b = self._sems.get((self._launch, int(args[3])), ("?", -1, -1))
      self._add("dma_wait", sem=kind, slot=slot, batch_idx=b,
                nbytes=int(args[4]))
    elif name in ("get", "swap"):
      space = self._space(args[3])
      if space != "vmem":
        return
      buf = int(args[4])
      alloc = self._buffers.get((self._launch, space, buf), {})
      self._add("load" if name == "get" else "store", buffer=buf,
                shape=alloc.get("shape"), range=_range(args[5]))

  # -- reading --------------------------------------------------------------

  def allocations(self, space: str = "vmem") -> list[list[tuple]]:
    """Per launch, the (shape, dtype) of every buffer allocated in `space`."""
    n = self._launch + 1
    out = [[] for _ in range(n)]
    for op in self.ops:
      if op.kind == "alloc" and op.info["space"] == space:
        out[op.launch].append((op.info["shape"], op.info["dtype"]))
    return out

  def errors(self) -> list[Op]:
    return [op for op in self.ops if op.kind == "error"]

  def dma_events(self) -> list[tiling.Event]:
    """The recorded DMAs as `tiling.Event`s (same fields as the model's)."""
    events = []
    for op in self.ops:
      if op.kind not in ("dma_start", "dma_wait"):
        continue
      i = op.info
      page = row = col = -1
      if op.kind == "dma_start" and i["sem"] in ("kv", "kv_scale"):
        page = _first(i["src"][2])
      if op.kind == "dma_start" and i["sem"] == "out":
        row, col = _first(i["dst"][2]), i["dst"][2][1].start
      events.append(tiling.Event(op.launch, op.kind[4:], i["sem"], i["slot"],
                                 i["batch_idx"], i["nbytes"], page, row, col))
    return events

  def lanes(self) -> list[dict]:
    """Intervals to draw: DMAs (start..wait) and compute steps (KV load..score store).

    Each dict: lane ("KV pages (slot 0)", "q + weights (slot 1)", "compute",
    "scores -> HBM (slot 0)", ...), start and end operation numbers, launch,
    count (DMAs the bar stands for: a KV bar is one sequence's bkv_p page
    DMAs), batch_idx (the sequence's position in its program) and sem.
    """
    vmem = {}
    for op in self.ops:
      if op.kind == "alloc" and op.info["space"] == "vmem":
        vmem.setdefault(op.launch, []).append(op.info["buffer"])
    out, pending = [], {}
    compute_start = None
    for op in self.ops:
      i = op.info
      if op.kind == "dma_start":
        pending.setdefault((op.launch, i["sem"], i["slot"], i["batch_idx"]),
                           []).append(op.seq)
      elif op.kind == "dma_wait":
        key = (op.launch, i["sem"], i["slot"], i["batch_idx"])
        starts = pending.pop(key, [])
        if starts:
          lane = _lane(i["sem"], i["slot"])
          out.append(dict(lane=lane, start=min(starts), end=op.seq,
                          launch=op.launch, count=len(starts),
                          batch_idx=i["batch_idx"], sem=i["sem"]))
      elif op.kind == "load":
        bufs = vmem.get(op.launch, [])
        if bufs and i["buffer"] == bufs[0] and compute_start is None:
          compute_start = op.seq  # first read of the KV block buffer
      elif op.kind == "store":
        bufs = vmem.get(op.launch, [])
        # The score block is the last scratch buffer (4th of the vendored
        # kernel's, 5th of the dense kernel's).
        if len(bufs) >= 4 and i["buffer"] == bufs[-1] and compute_start is not None:
          out.append(dict(lane="compute", start=compute_start, end=op.seq,
                          launch=op.launch, count=1, batch_idx=0,
                          sem="compute"))
          compute_start = None
    return out

  def plot(self, ax=None, **kwargs):
    return plot_timeline(self, ax=ax, **kwargs)


def _lane(sem, slot):
  name = {"kv": "KV pages", "q": "q + weights", "w": "q + weights",
          "out": "scores -> HBM", "kv_scale": "KV scales",
          "block_max": "block maxima -> HBM"}.get(sem, sem)
  return f"{name} (slot {slot})"


LANE_ORDER = ("KV pages (slot 0)", "KV pages (slot 1)", "q + weights (slot 0)",
              "q + weights (slot 1)", "compute", "scores -> HBM (slot 0)",
              "scores -> HBM (slot 1)")


def plot_timeline(rec: Recorder, ax=None, *, launches=None, title=None):
  """Draws the recorded DMAs (start to wait) and compute steps, by lane.

  x: the interpreter's operation sequence number (issue order, not time).
  Vertical lines mark grid points (programs) and launches. Within a lane,
  the sequences of a batched decode program have one sub-row each.
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  if ax is None:
    _, ax = plt.subplots(figsize=(12, 3.8))
  lanes = [l for l in rec.lanes() if launches is None or l["launch"] in launches]
  colors = {"KV ": "tab:blue", "q +": "tab:green", "com": "tab:orange",
            "sco": "tab:red"}
  rows = {name: i for i, name in enumerate(LANE_ORDER)}
  # Sequences of one program (decode batches) get sub-rows of their lane;
  # q and weights DMAs share theirs (weights drawn lighter).
  per_launch = {}
  for l in lanes:
    per_launch[l["launch"]] = max(per_launch.get(l["launch"], 1), l["batch_idx"] + 1)
  for l in lanes:
    n = per_launch[l["launch"]] if l["sem"] != "out" else 1
    h = 0.7 / n
    y = rows.get(l["lane"], len(rows)) - 0.35 + h * (l["batch_idx"] if n > 1 else 0) + h / 2
    c = colors.get(l["lane"][:3], "gray")
    ax.barh(y, l["end"] - l["start"], left=l["start"], height=h * 0.85, color=c,
            alpha=0.55 if l["sem"] == "w" else 1.0, edgecolor="black",
            linewidth=0.3)
  for op in rec.ops:
    if launches is not None and op.launch not in launches:
      continue
    if op.kind == "grid":
      ax.axvline(op.seq, color="gray", lw=0.6, ls=":")
    elif op.kind == "launch":
      ax.axvline(op.seq, color="black", lw=1.2)
  ax.set_yticks(range(len(LANE_ORDER)))
  ax.set_yticklabels(LANE_ORDER)
  ax.invert_yaxis()
  ax.set_xlabel("interpreter operation number (issue order; dotted: program "
                "start, solid: launch start)")
  if title:
    ax.set_title(title)
  return ax


@contextlib.contextmanager
def record(**interpret_options: Any):
  """Runs kernel calls inside the block interpreted, recording their operations.

  `interpret_options` are further `InterpretParams` fields (e.g.
  `dma_execution_mode="eager"`). Yields a `Recorder`.
  """
  reason = modes.interpreter_internals_missing("timeline")
  if reason:
    raise RuntimeError(f"streamidx.lab.model.timeline.record: {reason}")
  from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc  # pylint: disable=g-import-not-at-top
  rec = Recorder()
  saved = {n: getattr(ipc, n) for n in _WRAPPED}
  try:
    for n in _WRAPPED:
      setattr(ipc, n, rec._wrap(n, saved[n]))  # pylint: disable=protected-access
    with modes.interpreter(grid_point_recorder=rec.on_grid_point,
                           **interpret_options):
      yield rec
  finally:
    for n, f in saved.items():
      setattr(ipc, n, f)
