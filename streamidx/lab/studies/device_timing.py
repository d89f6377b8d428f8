"""Notebook 06's measurements: traced sweep points and every kernel option.

Each point or configuration is checked against its reference first
(tie-aware, within the derived tolerance `metrics.summation_atol`), then run
under `lab.model.profiling.capture` (a `jax.profiler` trace), and its device
time per stage read from the trace (`profiling.stage_times`): on a TPU the
device's op lines; elsewhere the trace has none and the device times are
None. Beside every measurement the model of the same call:

  roofline   `lab.model.roofline.predict` of the call's `tiling.plan` (HBM
             bytes over bandwidth or FLOPs over peak, per stage), with the
             top-k stage replaced by the method's own HBM bound
             (`lab.model.topk.cost`) for a `topk_method` configuration;
  schedule   optional: the compiler's static schedule of the KV loop
             (`roofline.PageBound`: bundles per page / clock) times the
             pages the plan fetches: a compute-side lower bound, for a
             generation with a published clock only.

    recs = time_configs(batch, configs(), num_heads=..., k=..., ...)

Nothing here is a measurement off a TPU: `sweep` still traces (to show the
trace is captured and parsed), `time_configs` only checks and models there
(a CPU trace has no device lines to read). Host times (`host_call_us`) are
recorded for completeness only (on a CPU they are the interpreter's Python).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Sequence

__all__ = ["Config", "configs", "point_plan", "trace_point", "time_configs",
           "variant_title", "answer_markdown"]


@dataclasses.dataclass(frozen=True)
class Config:
  """One kernel configuration: a variant, its cache format, its options."""

  label: str
  variant: str
  fmt: str
  overrides: tuple = ()

  @property
  def options(self) -> dict:
    return dict(self.overrides)


def configs(topk_methods: Sequence[str] | None = None, *,
            sort_decode_off: bool = True) -> list[Config]:
  """Vendored (packed FP8) and dense (dense FP8), sort_decode on and (with
  `sort_decode_off`) off, then the vendored kernel with every other
  `topk_method` of `topk_methods` (default all); a method the vendored
  kernel does not take ("fused_blockmax": the block maxima only the dense
  kernel writes) runs on the dense kernel."""
  from streamidx import topk as topk_lib  # pylint: disable=g-import-not-at-top
  methods = topk_lib.TOPK_METHODS if topk_methods is None else topk_methods
  off = (("sort_decode", False),)
  out = [Config("vendored", "vendored", "fp8")]
  if sort_decode_off:
    out.append(Config("vendored, sort_decode off", "vendored", "fp8", off))
  out.append(Config("dense", "dense", "dense_fp8"))
  if sort_decode_off:
    out.append(Config("dense, sort_decode off", "dense", "dense_fp8", off))
  out += [Config(f"vendored, topk_method={m}", "vendored", "fp8",
                 (("topk_method", m),)) if m in topk_lib.KERNEL_TOPK_METHODS
          else Config(f"dense, topk_method={m}", "dense", "dense_fp8",
                      (("topk_method", m),))
          for m in methods if m != topk_lib.DEFAULT_TOPK_METHOD]
  return out


def point_plan(mode: str, num_seqs: int, context_tokens: int, sizes: Mapping,
               *, fmt: str, compression_ratio: int,
               decode_req_batch_size: int):
  """(batch, tiling plan, k) of one sweep point: `num_seqs` decode sequences
  of `context_tokens` tokens. Page mode: ratio 1, 128-page KV blocks, k in
  pages (the same budget of entries)."""
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import tiling  # pylint: disable=g-import-not-at-top
  token = mode == "token"
  batch = si.make_mixed_batch(decode=[context_tokens] * num_seqs,
                              page_size=sizes["page_size"],
                              compression_ratio=compression_ratio if token
                              else 1)
  if token:
    p = tiling.plan(batch, fmt=fmt, num_heads=sizes["num_heads"],
                    num_kv_pages_per_block=tuple(sizes["kv_blocks"]),
                    num_queries_per_block=tuple(sizes["q_blocks"]),
                    decode_req_batch_size=decode_req_batch_size)
    return batch, p, sizes["k"]
  p = tiling.plan(batch, fmt=fmt, num_heads=sizes["num_heads"], mode="page",
                  num_kv_pages_per_block=128,
                  num_queries_per_block=sizes["page_q_block"])
  return batch, p, max(1, sizes["k"] // sizes["page_size"])


def _us(x):
  return None if x is None else x * 1e6


def _check(got, v, inputs, kw, fmt, ratio, on_tpu):
  import numpy as np  # pylint: disable=g-import-not-at-top
  from streamidx import metrics  # pylint: disable=g-import-not-at-top
  want = v.reference(*v.args(inputs, fmt), **kw)
  scores = v.scores(inputs, compression_ratio=ratio, fmt=fmt)
  atol = metrics.summation_atol(inputs, compression_ratio=ratio, mode=v.mode)
  c = metrics.compare_topk(got, want, scores, atol=atol)
  out = dict(rows=c.rows, rows_identical=c.rows_identical,
             rows_tied=c.rows_tied, rows_mismatched=c.rows_mismatched,
             atol=atol, ok=bool(c.ok), detail="" if c.ok else c.detail)
  if kw.get("topk_method", "").startswith("approx"):
    # Not exact on a TPU by design: report its recall instead.
    g, w = np.asarray(got), np.asarray(want)
    hits = sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(g, w))
    out["recall"] = hits / max(1, int((w >= 0).sum()))
    out["exact_required"] = False
  elif not on_tpu and not c.ok:
    raise AssertionError(f"kernel differs from its reference beyond the "
                         f"derived tolerance {atol:.3g}: {c.detail}")
  return out


def trace_point(fn, *, log_dir: str, iterations: int, warmup: int) -> dict:
  """`fn` traced: device seconds per stage (None off-TPU), host seconds."""
  from streamidx.lab.model import profiling  # pylint: disable=g-import-not-at-top
  cap = profiling.capture(fn, log_dir=log_dir, iterations=iterations,
                          warmup=warmup)
  trace = profiling.load_trace(cap.perfetto_path)
  t = profiling.stage_times(trace, iterations=cap.iterations)
  return dict(capture=cap, times=t, events=len(trace.events))


def sweep(modes: Sequence[str], sizes: Mapping, *, fmt: str,
          compression_ratio: int, decode_req_batch_size: int, seed: int,
          output_dir: str, warmup: int, check_results: bool,
          max_host_key_bytes: int, on_tpu: bool) -> tuple[list, dict, list]:
  """Notebook 06's sweep: every (mode, B, L) point checked, traced, modelled.

  Returns (run-file records, {(mode, B, L): capture}, skipped points).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  records, captures, skipped = [], {}, []
  for mode in modes:
    v = si.VARIANTS["vendored" if mode == "token" else "vendored_page"]
    for b in sizes["batch_sizes"]:
      for length in sizes["context_tokens"]:
        batch, p, k = point_plan(mode, b, length, sizes, fmt=fmt,
                                 compression_ratio=compression_ratio,
                                 decode_req_batch_size=decode_req_batch_size)
        key_bytes = batch.total_num_pages * batch.page_size * 128 * 4
        if key_bytes > max_host_key_bytes:
          skipped.append(dict(mode=mode, B=b, L=length,
                              host_key_GiB=round(key_bytes / 2**30, 2)))
          continue
        inp = si.make_inputs(batch, num_heads=sizes["num_heads"], fmt=fmt,
                             seed=seed)
        ratio = compression_ratio if mode == "token" else 1
        if mode == "token":
          kw = dict(k=k, compression_ratio=ratio,
                    num_kv_pages_per_block=tuple(sizes["kv_blocks"]),
                    num_queries_per_block=tuple(sizes["q_blocks"]),
                    decode_req_batch_size=decode_req_batch_size)
        else:
          kw = dict(k_pages=k, compression_ratio=1,
                    num_queries_per_block=sizes["page_q_block"])
        args = v.args(inp, fmt)
        fn = lambda args=args, kw=kw: v.kernel(*args, **kw)  # pylint: disable=cell-var-from-loop
        checked = (_check(jax.block_until_ready(fn()), v, inp, kw, fmt, ratio,
                          on_tpu) if check_results else None)
        tp = trace_point(fn, log_dir=os.path.join(
            output_dir, "traces", f"{mode}_B{b}_L{length}"),
                         iterations=sizes["iterations"],
                         warmup=max(0, warmup - bool(check_results)))
        t, cap = tp["times"], tp["capture"]
        captures[mode, b, length] = cap
        pred = roofline.predict(p, k=k)
        records.append(dict(
            mode=mode, batch_size=b, context_tokens=length, k=k,
            num_heads=sizes["num_heads"], page_size=batch.page_size,
            compression_ratio=p.compression_ratio, fmt=fmt,
            iterations=cap.iterations, checked_against_reference=checked,
            device_time_source=t["source"], kernel_us=_us(t["kernel_s"]),
            topk_us=_us(t["topk_s"]), other_us=_us(t["other_s"]),
            total_device_us=_us(t["total_s"]),
            host_call_us=_us(t["host_call_s"]), trace_events=tp["events"],
            trace=os.path.relpath(cap.perfetto_path, output_dir),
            top_ops=t["ops"][:8],
            predicted_us={gen: {s: r[s] * 1e6 for s in ("fill", "kernel",
                                                          "topk", "total")}
                          for gen, r in pred.items()}))
        del inp
  return records, captures, skipped


def _static_us(p, bound) -> float | None:
  """Pages the plan fetches x the schedule's compute time per page."""
  if bound is None or bound.t_compute is None:
    return None
  pages = p.counts()["hbm_bytes_kv"] / bound.page_bytes
  return pages * bound.t_compute * 1e6


def time_configs(batch, cfgs: Sequence[Config], *, num_heads: int, k: int,
                 compression_ratio: int, static: Mapping, seed: int,
                 output_dir: str, iterations: int, warmup: int,
                 generation: str, on_tpu: bool,
                 page_bounds: Mapping | None = None) -> list[dict]:
  """Every configuration on one decode batch: checked, traced, modelled.

  Args:
    batch: the decode batch (`streamidx.make_mixed_batch`).
    cfgs: `configs()`.
    static: block sizes (num_kv_pages_per_block, num_queries_per_block,
      decode_req_batch_size) for every configuration.
    generation: the generation the model is evaluated for (the TPU's own on
      a TPU).
    page_bounds: variant -> `roofline.PageBound` of its decode launch on
      `generation` (the static-schedule bound), where computed.

  Returns one dict per configuration: label, check (rows identical / tied /
  mismatched, atol, recall for "approx"), measured device microseconds
  (kernel, topk, other, total; None off-TPU), host microseconds, and the
  model: "roofline us" (fill + kernel + the method's top-k bound),
  "kernel roofline us", "topk model us", "static schedule us" (or None).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import roofline, tiling  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware, topk as topk_model  # pylint: disable=g-import-not-at-top
  spec = hardware.spec(generation)
  inputs = si.make_inputs(batch, num_heads=num_heads, fmt="fp8", seed=seed)
  out = []
  for cfg in cfgs:
    v = si.VARIANTS[cfg.variant]
    opts = cfg.options
    kw = dict(k=k, compression_ratio=compression_ratio, **static, **opts)
    args = v.args(inputs, cfg.fmt)
    fn = lambda args=args, kw=kw, v=v: v.kernel(*args, **kw)
    checked = _check(jax.block_until_ready(fn()), v, inputs, kw, cfg.fmt,
                     compression_ratio, on_tpu)
    safe = "".join(ch if ch.isalnum() else "_" for ch in cfg.label)
    if on_tpu:  # the checked call above compiled it: one warm-up less
      t = trace_point(fn, log_dir=os.path.join(output_dir, "traces", safe),
                      iterations=iterations, warmup=max(0, warmup - 1))["times"]
    else:  # a CPU trace has no device lines: nothing to read from one
      t = dict(kernel_s=None, topk_s=None, other_s=None, total_s=None,
               host_call_s=None, source="not traced: no device lines off a TPU")
    p = tiling.plan(batch, fmt=cfg.fmt, num_heads=num_heads,
                    variant=cfg.variant,
                    sort_decode=opts.get("sort_decode", True),
                    num_kv_pages_per_block=static["num_kv_pages_per_block"],
                    num_queries_per_block=static["num_queries_per_block"],
                    decode_req_batch_size=static["decode_req_batch_size"])
    pred = roofline.predict(p, k=k, generations=[generation])[generation]
    method = opts.get("topk_method", "sort")
    tk = topk_model.hbm_bound(topk_model.cost(
        method, p.geometry.num_tokens, p.num_score_cols, k), spec)
    static_us = _static_us(p, (page_bounds or {}).get(cfg.variant))
    out.append(dict(
        label=cfg.label, variant=cfg.variant, fmt=cfg.fmt,
        options=opts, generation=generation, check=checked,
        kernel_us=_us(t["kernel_s"]), topk_us=_us(t["topk_s"]),
        other_us=_us(t["other_s"]), total_us=_us(t["total_s"]),
        host_call_us=_us(t["host_call_s"]),
        device_time_source=t["source"],
        **{"kernel roofline us": pred["kernel"] * 1e6,
           "topk model us": tk * 1e6,
           "roofline us": (pred["fill"] + pred["kernel"] + tk) * 1e6,
           "static schedule us": static_us,
           "kv MB": p.counts()["hbm_bytes_kv"] / 1e6}))
  return out


def variant_rows(records: Sequence[dict]) -> list[dict]:
  """Table rows of `time_configs` records (microseconds rounded)."""
  r2 = lambda x: None if x is None else round(x, 2)
  rows = []
  for r in records:
    c = r["check"]
    rows.append({
        "configuration": r["label"],
        "vs reference": ("recall %.3f" % c["recall"]) if "recall" in c
        else ("ok" if c["ok"] else "DIFFERS"),
        "identical / tied": f"{c['rows_identical']} / {c['rows_tied']}",
        "atol": f"{c['atol']:.2g}",
        "measured total us": r2(r["total_us"]),
        "measured kernel us": r2(r["kernel_us"]),
        "measured top-k us": r2(r["topk_us"]),
        f"roofline us ({r['generation']})": r2(r["roofline us"]),
        "static schedule us": r2(r["static schedule us"]),
        "KV MB read": r2(r["kv MB"])})
  return rows


def variant_title(records: Sequence[dict], *, measured: bool,
                  device_kind: str = "") -> str:
  """The variant figure's finding: dense vs vendored, and the fastest top-k
  method, measured on a TPU or modelled elsewhere."""
  key = "total_us" if measured else "roofline us"
  by = {r["label"]: r[key] for r in records if r[key] is not None}
  where = (f"Measured on {device_kind}" if measured else
           f"No TPU here, model only ({records[0]['generation']})")
  parts = []
  if "vendored" in by and "dense" in by:
    parts.append(f"dense {by['vendored'] / by['dense']:.2f}x vs vendored")
  if "vendored, sort_decode off" in by and "vendored" in by:
    parts.append(f"sort_decode {by['vendored, sort_decode off'] / by['vendored']:.2f}x")
  methods = {l: t for l, t in by.items() if l.startswith("vendored, topk")
             or l == "vendored"}
  if methods:
    best = min(methods, key=methods.get)
    parts.append("fastest top-k: " + (best.split("=")[-1] if "=" in best
                                      else "sort (default)"))
  return where + ": " + ", ".join(parts)


def answer_markdown(*, machine: str, on_tpu: bool, generation: str | None,
                    sweep_records: Sequence[dict], variant_records:
                    Sequence[dict], model_point: tuple, model_pred: Mapping
                    ) -> str:
  """Notebook 06's computed answer (Markdown), takeaways first."""
  lines = []
  measured = bool(sweep_records) and sweep_records[0]["kernel_us"] is not None
  if measured and generation:
    ratios = [r["kernel_us"] / r["predicted_us"][generation]["kernel"]
              for r in sweep_records]
    shares = [r["topk_us"] / r["total_device_us"] for r in sweep_records]
    lines.append(
        f"- **Measured on {generation}**: the kernel ran at "
        f"{min(ratios):.2f}x to {max(ratios):.2f}x its roofline bound over "
        f"{len(sweep_records)} sweep points; the top-k took "
        f"{100 * min(shares):.0f}% to {100 * max(shares):.0f}% of a call's "
        "device time.")
  elif measured:
    lines.append("- Device times were measured, but this TPU has no entry in "
                 "`data/tpu_specs.json` to bound them.")
  else:
    lines.append(
        f"- **No TPU in this run, so no device timing exists**: "
        f"{len(sweep_records)} sweep points and {len(variant_records)} "
        "kernel configurations ran interpreted, were checked against their "
        "references and traced; their traces have no device lines.")
  ok = [r for r in variant_records if r["check"]["ok"]
        or "recall" in r["check"]]
  if variant_records:
    lines.append(
        f"- **Every configuration agrees with its reference**: "
        f"{len(ok)} of {len(variant_records)} (vendored and dense, "
        "sort_decode on and off, the `topk_method`s run), tie-aware at the "
        f"derived tolerance (atol {variant_records[0]['check']['atol']:.2g})"
        + ("; `approx` is reported by its recall" if any(
            "recall" in r["check"] for r in variant_records) else "") + ".")
    lines.append("- " + variant_title(
        variant_records, measured=measured,
        device_kind=machine.split(",")[0]) + ".")
  m, b, length = model_point
  lines.append(
      f"- **Model, {m} mode, B={b}, L={length}**: roofline bound " + ", ".join(
          f"{g} {model_pred[g]['total'] * 1e6:.0f} us" for g in
          ("v5e", "v6e", "v7x") if g in model_pred)
      + "; the top-k stage is "
      f"{100 * model_pred['v5e']['topk'] / model_pred['v5e']['total']:.1f}% "
      "of it on v5e (HBM bytes only: the sort's compare work is not in it, "
      "so a larger measured share is expected).")
  lines.append(f"- Machine: {machine}.")
  return "\n".join(lines)


def predictions(modes: Sequence[str], sizes: Mapping, *, fmt: str,
                compression_ratio: int, decode_req_batch_size: int
                ) -> tuple[list[dict], dict]:
  """The roofline of every (mode, B, L) point of `sizes` on every generation:
  (table rows, {(mode, B, L): `roofline.predict`})."""
  from streamidx.lab.model import hardware, roofline  # pylint: disable=g-import-not-at-top
  rows, preds = [], {}
  for mode in modes:
    for b in sizes["batch_sizes"]:
      for length in sizes["context_tokens"]:
        _, p, k = point_plan(mode, b, length, sizes, fmt=fmt,
                             compression_ratio=compression_ratio,
                             decode_req_batch_size=decode_req_batch_size)
        pred = preds[mode, b, length] = roofline.predict(p, k=k)
        rows.append(dict(
            mode=mode, B=b, L=length, k=k,
            FLOP_per_B=round(roofline.costs(p, k=k)[1].intensity, 2),
            **{f"{g} us": round(pred[g]["total"] * 1e6, 1)
               for g in hardware.GENERATIONS},
            **{f"{g} topk%": round(100 * pred[g]["topk"] / pred[g]["total"],
                                   2) for g in ("v5e", "v7x")}))
  return rows, preds


def roofline_title(preds: Mapping, *, measured: bool, records=(),
                   generation: str | None = None) -> str:
  """The roofline figure's finding."""
  if measured and generation and records:
    ratios = [r["kernel_us"] / r["predicted_us"][generation]["kernel"]
              for r in records]
    return (f"Measured on {generation}: the kernel runs at "
            f"{min(ratios):.2f}x-{max(ratios):.2f}x its roofline bound")
  big = max((kk for kk in preds if kk[0] == "token"),
            key=lambda kk: (kk[1], kk[2]), default=next(iter(preds)))
  pr = preds[big]
  return (f"Model only (no TPU): {big[0]} B={big[1]} L={big[2]} is bound at "
          f"{pr['v5e']['total'] * 1e6:.0f} us on v5e, "
          f"{pr['v7x']['total'] * 1e6:.0f} us on v7x; scoring dominates the "
          "modelled step")


def decode_page_bounds(generation: str, variants: Sequence[tuple[str, str]],
                       blocks: Mapping, *, shape: str = "dsv4-decode-4k"
                       ) -> dict:
  """variant -> the `roofline.PageBound` of its decode launch on
  `generation`, from the compiler's static schedule (`lab.schedule`, libtpu
  in a child process) at `shape` (a `lab.aot.SHAPES` name: DeepSeek-V4's
  128-entry pages). `variants`: (variant, fmt) pairs; `blocks`: the block
  sizes, all three keywords."""
  from streamidx.lab import schedule  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import roofline  # pylint: disable=g-import-not-at-top
  out = {}
  for variant, fmt in variants:
    scheds = schedule.launch_schedules(variant, generation, fmt, shape,
                                       dict(blocks), launches=["decode"])
    bounds = roofline.page_bounds(scheds)
    if bounds:
      out[variant] = bounds[0]
  return out


def exercise_answers(variant_records: Sequence[dict], *,
                     generation: str) -> str:
  """Notebook 06's answers, computed from the model and this run."""
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware, roofline, tiling  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import topk as topk_model  # pylint: disable=g-import-not-at-top
  spec = hardware.spec("v6e")
  b = si.make_mixed_batch(decode=[131072] * 64, page_size=128,
                          compression_ratio=4)
  p = tiling.plan(b, fmt="fp8", num_heads=64, num_kv_pages_per_block=(3, 2, 2),
                  num_queries_per_block=(1, 128, 128))
  kv = p.counts()["hbm_bytes_kv"]
  pred = roofline.predict(p, k=512, generations=["v6e"])["v6e"]
  hand = 64 * (131072 // 4) * 256
  pub = topk_model.PUBLIC_TPU7X
  v7 = hardware.spec("v7x")
  sort = topk_model.cost("sort", 64, 262144, 512)
  sort_us = topk_model.hbm_bound(sort, v7) * 1e6
  lines = [
      f"1. 64 sequences x 32,768 entries x 256 B = {hand / 2**20:.0f} MiB of "
      f"cache (the plan counts {kv / 2**20:.1f} MiB with block rounding). "
      f"Over one v6e TensorCore's {spec.kernel_bandwidth / 1e9:.0f} GB/s: "
      f"**{hand / spec.kernel_bandwidth * 1e6:.0f} us**; the roofline's "
      f"kernel stage says {pred['kernel'] * 1e6:.0f} us (the queries, "
      "weights and score writes add the rest), the whole call "
      f"{pred['total'] * 1e6:.0f} us.",
      f"2. The full-sort selection moves {sort.bytes / 1e6:.0f} MB on v7x: "
      f"an HBM bound of **{sort_us:.0f} us**, against the public "
      f"{pub['decode_sort_ms']} ms measured sort ({pub['source']}): "
      f"**{pub['decode_sort_ms'] * 1e3 / sort_us:.0f}x** its bound. A sort is "
      "compare-bound on the vector units, which a bytes-only model cannot "
      "see; only a TPU measurement (section 3 on a TPU) settles which "
      "method is fastest.",
  ]
  by = {r["label"]: r for r in variant_records}
  if "vendored" in by and "dense" in by:
    v, d = by["vendored"], by["dense"]
    lines.append(
        f"3. KV bytes: {v['kv MB']:.3f} MB vendored vs {d['kv MB']:.3f} MB "
        f"dense ({v['kv MB'] / d['kv MB']:.2f}x; 256 B vs 132 B an entry as "
        f"a TPU stores them is {256 / 132:.2f}x). The roofline bound of the "
        f"whole call on {generation}: {v['roofline us']:.2f} vs "
        f"{d['roofline us']:.2f} us ({v['roofline us'] / d['roofline us']:.2f}"
        "x): smaller, because the query and weight reads, the score buffer's "
        "fill and the top-k do not shrink with the cache format.")
  return "\n".join(lines)


def sweep_rows(records: Sequence[dict], generation: str | None) -> list[dict]:
  """Table rows of `sweep` records: the check, device times and bounds."""
  rows = []
  for r in records:
    c = r["checked_against_reference"]
    bound = r["predicted_us"].get(generation or "", {})
    rows.append(dict(
        mode=r["mode"], B=r["batch_size"], L=r["context_tokens"],
        reference="skipped" if not c else
        f"{c['rows'] - c['rows_mismatched']}/{c['rows']} rows, atol "
        f"{c['atol']:.2g}",
        device_kernel_us=r["kernel_us"], kernel_bound_us=bound.get("kernel"),
        device_topk_us=r["topk_us"], device_total_us=r["total_device_us"],
        total_bound_us=bound.get("total"), trace_events=r["trace_events"]))
  return rows


def variant_batch(sweep_sizes: Mapping, *, compression_ratio: int):
  """Section 4's decode batch: the sweep's largest batch size, ragged
  lengths between half and all of its shortest context (so that
  `sort_decode` has an order to change)."""
  import streamidx as si  # pylint: disable=g-import-not-at-top
  top = sweep_sizes["context_tokens"][0]
  half = max(1, top // 2)
  lengths = [half + (i * 37) % half for i in range(sweep_sizes["batch_sizes"][-1])]
  return si.make_mixed_batch(decode=lengths, page_size=sweep_sizes["page_size"],
                             compression_ratio=compression_ratio)


def variant_study(sweep_sizes: Mapping, cfgs: Sequence[Config], *,
                  generation: str, want_schedule: bool,
                  compression_ratio: int, decode_req_batch_size: int,
                  **kw) -> tuple[list[dict], object, dict]:
  """`time_configs` on `variant_batch`, with the static-schedule bounds of
  the decode launch when `want_schedule`, libtpu is installed and
  `generation` has a published clock. Returns (records, batch, bounds)."""
  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware  # pylint: disable=g-import-not-at-top
  static = dict(num_kv_pages_per_block=tuple(sweep_sizes["kv_blocks"]),
                num_queries_per_block=tuple(sweep_sizes["q_blocks"]),
                decode_req_batch_size=decode_req_batch_size)
  bounds = {}
  if (want_schedule and modes.libtpu_path()
      and hardware.spec(generation).clock_hz):
    bounds = decode_page_bounds(
        generation, [("vendored", "fp8"), ("dense", "dense_fp8")],
        dict(num_kv_pages_per_block=(static["num_kv_pages_per_block"][0], 2, 2),
             num_queries_per_block=(1, 128, 128),
             decode_req_batch_size=decode_req_batch_size))
  batch = variant_batch(sweep_sizes, compression_ratio=compression_ratio)
  recs = time_configs(batch, cfgs, num_heads=sweep_sizes["num_heads"],
                      k=sweep_sizes["k"], compression_ratio=compression_ratio,
                      static=static, iterations=sweep_sizes["iterations"],
                      generation=generation, page_bounds=bounds, **kw)
  return recs, batch, bounds


def write_and_load_runs(output_dir: str, runs_glob: str, *, parameters,
                        records) -> tuple[str, list, list]:
  """Writes this run's file and loads every file of `runs_glob` (this run's
  included): (path, runs, the runs holding device times)."""
  from streamidx.lab.model import profiling  # pylint: disable=g-import-not-at-top
  path = profiling.write_run(
      output_dir, parameters=parameters, records=records,
      notes="06_tpu_profiling: device times from jax.profiler traces (XLA "
            "Ops lines); None = no device lines (not a TPU)")
  runs = profiling.load_runs(runs_glob, skip_invalid=True)
  if not any(os.path.samefile(r["path"], path) for r in runs):
    runs += profiling.load_runs([path])
  timed = [r for r in runs
           if any(rec.get("kernel_us") is not None for rec in r["records"])]
  return path, runs, timed


SWEEP_PARAMETERS = ("batch_sizes", "context_tokens", "num_heads", "page_size",
                    "k", "kv_blocks", "q_blocks", "page_q_block", "iterations",
                    "topk_methods")


def sweep_parameters(parameters: Mapping, prefix: str) -> dict:
  """The sweep's sizes for one machine: `{name: parameters[f"{prefix}_{name}"]}`
  for every name of `SWEEP_PARAMETERS`; prefix "tpu" or "cpu" (notebook 06's
  `tpu_*` / `cpu_*` parameters)."""
  if prefix not in ("tpu", "cpu"):
    raise ValueError(f"prefix: must be 'tpu' or 'cpu' (got {prefix!r})")
  return {n: parameters[f"{prefix}_{n}"] for n in SWEEP_PARAMETERS}


def largest_point(preds: Mapping, mode: str = "token"):
  """The (mode, B, L) key of `predictions` with the largest B, then L, in
  `mode`; the first key when `mode` has none."""
  return max((key for key in preds if key[0] == mode),
             key=lambda key: (key[1], key[2]), default=next(iter(preds)))


def variant_batch_markdown(vbatch, *, page_bounds, schedule_bound: str,
                           generation: str | None) -> str:
  """One sentence on section 4's batch: its decode sequences and lengths,
  and whether the static-schedule bound was computed (and why not)."""
  lens = vbatch.seq_lens[:vbatch.num_seqs]
  return (f"Batch: {vbatch.num_seqs} decode sequences of {min(lens)}-{max(lens)} tokens; "
          f"static-schedule bound {'computed' if page_bounds else 'not computed'} "
          f"(schedule_bound={schedule_bound!r}, {generation}).")


def top_ops_markdown(records: Sequence[dict], *, on_tpu: bool,
                     points: int = 2, name_chars: int = 70) -> str:
  """Section 5 of notebook 06: on a TPU, a table of the top device ops of
  the first `points` sweep records with the stage each was counted in;
  elsewhere one sentence with the number of trace events parsed."""
  from streamidx.lab import tables  # pylint: disable=g-import-not-at-top
  if not on_tpu:
    return (f"No device ops off a TPU: {sum(r['trace_events'] for r in records)} trace events parsed "
            f"over {len(records)} sweep points, none on a device line.")
  return "\n\n".join(
      f"**{r['mode']} B={r['batch_size']} L={r['context_tokens']}** ({r['device_time_source']})\n\n"
      + tables.markdown([dict(stage=o["stage"], count=o["count"], total_us=o["total_us"],
                              name=o["name"][:name_chars]) for o in r["top_ops"]])
      for r in records[:points])
