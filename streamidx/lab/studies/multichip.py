"""Notebook 09's check: the sharded layouts run for real, against one device,
in this process or a fresh one with virtual CPU devices (why, and CPU device
0 left out): docs/multichip.md, "Run against one device".
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from typing import Sequence

import jax
import numpy as np

import streamidx as si
from streamidx import metrics, sharded
from streamidx.lab import worker


@dataclasses.dataclass
class LayoutCheck:
  """One layout (`lab.sharding.LAYOUTS`) run on `devices` against the
  single-device reference."""

  layout: str
  variant: str
  fmt: str
  num_data: int
  num_context: int
  merge: str
  devices: str
  rows: int = 0
  identical: int = 0
  tied: int = 0
  ok: bool = False
  detail: str = ""
  atol: float = 0.0
  collective: str = ""
  pages_per_share: int = 0
  cache_bytes_per_device: int = 0
  merge_bytes_per_row: int = 0
  seconds: float = 0.0


def reserve_cpu_devices(n: int) -> bool:
  """Asks JAX for n + 1 CPU devices if no JAX backend has started yet (the
  count is fixed when the CPU backend starts); whether it could."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge._backends:  # pylint: disable=protected-access
    return False
  jax.config.update("jax_num_cpu_devices",
                    max(n + 1, jax.config.jax_num_cpu_devices))
  return True


def mesh_devices(n: int):
  """(devices, description) for an n-device mesh: the TPU's when it has n,
  else CPU devices 1..n (interpreted); (None, why) when neither exists."""
  reserve_cpu_devices(n)
  if jax.default_backend() == "tpu" and len(jax.devices()) >= n:
    return jax.devices()[:n], f"{n} x {jax.devices()[0].device_kind} (compiled)"
  cpus = jax.devices("cpu")
  if len(cpus) < n + 1:
    return None, (f"{len(cpus)} CPU devices exist; {n + 1} are needed and "
                  "JAX's CPU backend has started")
  return cpus[1:n + 1], f"{n} x cpu (interpreted)"


def check_layouts(batch_kw: dict, layouts: Sequence[dict], *,
                  variant: str = "vendored", fmt: str = "fp8",
                  num_heads: int = 4, k: int = 8, compression_ratio: int = 4,
                  seed: int = 0) -> list[LayoutCheck]:
  """A `LayoutCheck` per `layouts` dict (layout, num_data, num_context[,
  merge]) on `streamidx.make_mixed_batch(**batch_kw)`."""
  reserve_cpu_devices(max(int(l["num_data"]) * int(l["num_context"])
                          for l in layouts))
  v = si.VARIANTS[variant]
  batch = si.make_mixed_batch(**batch_kw)
  inputs = si.make_inputs(batch, num_heads=num_heads, fmt=fmt, seed=seed)
  static = v.block_sizes(cache_format=fmt, num_heads=num_heads,
                         page_size=int(batch.page_size)).kwargs()
  want = np.asarray(v.run_reference(inputs, k=k,
                                    compression_ratio=compression_ratio,
                                    fmt=fmt, **static))
  scores = v.scores(inputs, compression_ratio=compression_ratio, fmt=fmt)
  atol = metrics.summation_atol(inputs, compression_ratio=compression_ratio,
                                mode=v.mode)
  out = []
  for spec in layouts:
    nd, nc = int(spec["num_data"]), int(spec["num_context"])
    merge = spec.get("merge", "all_gather")
    devices, desc = mesh_devices(nd * nc)
    r = LayoutCheck(spec["layout"], variant, fmt, nd, nc, merge, desc,
                    atol=atol)
    out.append(r)
    if devices is None:
      r.detail = desc
      continue
    t0 = time.time()
    s = sharded.shard_inputs(inputs, v, num_data=nd, num_context=nc, fmt=fmt)
    r.pages_per_share = s.pages_per_share
    r.cache_bytes_per_device = s.cache_bytes_per_device
    r.merge_bytes_per_row = (sharded.merge_bytes_per_row(k, nc, merge)
                             if nc > 1 else 0)
    fn = sharded.sharded_topk(
        v, sharded.make_mesh(nd, nc, devices=devices),
        data_axis="data" if nd > 1 else None,
        context_axis="context" if nc > 1 else None, k=k,
        compression_ratio=compression_ratio, merge=merge, **static)
    # CPU devices beside a TPU backend: force the interpreter (on a CPU
    # backend it is the default already).
    force = devices[0].platform == "cpu" and jax.default_backend() != "cpu"
    with si.interpreter() if force else contextlib.nullcontext():
      lowered = fn.lower(*s.args)
      text = lowered.as_text()
      r.collective = next((op for op in ("all_gather", "collective_permute")
                           if op in text), "")
      got = s.gather_rows(jax.block_until_ready(lowered.compile()(*s.args)))
    c = metrics.compare_topk(got, want, scores, atol=atol)
    r.rows, r.identical, r.tied = c.rows, c.rows_identical, c.rows_tied
    r.ok, r.detail = bool(c.ok), ("" if c.ok else c.detail)
    r.seconds = time.time() - t0
  return out


def check_layouts_subprocess(batch_kw: dict, layouts: Sequence[dict], *,
                             timeout_s: float = 900, **kw
                             ) -> list[LayoutCheck]:
  """`check_layouts` in a fresh process with n + 1 virtual CPU devices;
  RuntimeError with the child's output if it fails."""
  n = max(int(l["num_data"]) * int(l["num_context"]) for l in layouts)
  env = {"JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                       f" --xla_force_host_platform_device_count={n + 1}")}
  request = {"batch_kw": batch_kw, "layouts": list(layouts), **kw}
  return [LayoutCheck(**r) for r in worker.run(__name__, request, env=env,
                                                timeout=timeout_s)]


def _serve(request: dict) -> list[dict]:
  checks = check_layouts(request.pop("batch_kw"), request.pop("layouts"),
                         **request)
  return [dataclasses.asdict(c) for c in checks]


def main(argv=None) -> int:
  return 0 if worker.serve(sys.argv[1:] if argv is None else argv,
                           _serve) else 2


if __name__ == "__main__":
  raise SystemExit(main())
