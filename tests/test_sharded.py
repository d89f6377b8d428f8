"""Multi-device StreamIndex (`streamidx.sharded`): exact against one device.

The layouts run on 8 virtual CPU devices in a subprocess
(tests/sharded_worker.py), so that this process and the rest of the suite
keep one device; each of its cases is one test here. The rest runs in this
process: the exact merge, the context-share semantics the kernel is called
with (kernel modifications M7 and M8), and the argument checks.
"""

import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

import streamidx as si
from streamidx import metrics, sharded

import sharded_worker
import tiers

HERE = os.path.dirname(os.path.abspath(__file__))
# All six cases: ~100 CPU-s on an idle machine (the CI tier's three: ~40);
# a loaded 2-core host once took > 600 s.
WORKER_TIMEOUT_S = 1500


def _expected_cases():
  out = []
  for name, variant, *_ in sharded_worker.CASES:
    page = si.VARIANTS[variant].mode == "page"
    batches = ("mixed",) if page else ("decode", "prefill", "mixed")
    out += [f"{name}/{b}" for b in batches]
  return out


CASES = _expected_cases()


def _layout(case: str) -> str:
  """The worker case (`sharded_worker.CASES` name) of a test case: the
  test case's name without its batch suffix."""
  return case.rsplit("/", 1)[0]


# ---------------------------------------------------------------------------
# The exact merge.


def _dense_topk(scores, indices, width, k):
  """Reference: scatter candidates into a dense row, then lax.top_k."""
  t = scores.shape[0]
  dense = np.full((t, width), -np.inf, np.float32)
  for r in range(t):
    for s, i in zip(scores[r], indices[r]):
      if i >= 0:
        dense[r, i] = s
  return np.asarray(si.ref.topk_from_scores(jnp.asarray(dense), k))


@pytest.mark.parametrize("seed", range(4))
def test_merge_topk_equals_the_dense_top_k_with_ties_to_the_lowest_index(
    seed):
  rng = np.random.default_rng(seed)
  t, width, n, k = 6, 64, 24, 8
  idx = np.stack([rng.choice(width, n, replace=False) for _ in range(t)])
  # Few distinct values: many exact ties at the k-th position.
  scores = rng.integers(0, 4, (t, n)).astype(np.float32)
  idx[:, -5:] = -1  # empty candidate slots
  scores[:, -5:] = -np.inf
  idx[0, 3:] = -1  # a row with fewer candidates than k
  scores[0, 3:] = -np.inf
  top, got = sharded.merge_topk(jnp.asarray(scores), jnp.asarray(idx,
                                                                 jnp.int32), k)
  want = _dense_topk(scores, idx, width, k)
  np.testing.assert_array_equal(np.asarray(got), want)
  assert np.all(np.asarray(top)[np.asarray(got) < 0] == -np.inf)


def test_merge_topk_counts_negative_zero_as_zero():
  scores = jnp.asarray([[-0.0, 0.0, -0.0, 0.0]], jnp.float32)
  idx = jnp.asarray([[7, 5, 1, 3]], jnp.int32)
  _, got = sharded.merge_topk(scores, idx, 2)
  np.testing.assert_array_equal(np.asarray(got), [[1, 3]])


def test_merge_bytes_per_row():
  assert sharded.merge_bytes_per_row(512, 8, "all_gather") == 8 * 512 * 7
  assert sharded.merge_bytes_per_row(512, 8, "tree") == 8 * 512 * 3
  assert sharded.merge_bytes_per_row(512, 1, "tree") == 0
  with pytest.raises(ValueError, match="merge"):
    sharded.merge_bytes_per_row(512, 8, "ring")


# ---------------------------------------------------------------------------
# What a context-parallel device asks the unmodified kernel (M7, M8).

BLOCKS = dict(num_kv_pages_per_block=4, num_queries_per_block=(1, 8, 8),
              decode_req_batch_size=2)


@pytest.fixture(scope="module")
def token_inputs():
  b = si.make_mixed_batch(decode=[1000, 40, 511], prefill=[(9, 700)],
                          mixed=[(5, 1023), (1, 90)], page_size=32,
                          compression_ratio=4, pages_per_seq=8,
                          allocation="shuffled", seed=3)
  return si.make_inputs(b, num_heads=8, fmt="fp8", seed=1)


def test_kernel_ends_every_sequence_at_its_page_table_like_the_reference(
    token_inputs):
  """M7: a table narrower than the sequence; entries past it are invisible."""
  q, w, cache, seq_lens, table, cu, dist = token_inputs.args
  narrow = table.reshape(seq_lens.shape[0], -1)[:, :3].reshape(-1)
  args = (q, w, cache, seq_lens, narrow, cu, dist)
  got = jax.block_until_ready(
      si.streamindex_topk(*args, k=16, compression_ratio=4, **BLOCKS))
  want = si.streamindex_topk_ref(*args, k=16, compression_ratio=4)
  scores = si.token_scores(*args, compression_ratio=4)
  assert scores.shape[1] == 3 * 32
  metrics.assert_topk_match(got, want, scores, atol=metrics.summation_atol(
      token_inputs, compression_ratio=4))
  assert np.asarray(got).max() < 3 * 32


def test_return_scores_gives_the_selected_entries_scores(token_inputs):
  """M8, kernel and reference twin."""
  kw = dict(k=16, compression_ratio=4, **BLOCKS)
  idx, vals = jax.block_until_ready(
      si.streamindex_topk(*token_inputs.args, return_scores=True, **kw))
  ridx, rvals = si.streamindex_topk_ref(*token_inputs.args,
                                        return_scores=True, **kw)
  np.testing.assert_array_equal(
      np.asarray(idx), np.asarray(si.streamindex_topk(*token_inputs.args,
                                                      **kw)))
  scores = np.asarray(si.token_scores(*token_inputs.args,
                                      compression_ratio=4))
  atol = metrics.summation_atol(token_inputs, compression_ratio=4)
  for got_i, got_v in ((idx, vals), (ridx, rvals)):
    got_i, got_v = np.asarray(got_i), np.asarray(got_v)
    exact = np.take_along_axis(scores, np.maximum(got_i, 0), axis=1)
    live = got_i >= 0
    assert np.all(got_v[~live] == -np.inf)
    np.testing.assert_allclose(got_v[live], exact[live], rtol=0, atol=atol)


def test_a_shifted_share_scores_the_global_masks_restricted_to_it(
    token_inputs):
  """Context parallelism's call, on one device: share c of 4 (2 pages each).

  The kernel gets the share's page-table columns and seq_len - lo * ratio;
  its top-k, shifted by lo, must be the reference's top-k over the global
  scores of entries [lo, lo + 64) only.
  """
  inp = token_inputs
  q, w, cache, seq_lens, table, cu, dist = inp.args
  full = np.asarray(si.token_scores(*inp.args, compression_ratio=4))
  atol = metrics.summation_atol(inp, compression_ratio=4)
  t2 = table.reshape(seq_lens.shape[0], -1)
  share = 2 * 32
  for c in range(4):
    lo = c * share
    local = (q, w, cache, jnp.maximum(seq_lens - lo * 4, 0),
             t2[:, 2 * c:2 * c + 2].reshape(-1), cu, dist)
    got = np.asarray(jax.block_until_ready(
        si.streamindex_topk(*local, k=16, compression_ratio=4, **BLOCKS)))
    got = np.where(got >= 0, got + lo, -1)
    restricted = np.full_like(full, -np.inf)
    restricted[:, lo:lo + share] = full[:, lo:lo + share]
    want = np.asarray(si.ref.topk_from_scores(jnp.asarray(restricted), 16))
    metrics.assert_topk_match(got, want, restricted, atol=atol,
                              label=f"share {c}")


def test_one_device_mesh_runs_both_axes(token_inputs):
  """The whole path in this process: a 1 x 1 mesh, the reference inside."""
  v = si.VARIANTS["vendored"]
  mesh = sharded.make_mesh(1, 1)
  s = sharded.shard_inputs(token_inputs, v)
  fn = sharded.sharded_topk(v, mesh, data_axis="data", context_axis="context",
                            k=16, compression_ratio=4, impl="reference")
  got = s.gather_rows(fn(*s.args))
  want = v.run_reference(token_inputs, k=16, compression_ratio=4)
  metrics.assert_topk_match(got, want, v.scores(token_inputs,
                                                compression_ratio=4))


def test_shard_inputs_splits_sequences_and_pages(token_inputs):
  v = si.VARIANTS["vendored"]
  s = sharded.shard_inputs(token_inputs, v, num_data=2, num_context=4)
  q, w, cache, seq_lens, table, cu, dist = s.args
  assert s.pages_per_share == 2 and s.share_entries == 64
  assert seq_lens.shape == (2 * 3,) and table.shape == (2 * 4 * 3 * 2,)
  assert cache.shape[0] == 2 * 4 * s.cache_pages
  # Shard 0: decode 1000, 511; mixed (5, 1023). Shard 1: decode 40; prefill
  # (9, 700); mixed (1, 90).
  np.testing.assert_array_equal(np.asarray(dist), [2, 2, 3, 1, 2, 3])
  np.testing.assert_array_equal(np.asarray(seq_lens),
                                [1000, 511, 1023, 40, 700, 90])
  assert s.cache_bytes_per_device == s.cache_pages * 32 * 256
  # Every query row lands once, with its own q.
  rows = s.rows[s.rows >= 0]
  assert len(set(rows.tolist())) == token_inputs.batch.num_query_tokens
  np.testing.assert_array_equal(
      np.asarray(q)[s.rows[:token_inputs.batch.num_query_tokens]],
      np.asarray(token_inputs.q)[:token_inputs.batch.num_query_tokens])


# ---------------------------------------------------------------------------
# Bad arguments: a clear ValueError before anything runs.


def _mesh(*shape):
  return AbstractMesh(shape, ("data", "context"))


@pytest.mark.parametrize("kwargs,match", [
    (dict(data_axis=None, context_axis=None), "at least one"),
    (dict(data_axis="batch"), "data_axis: must be one of the mesh axes"),
    (dict(data_axis="data", context_axis="data"), "context_axis: must differ"),
    (dict(context_axis="context", merge="ring"), "merge: must be one of"),
    (dict(impl="streaming"), "impl: must be one of"),
    (dict(context_axis="context", merge="tree"), "power-of-two"),
    (dict(return_scores=True), "return_scores: set by sharded_topk"),
])
def test_sharded_topk_rejects_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sharded.sharded_topk("vendored", _mesh(2, 3), k=8, compression_ratio=4,
                         **kwargs)


def test_page_mode_context_parallel_needs_k_pages_within_a_share():
  v = si.VARIANTS["vendored_page"]
  b = si.make_batch([(1, 100), (3, 40)], page_size=16, compression_ratio=1,
                    pages_per_seq=8)
  s = sharded.shard_inputs(si.make_inputs(b, num_heads=8), v, num_context=1,
                           pages_per_share=8)
  fn = sharded.sharded_topk(v, sharded.make_mesh(1, 1), data_axis=None,
                            context_axis="context", k=9, compression_ratio=1,
                            impl="reference")
  with pytest.raises(ValueError, match=r"k_pages: page-mode context "
                     r"parallelism needs k_pages <= the pages of one share"):
    fn(*s.args)


def test_layout_shapes_are_checked(token_inputs):
  v = si.VARIANTS["vendored"]
  s = sharded.shard_inputs(token_inputs, v)
  fn = sharded.sharded_topk(v, sharded.make_mesh(1, 1), k=8,
                            compression_ratio=4, impl="reference")
  q, w, cache, seq_lens, table, cu, dist = s.args
  with pytest.raises(ValueError, match="cu_q_lens: needs"):
    fn(q, w, cache, seq_lens, table, cu[:-1], dist)
  with pytest.raises(ValueError, match="weights: must have q's rows"):
    fn(q, w[:-1], cache, seq_lens, table, cu, dist)
  with pytest.raises(ValueError, match="distribution: needs 3"):
    fn(q, w, cache, seq_lens, table, cu, dist[:2])


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_data=0), "num_data: must be a positive int"),
    (dict(num_context=2, pages_per_share=1), "pages_per_share: must be an int"),
    (dict(slots=1), "slots: must be an int >= 6"),
    (dict(cache_pages=0), "cache_pages: must be an int >="),
])
def test_shard_inputs_rejects_bad_arguments(token_inputs, kwargs, match):
  with pytest.raises(ValueError, match=match):
    sharded.shard_inputs(token_inputs, "vendored", **kwargs)


def test_make_mesh_needs_enough_devices():
  with pytest.raises(ValueError, match="devices: a 4 x 4 mesh needs 16"):
    sharded.make_mesh(4, 4)


# ---------------------------------------------------------------------------
# The layouts on 8 CPU devices (the worker process). It starts with this
# module, so that it runs while the tests above do; its tests come last.


def _selected_layouts(session, module) -> list[str]:
  """The worker cases this session's selected tests need (the CI tier
  deselects the full tier's), in the worker's order."""
  wanted = set()
  for item in session.items:
    if item.module is module and "worker_lines" in getattr(
        item, "fixturenames", ()):
      spec = getattr(item, "callspec", None)
      if spec is None or "case" not in spec.params:
        wanted.update(sharded_worker.CI_CASES)  # the DONE check: the CI cases
      else:
        wanted.add(_layout(spec.params["case"]))
  return [c[0] for c in sharded_worker.CASES if c[0] in wanted]


@pytest.fixture(scope="module", autouse=True)
def _worker_process(request):
  layouts = _selected_layouts(request.session, request.module)
  if not layouts:
    yield None
    return
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=9").strip())
  # Files, not pipes: nobody reads a pipe while the tests above run.
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen([sys.executable, "-u",
                             os.path.join(HERE, "sharded_worker.py"),
                             *layouts],
                            env=env, stdout=out, stderr=err, text=True)
    yield proc, out, err, layouts
    if proc.poll() is None:
      proc.kill()
      proc.wait()


@pytest.fixture(scope="module")
def worker_lines(_worker_process):
  assert _worker_process is not None, "no worker case selected"
  proc, out_file, err_file, layouts = _worker_process
  try:
    proc.wait(timeout=WORKER_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
  out_file.seek(0)
  err_file.seek(0)
  out, err = out_file.read(), err_file.read()
  lines = out.splitlines()
  assert any(l.startswith("DONE ") for l in lines), (
      f"worker did not finish (exit {proc.returncode}):\n{out[-3000:]}"
      f"\n{err[-3000:]}")
  return lines, layouts


@pytest.mark.parametrize("case", tiers.split(
    CASES, lambda c: _layout(c) in sharded_worker.CI_CASES))
def test_sharded_layout_matches_single_device_reference(worker_lines, case):
  lines, _ = worker_lines
  mine = [l for l in lines if l.split(" ")[1:2] == [case]]
  assert mine, f"{case}: not run; worker said:\n" + "\n".join(lines)
  assert mine[0].startswith("OK "), mine[0]


def test_worker_ran_every_selected_case_and_nothing_failed(worker_lines):
  lines, layouts = worker_lines
  done = [l for l in lines if l.startswith("DONE ")][0].split()
  ran = [c for c in CASES if _layout(c) in layouts]
  assert (int(done[1]), int(done[2])) == (len(ran), 0), lines


def test_the_ci_cases_cover_every_layout_kind_format_merge_and_mode():
  ci = [c for c in sharded_worker.CASES if c[0] in sharded_worker.CI_CASES]
  assert {si.VARIANTS[c[1]].mode for c in ci} == {"token", "page"}
  assert {c[2] for c in ci} == {"fp8", "bf16"}
  assert {c[5] for c in ci if c[4] > 1} == {"all_gather", "tree"}
  assert any(c[3] > 1 and c[4] == 1 for c in ci)  # data axis only
  assert any(c[4] > 1 for c in ci)                # a context axis
