"""Notebook 07's check: the sharded layouts run for real, against one device.

`streamidx.sharded` runs a variant under `jax.shard_map`. This study runs each
layout (sequence-parallel, context-parallel, 2-D) on a batch, puts the result
back in the batch's row order and compares it with the single-device
reference, tie-aware, within the derived tolerance
(`metrics.summation_atol`):

    rows = check_layouts(batch_kw, [dict(layout="context-parallel",
                                         num_data=1, num_context=4)], ...)

Devices: on a TPU with enough devices the layouts run there (compiled);
anywhere else on virtual CPU devices with the kernel in Pallas's TPU
interpreter. XLA's CPU device count is fixed when JAX starts its CPU backend,
so `cpu_devices(n)` sets it (`jax_num_cpu_devices`) only if no backend has
started yet; when one has (a notebook run twice in one kernel),
`check_layouts_subprocess` runs the same check in a fresh Python process
with `XLA_FLAGS=--xla_force_host_platform_device_count` and returns its rows.

CPU device 0 is left out of every mesh: with it in, the interpreted kernel
deadlocks under `shard_map` when the devices' launches differ in length (jax
0.10.2; README "Known limitations"), so n devices need n + 1 CPU devices.

    python -m streamidx.lab.studies.multichip '<json request>'   # one JSON
                                                                # line out
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Sequence

__all__ = ["LAYOUTS", "LayoutCheck", "reserve_cpu_devices", "cpu_devices",
           "mesh_devices", "check_layouts", "check_layouts_subprocess",
           "crossover_rows", "device_crossover_rows", "scaling_title",
           "crossover_title", "exercise_answers", "answer_markdown"]

LAYOUTS = ("sequence-parallel", "context-parallel", "2d")


@dataclasses.dataclass
class LayoutCheck:
  """One layout run on devices and compared with the single-device reference.

  Attributes:
    layout: a `LAYOUTS` name; num_data x num_context its mesh; merge its
      collective ("all_gather" or "tree"; none without a context axis).
    devices: what ran it, e.g. "8 x cpu (interpreted)".
    rows, identical, tied: query rows compared; rows equal index for index;
      rows equal only up to ties within `atol`.
    ok: every row matches; detail: the first difference otherwise.
    atol: the derived tolerance used.
    collective: the collective op found in the lowered program ("" if none).
    pages_per_share, cache_bytes_per_device: the layout's shares.
    merge_bytes_per_row: `sharded.merge_bytes_per_row` (what one device
      receives per row).
    seconds: wall time of lowering, compiling and running (this machine).
  """

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

  def row(self) -> dict:
    return {"layout": self.layout, "mesh (data x context)":
            f"{self.num_data}x{self.num_context}", "variant": self.variant,
            "fmt": self.fmt, "merge": self.merge if self.num_context > 1
            else "-", "devices": self.devices,
            "matches reference": "yes" if self.ok else f"NO: {self.detail}",
            "rows identical / tied": f"{self.identical} / {self.tied}",
            "atol": f"{self.atol:.2g}", "collective": self.collective or "none",
            "pages per share": self.pages_per_share,
            "cache B/device": self.cache_bytes_per_device,
            "merge B/row": self.merge_bytes_per_row,
            "s": round(self.seconds, 1)}


def _backend_started() -> bool:
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  return bool(xla_bridge._backends)  # pylint: disable=protected-access


def reserve_cpu_devices(n: int) -> bool:
  """Asks JAX for n + 1 CPU devices if no JAX backend has started yet (the
  count is fixed when the CPU backend starts); whether it could."""
  import jax  # pylint: disable=g-import-not-at-top
  if _backend_started():
    return False
  jax.config.update("jax_num_cpu_devices",
                    max(n + 1, jax.config.jax_num_cpu_devices))
  return True


def cpu_devices(n: int) -> list | None:
  """n virtual CPU devices for a mesh (CPU devices 1..n), or None.

  `reserve_cpu_devices(n)` first; None when fewer than n + 1 CPU devices
  exist.
  """
  import jax  # pylint: disable=g-import-not-at-top
  reserve_cpu_devices(n)
  cpus = jax.devices("cpu")
  return cpus[1:n + 1] if len(cpus) >= n + 1 else None


def mesh_devices(n: int):
  """(devices, description) for an n-device mesh: the TPU's when it has n,
  else CPU devices 1..n (interpreted); (None, why) when neither exists."""
  import jax  # pylint: disable=g-import-not-at-top
  reserve_cpu_devices(n)
  if jax.default_backend() == "tpu" and len(jax.devices()) >= n:
    return jax.devices()[:n], f"{n} x {jax.devices()[0].device_kind} (compiled)"
  cpus = cpu_devices(n)
  if cpus is None:
    return None, (f"{len(jax.devices('cpu'))} CPU devices exist; {n + 1} are "
                  "needed and JAX's CPU backend has started")
  return cpus, f"{n} x cpu (interpreted)"


def check_layouts(batch_kw: dict, layouts: Sequence[dict], *,
                  variant: str = "vendored", fmt: str = "fp8",
                  num_heads: int = 4, k: int = 8, compression_ratio: int = 4,
                  seed: int = 0, static: dict | None = None
                  ) -> list[LayoutCheck]:
  """Runs each layout of `layouts` on `batch_kw`'s batch; one check each.

  Args:
    batch_kw: keyword arguments of `streamidx.make_mixed_batch` (lists and
      ints only, so that a subprocess can take them as JSON).
    layouts: dicts with "layout", "num_data", "num_context" and optionally
      "merge" (default "all_gather").
    variant, fmt, num_heads, k, compression_ratio, seed: the inputs and
      the call (`streamidx.make_inputs`, the variant's kernel).
    static: the kernel's block sizes (default the block-size table's row).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx import metrics, sharded  # pylint: disable=g-import-not-at-top

  reserve_cpu_devices(max(int(l["num_data"]) * int(l["num_context"])
                          for l in layouts))
  v = si.VARIANTS[variant]
  batch = si.make_mixed_batch(**batch_kw)
  inputs = si.make_inputs(batch, num_heads=num_heads, fmt=fmt, seed=seed)
  static = dict(static or v.block_sizes(
      cache_format=fmt, num_heads=num_heads,
      page_size=int(batch.page_size)).kwargs())
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
  """`check_layouts` in a fresh process with enough virtual CPU devices.

  For a process whose JAX backend has already started with too few CPU
  devices. Same arguments (JSON-able); raises RuntimeError with the child's
  output if it fails.
  """
  n = max(int(l["num_data"]) * int(l["num_context"]) for l in layouts)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={n + 1}"))
  request = json.dumps({"batch_kw": batch_kw, "layouts": list(layouts), **kw})
  p = subprocess.run([sys.executable, "-m", __name__, request], env=env,
                     capture_output=True, text=True, timeout=timeout_s,
                     check=False)
  lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
  if p.returncode or not lines:
    raise RuntimeError(f"multichip check subprocess failed (exit "
                       f"{p.returncode}):\n{p.stdout[-2000:]}\n"
                       f"{p.stderr[-2000:]}")
  return [LayoutCheck(**r) for r in json.loads(lines[-1])["checks"]]


def crossover_rows(generations: Sequence[str], chips: Sequence[int],
                   latencies_us: Sequence[float], *, workload=None,
                   merge: str = "all_gather") -> list[dict]:
  """Where context parallelism starts to pay for ONE sequence, per
  (generation, chips, assumed collective latency): the shortest context
  (`scaling.crossover_context`), its C and both modelled steps (us).

  `workload`: a `scaling.Workload` (default DeepSeek-V4 decode); its
  num_seqs is set to 1. tokens is None where it never pays.
  """
  from streamidx.lab.model import scaling  # pylint: disable=g-import-not-at-top
  w = (workload or scaling.DSV4_DECODE).with_(num_seqs=1)
  rows = []
  for gen in generations:
    for n in chips:
      for lat in latencies_us:
        cc = scaling.crossover_context(w, gen, n, merge=merge,
                                       collective_latency_s=lat * 1e-6)
        rows.append({
            "generation": gen, "chips": n, "latency us": lat,
            "tokens": None if cc is None else cc[0],
            "C": None if cc is None else cc[1].num_context,
            "step us (C>1)": None if cc is None else round(
                cc[1].step_s * 1e6, 3),
            "step us (C=1)": None if cc is None else round(
                cc[2].step_s * 1e6, 3)})
  return rows


def device_crossover_rows(generations: Sequence[str],
                          latencies_us: Sequence[float], *, workload=None,
                          merge: str = "all_gather") -> list[dict]:
  """The fewest chips at which context parallelism beats one chip per
  sequence for `workload` (default DeepSeek-V4 decode, 64 x 1M tokens),
  per generation and assumed latency (`scaling.crossover_devices`)."""
  from streamidx.lab.model import scaling  # pylint: disable=g-import-not-at-top
  w = workload or scaling.DSV4_DECODE
  rows = []
  for gen in generations:
    for lat in latencies_us:
      cd = scaling.crossover_devices(w, gen, merge=merge,
                                     collective_latency_s=lat * 1e-6)
      rows.append({
          "generation": gen, "latency us": lat,
          "chips": None if cd is None else cd[0],
          "C": None if cd is None else cd[1].num_context,
          "step us (C>1)": None if cd is None else round(
              cd[1].step_s * 1e6, 2),
          "step us (C=1)": None if cd is None else round(
              cd[2].step_s * 1e6, 2)})
  return rows


# ---------------------------------------------------------------------------
# Notebook 07's text: titles, exercise answers and the answer, from numbers.


def scaling_title(rows: Sequence[dict], workload) -> str:
  """The scaling figure's finding, from `scaling.scaling_table` rows."""
  paying = [r for r in rows if r["best C"] not in (1, "n/a")]
  head = (f"Model, {workload.num_seqs} x {workload.context_tokens} tokens: "
          "one chip per sequence wins while devices <= sequences")
  if not paying:
    return head + f" (C > 1 never pays up to {max(r['chips'] for r in rows)} chips)"
  r = min(paying, key=lambda r: r["chips"])
  return (head + f"; C = {r['best C']} pays on {r['generation']} at "
          f"{r['chips']} chips ({r['speedup']}x)")


def crossover_title(rows: Sequence[dict]) -> str:
  """The crossover figure's finding, from `crossover_rows` rows."""
  paid = [r for r in rows if r["tokens"]]
  if not paid:
    return "Model: context parallelism never pays for one sequence here"
  lo = min(r["latency us"] for r in paid)
  hi = max(r["latency us"] for r in paid)
  at = lambda lat: [r["tokens"] for r in paid if r["latency us"] == lat]
  return (f"Model: one sequence pays to split from {min(at(lo)):,} tokens at "
          f"{lo:g} us latency, {min(at(hi)):,}+ at {hi:g} us: latency sets it")


def exercise_answers(workload) -> str:
  """Notebook 07's answers, computed from the model and `streamidx.sharded`."""
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top
  from streamidx import sharded  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware, scaling  # pylint: disable=g-import-not-at-top
  w = workload
  ag = sharded.merge_bytes_per_row(w.k, 16, "all_gather")
  tr = sharded.merge_bytes_per_row(w.k, 16, "tree")
  one = scaling.step(w, "v6e", 64, 1)
  two = scaling.step(w, "v6e", 128, 2)
  dense = w.entries * (w.head_dim + 1)  # e4m3 values + one e8m0 byte
  dense_b = (cache_lib.dense_tpu_bytes_per_entry(w.head_dim, w.page_size)
             * w.entries)
  sp = scaling.step(w, "v7x", 64, 1)
  cp = scaling.step(w, "v7x", 64, 2)
  best = scaling.best_step(w, "v7x", 64)
  mib = lambda b: f"{b / 2**20:.2f} MiB"
  bw = hardware.spec("v7x").device_ici_bandwidth
  lines = [
      f"1. All-gather: (C - 1) x k x 8 B = 15 x {w.k} x 8 = **{ag:,} B** per "
      f"device and row, in one round. Tree: log2(16) = 4 rounds of k pairs = "
      f"**{tr:,} B**. The tree moves {ag / tr:.2f}x fewer bytes but makes 4 "
      "collective rounds instead of 1: at v7x's ICI rate per device "
      f"({bw / 1e9:.0f} GB/s) the bytes it saves take "
      f"{(ag - tr) / bw * 1e9:.0f} ns, so it loses as soon as 3 extra "
      f"rounds cost more than that, about {(ag - tr) / bw / 3 * 1e9:.0f} ns "
      "each.",
      f"2. C = 1 on 64 chips: one sequence each, {w.entries:,} entries x "
      f"{cache_lib.record_bytes(w.fmt, w.head_dim)} B = "
      f"**{mib(one.cache_bytes_per_device)}** per chip and layer. C = 2 on "
      f"128 chips: **{mib(two.cache_bytes_per_device)}**. The dense FP8 "
      f"format at C = 1: {mib(dense_b)} as a TPU tiles it "
      f"(`cache.dense_tpu_bytes_per_entry` = "
      f"{dense_b // w.entries} B an entry)"
      f", {mib(dense)} as stored on the host ({w.head_dim} + 1 B an entry)"
      ": about half, the same saving as a C = 2 split but without the "
      "merge or the extra chips.",
      f"3. 32 v7x chips are {sp.devices} devices for {w.num_seqs} sequences: "
      f"C = 1 gives each device {sp.seqs_per_device} sequence(s), step "
      f"**{sp.step_s * 1e6:.2f} us**; C = 2 gives each device "
      f"{cp.seqs_per_device} sequences of half a context each, the same "
      f"{mib(cp.cache_bytes_per_device)} of reads, plus a merge: "
      f"**{cp.step_s * 1e6:.2f} us**. The model's best is C = "
      f"{best.num_context}. A context split only saves reads when some "
      "device would otherwise idle, i.e. when devices outnumber sequences.",
  ]
  return "\n".join(lines)


def answer_markdown(checks: Sequence[LayoutCheck], chip_rows, ctx_rows,
                    compiled=(), *, machine: str = "") -> str:
  """Notebook 07's computed answer (Markdown), takeaways first."""
  ok = [c for c in checks if c.ok]
  out = []
  if checks:
    dev = checks[0].devices
    out.append(
        f"- **The sharded layouts are exact**: {len(ok)} of {len(checks)} "
        f"({', '.join(f'{c.layout} {c.num_data}x{c.num_context}' for c in checks)}) "
        f"returned the single-device reference's top-k, tie-aware at the "
        f"derived tolerance (atol {checks[0].atol:.2g}), on {dev}; machine: "
        f"{machine}.")
  zero = [r for r in chip_rows if r["latency us"] == min(
      x["latency us"] for x in chip_rows)]
  if zero:
    parts = [f"{r['generation']} from **{r['chips']} chips** (C = {r['C']}: "
             f"{r['step us (C>1)']} vs {r['step us (C=1)']} us)"
             if r["chips"] else f"{r['generation']} never"
             for r in zero]
    out.append("- **DeepSeek-V4 decode batch** (model, "
               f"{zero[0]['latency us']:g} us collective latency): context "
               "parallelism beats one chip per sequence " + "; ".join(parts)
               + ", i.e. only once devices outnumber the sequences.")
  for lat in sorted({r["latency us"] for r in ctx_rows}):
    rs = [r for r in ctx_rows if r["latency us"] == lat]
    parts = [f"{r['generation']} on {r['chips']} chip(s): "
             + (f"**{r['tokens']:,} tokens** (C = {r['C']})" if r["tokens"]
                else "never") for r in rs]
    out.append(f"- **One sequence, {lat:g} us assumed latency**: the split "
               "pays from " + "; ".join(parts) + ".")
  if compiled:
    out.append("- **Compiled for TPU slices** (libtpu, no TPU): " + "; ".join(
        f"{r.layout} on {r.topology}: "
        + (", ".join(f"{c.op} {'+'.join(c.shapes)}" for c in r.collectives)
           or "no collective") + f", {r.received_bytes:,} B/device/step "
        f"(model {r.model_received_bytes:,})" if r.ok else
        f"{r.layout} on {r.topology}: did not compile ({r.error[:80]})"
        for r in compiled) + ".")
  else:
    out.append("- No sharded program was compiled for a TPU slice in this run "
               "(libtpu missing or `compile_runs` empty).")
  out.append("- The crossovers are a model (roofline + ICI bandwidth from "
             "`data/tpu_specs.json`, latency assumed), not a measurement.")
  return "\n".join(out)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  request = json.loads(argv[0])
  checks = check_layouts(request.pop("batch_kw"), request.pop("layouts"),
                         **request)
  print(json.dumps({"checks": [dataclasses.asdict(c) for c in checks]}))
  return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
  raise SystemExit(main())
