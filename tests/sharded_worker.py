"""Runs every sharded layout on 8 virtual CPU devices; prints one line per case.

Started by tests/test_sharded.py in its own process (the rest of the suite
keeps one device). Each case runs `streamidx.sharded.sharded_topk` with the
kernel (Pallas TPU interpreter) on a mesh of 8 CPU devices and compares the
result, put back in the batch's row order, with the single-device reference
(tie-aware, within the derived summation tolerance):

    OK <case> rows=<n> identical=<n> tied=<n>
    FAIL <case>: <what differs>

and finally `DONE <ok> <failed>`; the exit status is 1 if a case failed.

The process has 9 CPU devices and the meshes use devices 1..8. Observed on
jax 0.10.2: with CPU device 0 in the mesh, the interpreted kernel deadlocks
whenever the devices' launches differ in length. The interpreter holds
every device in a cross-device barrier at each launch's start and end,
and `io_callback` places its operands on CPU device 0; a callback of
another device then waits on device 0, itself blocked in the barrier.
Leaving device 0 out of the mesh avoids it.

    XLA_FLAGS=--xla_force_host_platform_device_count=9 JAX_PLATFORMS=cpu \
        python tests/sharded_worker.py [case-name ...]   # default: all
"""

import sys
import time
import traceback

import jax
import numpy as np

import streamidx as si
from streamidx import metrics, sharded

TOKEN_BLOCKS = dict(num_kv_pages_per_block=4, num_queries_per_block=(1, 8, 8),
                    decode_req_batch_size=2)
PAGE_BLOCKS = dict(num_kv_pages_per_block=128, num_queries_per_block=8)

# (name, variant, fmt, num_data, num_context, merge, k[, decode_q_len]): one
# compiled program each; a case runs every batch of its mode (token: decode,
# prefill, mixed, with decode_q_len rows per decode sequence; page: one
# batch of decode and prefill rows). Together they cover each layout, each
# cache format and each merge, and speculative decoding (M17: gamma + 1 = 2,
# the decode rows' context shares shifted like any other row's); page mode
# runs two cases only (its 128-page KV blocks cost 128 simulated DMAs each).
CASES = (
    ("sequence-parallel-8/token/bf16", "vendored", "bf16", 8, 1,
     "all_gather", 16),
    ("context-parallel-8/token/fp8/all_gather", "vendored", "fp8", 1, 8,
     "all_gather", 16),
    ("2d-2x4/token/fp8/tree", "vendored", "fp8", 2, 4, "tree", 16),
    ("2d-4x2/token/bf16/all_gather", "vendored", "bf16", 4, 2, "all_gather",
     16),
    ("2d-2x4/page/fp8/all_gather", "vendored_page", "fp8", 2, 4,
     "all_gather", 2),
    ("context-parallel-8/page/bf16/tree", "vendored_page", "bf16", 1, 8,
     "tree", 1),
    ("2d-2x4/token/fp8/all_gather/mtp2", "vendored", "fp8", 2, 4,
     "all_gather", 16, 2),
)


# The CI tier's cases (tests/tiers.py; the rest are the full tier's): the
# data-only layout, the 2D layout (a context axis too) with the tree merge,
# and page mode with the all-gather merge: both formats, both merges, both
# modes. Notebook 09's CI run adds a context-parallel layout (1 x 2, in a
# fresh process).
CI_CASES = ("sequence-parallel-8/token/bf16", "2d-2x4/token/fp8/tree",
            "2d-2x4/page/fp8/all_gather")
assert set(CI_CASES) <= {c[0] for c in CASES}


def token_batches(dq=1):
  """Decode, prefill and mixed batches of one shape (ratio 4, 32-entry pages),
  `dq` query rows per decode sequence (seq_len at least dq).

  Shares: 8 pages (256 entries) per sequence over 8, 4 or 2 devices; the
  short sequences (1 to 128 tokens) end inside the first share or before
  it (seq_len 1 or 2: no entry at all).
  """
  common = dict(page_size=32, compression_ratio=4, pages_per_seq=8,
                max_num_seqs=10, num_tokens=40, total_num_pages=80,
                allocation="shuffled", decode_q_len=dq)

  def decode(*lens):
    return [max(n, dq) for n in lens]

  return {
      "decode": si.make_mixed_batch(
          decode=decode(1000, 64, 511, 40, 1, 300, 777, 128, 1023), seed=1,
          **common),
      "prefill": si.make_mixed_batch(
          decode=decode(900, 17),
          prefill=[(9, 700), (16, 100), (3, 37), (5, 1024)], seed=2, **common),
      "mixed": si.make_mixed_batch(
          decode=decode(513, 260, 5), prefill=[(7, 333)],
          mixed=[(6, 1000), (1, 90), (4, 64), (12, 480)], seed=3, **common),
  }


def page_batches():
  """Page mode (ratio 1, 16-entry pages, 8 pages per sequence): one batch of
  decode rows and prefill rows; the short sequences end in the first share."""
  return {
      "mixed": si.make_batch(
          [(1, 128), (6, 90), (1, 9), (3, 33), (5, 120), (1, 64)],
          page_size=16, compression_ratio=1, pages_per_seq=8, max_num_seqs=7,
          num_tokens=20, allocation="fragmented", seed=5),
  }


def run_case(name, variant, fmt, nd, nc, merge, k, devices, dq=1):
  v = si.VARIANTS[variant]
  page = v.mode == "page"
  batches = page_batches() if page else token_batches(dq)
  ratio = 1 if page else 4
  static = PAGE_BLOCKS if page else dict(TOKEN_BLOCKS, decode_q_len=dq)
  inputs = {b: si.make_inputs(batch, num_heads=8, fmt=fmt, seed=7)
            for b, batch in batches.items()}
  # One compiled program for all batches: pad every device to the largest.
  plain = [sharded.shard_inputs(x, v, num_data=nd, num_context=nc, fmt=fmt)
           for x in inputs.values()]
  pad = dict(slots=max(s.args[-4].shape[0] // nd for s in plain),
             rows=max(s.args[0].shape[0] // nd for s in plain),
             cache_pages=max(s.cache_pages for s in plain))
  mesh = sharded.make_mesh(nd, nc, devices=devices)
  fn = sharded.sharded_topk(
      v, mesh, data_axis="data" if nd > 1 else None,
      context_axis="context" if nc > 1 else None, k=k,
      compression_ratio=ratio, merge=merge, **static)
  lines = []
  compiled = None
  for bname, x in inputs.items():
    case = f"{name}/{bname}"
    t0 = time.time()
    s = sharded.shard_inputs(x, v, num_data=nd, num_context=nc, fmt=fmt, **pad)
    if compiled is None:  # one trace and compile serves every batch
      lowered = fn.lower(*s.args)
      op = "all_gather" if merge == "all_gather" else "collective_permute"
      if nc > 1 and op not in lowered.as_text():
        lines.append(f"FAIL {case}: no {op} in the lowered program")
        break
      compiled = lowered.compile()
    got = s.gather_rows(compiled(*s.args))
    want = np.asarray(v.run_reference(x, k=k, compression_ratio=ratio,
                                      fmt=fmt, **static))
    scores = v.scores(x, compression_ratio=ratio, fmt=fmt)
    atol = metrics.summation_atol(x, compression_ratio=ratio, mode=v.mode)
    c = metrics.compare_topk(got, want, scores, atol=atol)
    live = int((want >= 0).sum())
    if not c.ok:
      lines.append(f"FAIL {case}: {c.rows_mismatched}/{c.rows} rows; "
                   f"{c.detail}")
    elif live == 0:
      lines.append(f"FAIL {case}: the reference selects nothing")
    else:
      lines.append(f"OK {case} rows={c.rows} identical={c.rows_identical} "
                   f"tied={c.rows_tied} selected={live} "
                   f"P={s.pages_per_share} G={s.cache_pages} "
                   f"t={time.time() - t0:.1f}s")
  return lines


def main(argv):
  devices = jax.devices()
  if len(devices) < 9:
    print(f"FAIL setup: need 9 CPU devices (got {len(devices)}); set "
          "XLA_FLAGS=--xla_force_host_platform_device_count=9", flush=True)
    return 1
  mesh_devices = devices[1:9]
  ok = bad = 0
  for case in CASES:
    if argv and case[0] not in argv:
      continue
    t0 = time.time()
    try:
      lines = run_case(*case[:7], mesh_devices, *case[7:])
    except Exception:  # pylint: disable=broad-except
      si.reset_interpreter_state()
      lines = [f"FAIL {case[0]}: " + traceback.format_exc().replace(
          "\n", " | ")]
    for line in lines:
      print(line, flush=True)
      ok += line.startswith("OK ")
      bad += line.startswith("FAIL ")
    print(f"# {case[0]}: {time.time() - t0:.1f}s", flush=True)
  print(f"DONE {ok} {bad}", flush=True)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
