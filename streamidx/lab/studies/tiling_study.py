"""Notebook 06's tiling bounds (the static-schedule bound of its decode pages) and its megacore
compile (libtpu, no TPU). Models and compiles; no TPU measurement here.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from typing import Mapping, Sequence

from streamidx import variants as variants_lib
from streamidx.lab.model import hardware, roofline


def decode_page_bounds(generation: str, variants: Sequence[tuple[str, str]],
                       blocks: Mapping, *, shape: str = "dsv4-decode-4k"
                       ) -> tuple[dict, list[str]]:
  """({variant: `roofline.PageBound` of its decode launch on `generation`
  at `shape` (`lab.aot.SHAPES`)}, error lines of launches that did not
  schedule). variants: (variant, fmt) pairs; blocks: block-size keywords."""
  from streamidx.lab import schedule  # pylint: disable=g-import-not-at-top
  out, errors = {}, []
  for variant, fmt in variants:
    scheds = schedule.launch_schedules(variant, generation, fmt, shape,
                                       dict(blocks), launches=["decode"])
    bounds = roofline.page_bounds(scheds)
    if bounds:
      out[variant] = bounds[0]
    errors += [f"{generation} {variant} {s.launch}: {s.error}" for s in scheds
               if s.kv is None]
  return out, errors


def megacore_rows(generations: Sequence[str] = ("v5p", "v4"), *,
                  shape: str = "dsv4-decode-4k", blocks=None,
                  timeout: float = 900.0) -> list[dict]:
  """Per (generation, num_cores 1 and 2): the dense decode launch compiled without
  a TPU: TensorCores per chip, the cores the compiler targets, grid, semantics,
  `BarrierMegacore` in the bundles, bundles (per KV page); blocks: default the
  block-size table's dense row at `shape`'s heads and page size."""
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top

  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx.lab import aot, schedule  # pylint: disable=g-import-not-at-top

  shp = {s.name: s for s in aot.SHAPES}[shape]
  blocks = dict(blocks or variants_lib.block_sizes(
      "dense", cache_format="dense_fp8", num_heads=shp.num_heads,
      page_size=shp.page_size).kwargs())
  specs = hardware.load_specs()
  rows = []
  for gen in generations:
    with modes.compile_for(gen) as target:
      seen = int(pltpu.get_tpu_info().num_cores)
      grids = {}
      for nc in (1, 2):
        name, eqn = aot.launch_calls("dense", shp, "dense_fp8",
                                     dict(blocks, num_cores=nc), target)[0]
        grids[nc] = (tuple("programs" if not isinstance(d, int) else d
                           for d in eqn.params["grid_mapping"].grid),
                     tuple(eqn.params["compiler_params"].dimension_semantics))
    with tempfile.TemporaryDirectory(prefix="sidx-megacore-") as d:
      sched = schedule.launch_schedules(
          "dense", gen, "dense_fp8", shape,
          [dict(blocks, num_cores=nc) for nc in (1, 2)],
          launches=("decode",), dump_dir=d, timeout=timeout)
      for j, (nc, s) in enumerate(zip((1, 2), sched)):
        files = [f for f in glob.glob(os.path.join(d, f"*-sidx_b{j}_l*"))
                 if re.search(r"-\d+-final_bundles\.txt$", f)
                 and "schedule-analysis" not in f]
        text = "".join(open(f).read() for f in files)
        rows.append({
            "generation": gen, "num_cores": nc,
            "TensorCores/chip": specs[gen].tensorcores_per_chip,
            "cores the compiler targets": seen,
            "grid": grids[nc][0], "semantics": grids[nc][1],
            "compiled": "yes" if not s.error else s.error,
            "megacore barrier": "BarrierMegacore" in text,
            "bundles": s.total_bundles,
            "bundles/page": None if s.kv is None else round(s.kv.bundles_per_page, 1),
        })
  return rows
