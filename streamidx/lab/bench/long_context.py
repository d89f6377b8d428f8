"""Long context: the reference in streamed chunks and in one chunk at 1M tokens.

There is one reference (`streamidx.ref`); this compares its two settings:
"streaming" (`streamidx.streaming`, chunks of entries) and "reference" (all
of a sequence's entries in one chunk). `python -m streamidx.bench
--long-context` runs `run_long_context`: for each shape of
`shapes.LONG_CONTEXT` at each k of `LONG_CONTEXT_KS`, XLA's buffer
assignment for both (compiled from shapes alone), the one-chunk temporaries
by `streaming.one_chunk_temp_bytes`' formula, then streaming in a worker
process (peak RSS measured) and one chunk where it fits. Each result is
spot-checked against the oracle and the one-chunk reference on slices of the
batch (`spot_check`). The inputs come from `long_context_args`, which builds
the cache a few pages at a time (`random_cache`), since `batch.make_inputs`
would hold float32 keys for every entry.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from streamidx.lab.bench import harness, memory
from streamidx.lab.bench.shapes import LONG_CONTEXT, LONG_CONTEXT_KS, Shape

__all__ = ["LONG_SCHEMA", "random_cache", "long_context_args",
           "abstract_args", "spot_check", "worker", "run_long_context"]

LONG_SCHEMA = "streamidx.bench.long_context/2"  # /2: one_chunk_* keys


def random_cache(total_pages: int, page_size: int, head_dim: int = 128,
                 fmt: str = "fp8", *, seed: int = 0,
                 pages_per_step: int = 256):
  """A seeded random cache, packed a few pages at a time.

  Keys are N(0, 1) float32 from `jax.random.normal(fold_in(key(seed), i))`
  for the i-th group of `pages_per_step` pages, packed (`cache.pack_cache`)
  inside one `lax.map`, so only one group's float32 keys (pages_per_step x
  page_size x head_dim x 4 bytes, 16 MiB by default) exist next to the
  packed cache: 64 x 256K FP8 entries take their 4 GiB and little more,
  where float32 keys for them would be 8 GiB. The groups must tile the
  cache (`pages_per_step` is lowered to a divisor of `total_pages`).

  Returns:
    [total_pages, page_size / kv_packing, kv_packing, lkv_dim] cache array.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top

  step = math.gcd(total_pages, pages_per_step)
  n = total_pages // step

  @jax.jit
  def build(key):
    def group(i):
      keys = jax.random.normal(jax.random.fold_in(key, i),
                               (step, page_size, head_dim), jnp.float32)
      return cache_lib.pack_cache(keys, fmt)

    out = jax.lax.map(group, jnp.arange(n))
    return out.reshape((total_pages,) + out.shape[2:])

  return build(jax.random.key(seed))


def long_context_args(shape: Shape, *, seed: int = 0):
  """The kernel's 7 positional arguments for a long-context shape.

  The batch (page table, lengths) comes from `batch.make_mixed_batch`; q and
  the weights are drawn like `batch.make_inputs` draws them (NumPy, seeded);
  the cache comes from `random_cache`, since `make_inputs` would hold
  float32 keys for every entry.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  b = shape.batch()
  rng = np.random.default_rng(seed)
  t, h, d = b.num_tokens, shape.num_heads, shape.head_dim
  q = rng.standard_normal((t, h, d), np.float32)
  w = np.abs(rng.standard_normal((t, h), np.float32)) / np.sqrt(h)
  cache = random_cache(b.total_num_pages, shape.page_size, d, shape.fmt,
                       seed=seed + 1)
  seq_lens, page_indices, cu_q_lens, distribution = b.kernel_arrays()
  return (jnp.asarray(q).astype(jnp.bfloat16), jnp.asarray(w), cache,
          seq_lens, page_indices, cu_q_lens, distribution)


def _fn(impl):
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx import streaming  # pylint: disable=g-import-not-at-top
  return {"streaming": streaming.streamindex_topk_streaming,
          "reference": si.streamindex_topk_ref}[impl]


def abstract_args(shape: Shape):
  """ShapeDtypeStructs of `long_context_args(shape)`: nothing allocated."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from streamidx import cache as cache_lib  # pylint: disable=g-import-not-at-top
  b = shape.batch()
  packing = cache_lib.kv_packing(shape.fmt)
  return [
      jax.ShapeDtypeStruct((b.num_tokens, shape.num_heads, shape.head_dim),
                           jnp.bfloat16),
      jax.ShapeDtypeStruct((b.num_tokens, shape.num_heads), jnp.float32),
      jax.ShapeDtypeStruct(
          (b.total_num_pages, shape.page_size // packing, packing,
           cache_lib.lkv_dim(shape.fmt, shape.head_dim)),
          cache_lib.cache_dtype(shape.fmt)),
  ] + [jax.ShapeDtypeStruct(a.shape, jnp.int32) for a in b.kernel_arrays()]


def spot_check(shape: Shape, args, got) -> dict:
  """The oracle and the one-chunk reference on slices of the batch.

  decode: sequences 0 and last, each with its own pages only (contiguous
  allocation), so the oracle decodes 2048 pages, not the whole cache.
  prefill: the first and last 8 query rows, as prefill chunks of 8 queries
  (a chunk ending at position p sees what the full chunk's rows see), in a
  batch with a second, empty sequence slot (a shape jax 0.10.2's CPU
  compiler once miscompiled with one slot: `streamidx.ref`). The oracle
  agrees within twice the float32 bound (tie-aware); the one-chunk
  reference is compared for identical indices.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import streamidx as si  # pylint: disable=g-import-not-at-top
  from streamidx import metrics  # pylint: disable=g-import-not-at-top
  from streamidx.lab.bench import oracle  # pylint: disable=g-import-not-at-top
  q, w, cache, seq_lens, page_indices, _, _ = args
  got = np.asarray(got)
  b = shape.batch()
  kw = shape.kernel_kwargs()
  i32 = lambda x: jnp.asarray(x, jnp.int32)  # pylint: disable=unnecessary-lambda-assignment
  subs = []
  if shape.kind == "decode":
    pps = b.pages_per_seq
    for s in (0, shape.num_seqs - 1):
      table = np.asarray(page_indices)[s * pps:(s + 1) * pps]
      lo = int(table.min())
      subs.append((f"sequence {s}", got[s:s + 1],
                   (q[s:s + 1], w[s:s + 1], cache[lo:lo + pps],
                    seq_lens[s:s + 1], i32(table - lo), i32([0, 1]),
                    i32([1, 1, 1]))))
  else:
    n, total = 8, shape.q_len
    pps = b.pages_per_seq
    table = np.concatenate([np.asarray(page_indices)[:pps],
                            np.zeros(pps, np.int32)])
    for lo in (0, total - n):
      seq_len = shape.seq_len - total + lo + n
      subs.append((f"rows {lo}-{lo + n - 1}", got[lo:lo + n],
                   (q[lo:lo + n], w[lo:lo + n], cache, i32([seq_len, 0]),
                    i32(table), i32([0, n, n]), i32([0, 1, 1]))))
  out = []
  for name, mine, sub in subs:
    np_sub = [np.asarray(a) for a in sub]
    o_idx, o_scores = oracle.oracle_topk(*np_sub, return_scores=True, **kw)
    bound = oracle.f32_score_bound(*np_sub[:3])
    c = metrics.compare_topk(mine, o_idx, o_scores, atol=2 * bound)
    one = np.asarray(si.streamindex_topk_ref(*sub, **kw))
    out.append({"slice": name, "oracle_ok": c.ok, "oracle_atol": 2 * bound,
                "one_chunk_identical": bool(np.array_equal(one, mine))})
  return {"slices": out,
          "oracle_ok": all(x["oracle_ok"] for x in out),
          "one_chunk_identical": all(x["one_chunk_identical"] for x in out)}


def worker(spec: dict) -> dict:
  """One reference on one long-context shape (the body of a worker process)."""
  import jax  # pylint: disable=g-import-not-at-top
  shape = Shape(**spec["shape"])
  fn = _fn(spec["impl"])
  kw = shape.kernel_kwargs()
  t0 = time.perf_counter()
  args = long_context_args(shape)
  jax.block_until_ready(args)
  build_s = time.perf_counter() - t0
  build_peak = memory.PeakMemory().peak()
  compiled, run = harness.compile_call(fn, args, kw)
  out, res = harness.measure(run, 0)  # one call
  np.save(spec["save"], np.asarray(out))
  res["memory"].update(peak_rss_while_building_inputs_bytes=build_peak,
                       inputs_bytes=int(sum(a.nbytes for a in args)),
                       xla=compiled["xla"])
  return {"build_s": build_s, "compile_s": compiled["compile_s"],
          "wall_s": res["warmup_s"], "memory": res["memory"],
          "spot_check": spot_check(shape, args, out)}


def run_long_context(*, shapes=LONG_CONTEXT, ks=LONG_CONTEXT_KS,
                     one_shot: str = "auto", out_dir="build/bench",
                     timeout: float = 3600.0, progress: bool = True) -> dict:
  """Streamed chunks at long context; one chunk predicted, maybe run.

  For each shape and k: XLA's buffer assignment for both settings, compiled
  ahead of time from shapes alone (nothing allocated), and
  `streaming.one_chunk_temp_bytes`' formula; then streaming in a fresh
  process (peak RSS measured). `one_shot`: "run" also runs the one-chunk
  reference there and compares the indices exactly; "auto" does so only
  when XLA's prediction (arguments + temporaries + output) is under half of
  MemAvailable; "skip" never runs it.
  """
  from streamidx import streaming  # pylint: disable=g-import-not-at-top
  if one_shot not in ("auto", "run", "skip"):
    raise ValueError(
        f"one_shot: must be 'auto', 'run' or 'skip' (got {one_shot!r})")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  configs = [dataclasses.replace(s, name=f"{s.name}_k{k}", k=k)
             for s in shapes for k in ks]
  doc = {"schema": LONG_SCHEMA, "created": harness.now(),
         "command": harness.command_line(),
         "machine": harness.worker_machine(timeout), "one_shot": one_shot,
         "results": []}
  bar = harness.progress_bar(
      len(configs) * (1 if one_shot == "skip" else 2), progress)
  with tempfile.TemporaryDirectory(prefix="streamidx-long-") as tmp:
    for i, shape in enumerate(configs):
      b = shape.batch()
      abstract = abstract_args(shape)
      kw = shape.kernel_kwargs()
      predicted = {}
      for impl in ("streaming", "reference"):
        predicted[impl] = memory.xla_memory(
            _fn(impl).lower(*abstract, **kw).compile())
      formula = streaming.one_chunk_temp_bytes(
          num_tokens=b.num_tokens, num_entries=b.pages_per_seq * shape.page_size,
          num_heads=shape.num_heads, head_dim=shape.head_dim, fmt=shape.fmt,
          k=shape.k)
      row = {"shape": dataclasses.asdict(shape), "description": shape.describe(),
             "visible_pairs": shape.visible_pairs(), "predicted_xla": predicted,
             "one_chunk_formula_temp_bytes": {"low": formula[0],
                                             "high": formula[1]}}
      for impl in ("streaming", "reference"):
        bar.set_description(f"{shape.name}: {impl}")
        if impl == "reference":
          p = predicted["reference"]
          need = p["argument_bytes"] + p["temp_bytes"] + p["output_bytes"]
          avail = memory.mem_available()
          fits = avail is not None and need < avail / 2
          row["one_chunk_decision"] = {
              "predicted_bytes": need, "mem_available_bytes": avail,
              "fits_half_of_available": fits}
          if one_shot == "skip" or (one_shot == "auto" and not fits):
            row["reference"] = {"status": "not run", "reason": (
                "skipped (--one-shot skip)" if one_shot == "skip" else
                f"predicted {memory.mib(need)} MiB >= half of MemAvailable "
                f"({memory.mib(avail)} MiB)")}
            if one_shot != "skip":
              bar.update()
            continue
        save = os.path.join(tmp, f"{i}_{impl}.npy")
        spec = {"shape": dataclasses.asdict(shape), "impl": impl,
                "save": save, "long": True}
        res = harness.run_worker(spec, timeout)
        if res["status"] == "ok":
          res["entries_per_s"] = shape.visible_pairs() / res["wall_s"]
          if impl == "reference":
            s_path = os.path.join(tmp, f"{i}_streaming.npy")
            if os.path.exists(s_path):
              res["identical_to_streaming"] = bool(
                  np.array_equal(np.load(save), np.load(s_path)))
        row[impl] = res
        bar.update()
      doc["results"].append(row)
  bar.close()
  (out_dir / "long_context.json").write_text(json.dumps(doc, indent=1) + "\n",
                                             encoding="utf-8")
  return doc
