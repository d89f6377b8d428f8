"""The scaling model (streamidx.lab.model.scaling): its terms and crossovers."""

import pytest

from streamidx import sharded
from streamidx.lab.model import hardware, roofline, scaling
from streamidx.lab.model import topk as topk_model
from streamidx.topk import defaults

W = scaling.DSV4_DECODE
SPECS = hardware.load_specs()


def test_dsv4_decode_workload_is_the_issues():
  assert (W.num_heads, W.head_dim, W.compression_ratio, W.fmt, W.k) == (
      64, 128, 4, "fp8", 512)
  assert W.entries == 256 * 1024  # 1M tokens / 4
  # 64 MiB of cache per sequence and layer at 256 B per entry.
  one = scaling.step(W.with_(num_seqs=1), "v6e", 1)
  assert one.cache_bytes_per_device == 64 * 2**20


@pytest.mark.parametrize("gen", ["v5e", "v6e", "v7x"])
def test_one_chip_step_is_the_cache_read_the_score_buffer_and_the_selection(gen):
  m = scaling.step(W, gen, SPECS[gen].jax_devices_per_chip)
  per_device = W.num_seqs // m.num_data
  assert m.cache_bytes_per_device == per_device * W.entries * 256
  t_read = m.cache_bytes_per_device / SPECS[gen].kernel_bandwidth
  # The roofline adds the f32 score buffer (its fill and writes: ~3%) and
  # block rounding to the read; the selection is charged apart.
  assert t_read <= m.local_s - m.selection_s <= 1.1 * t_read
  assert m.selection_s == scaling.selection_seconds(gen, per_device, W.entries,
                                                    W.k)[0] > 0
  assert m.merge_s == 0 and m.merge_bytes_per_device == 0


def test_the_selection_is_the_default_methods_recorded_bundles_by_elements():
  """At DeepSeek-V4 decode (the records' shape) the default method's
  recorded bundles at the chip's one clock; half the rows, half the time; a
  chip with no recorded compile of its default, the HBM bound, said so."""
  rows, entries, k = defaults.DECODE
  for gen in ("v5e", "v6e", "v7x"):
    method = defaults.default_method(gen)
    rec = roofline.selection_record(gen, method, rows, entries, k)
    t, src = scaling.selection_seconds(gen, rows, entries, k)
    assert t == pytest.approx(rec["bundles"] / roofline.clock(gen)[0])
    assert src.startswith(f"{method}: {rec['bundles']:,} bundles")
    assert scaling.selection_seconds(gen, rows // 2, entries, k)[0] == (
        pytest.approx(t / 2))
  t, src = scaling.selection_seconds("v4", rows, entries, k)
  cost = topk_model.cost(defaults.default_method("v4"), rows, entries, k)
  assert t == topk_model.hbm_bound(cost, SPECS["v4"])
  assert "HBM bytes only (no recorded compile" in src


def test_merge_bytes_are_the_sharded_merges():
  m = scaling.step(W, "v6e", 128, 2)
  assert m.seqs_per_device == 1 and m.share_pages == W.pages // 2
  assert m.merge_bytes_per_device == sharded.merge_bytes_per_row(512, 2)
  t = scaling.step(W, "v6e", 128, 8, merge="tree")
  assert t.seqs_per_device == 4  # 16 data groups of 8
  assert t.merge_bytes_per_device == 4 * 8 * 512 * 3  # log2(8) rounds
  assert t.merge_ici_s == t.merge_bytes_per_device / 8e11


def test_while_sequences_fill_the_devices_one_chip_per_sequence_wins():
  for gen in ("v6e", "v7x"):
    for chips in (1, 4, 8, 32):
      devices = chips * SPECS[gen].jax_devices_per_chip
      if devices <= W.num_seqs:
        assert scaling.best_step(W, gen, devices).num_context == 1


@pytest.mark.parametrize("gen,chips", [("v6e", 128), ("v7x", 64)])
def test_context_parallelism_pays_once_devices_outnumber_sequences(gen,
                                                                   chips):
  """Bandwidth-only model: the first power-of-two device count above B."""
  n, best, sp = scaling.crossover_devices(W, gen)
  assert n == chips
  assert n * SPECS[gen].jax_devices_per_chip == 2 * W.num_seqs
  assert best.num_context == 2 and best.step_s < sp.step_s
  # It halves each device's reads and adds a merge of 4 KiB per row.
  assert best.local_s == pytest.approx(sp.local_s / 2, rel=0.02)


def test_crossover_context_is_the_first_context_that_pays():
  one = W.with_(num_seqs=1)
  lat = 10e-6  # an assumed collective latency
  tokens, best, sp = scaling.crossover_context(one, "v6e", 8,
                                               collective_latency_s=lat)
  assert best.num_context > 1 and best.step_s < sp.step_s
  page = W.page_size * W.compression_ratio
  before = one.with_(seq_len=tokens - page)
  b = scaling.best_step(before, "v6e", 8, collective_latency_s=lat)
  assert b.num_context == 1 or b.step_s >= scaling.step(before, "v6e",
                                                         8).step_s
  # More latency: a longer context before it pays.
  longer, _, _ = scaling.crossover_context(one, "v6e", 8,
                                           collective_latency_s=3 * lat)
  assert longer > tokens


def test_a_latency_above_the_whole_read_means_it_never_pays():
  """v7x reads a 1M-token sequence in ~19 us per TensorCore: a 30 us merge
  latency can never be won back at that context, on any chip count."""
  assert scaling.crossover_devices(W, "v7x", collective_latency_s=30e-6,
                                   max_chips=1024) is None


def test_no_ici_bandwidth_no_context_parallelism():
  assert scaling.best_step(W, "v4", 128).num_context == 1
  with pytest.raises(ValueError, match="v4 has no published ICI bandwidth"):
    scaling.step(W, "v4", 128, 2)
  with pytest.raises(ValueError, match="num_context: must divide devices"):
    scaling.step(W, "v6e", 6, 4)


def test_scaling_table_rows():
  rows = scaling.scaling_table(W, generations=("v6e", "v7x"))
  assert [(r["generation"], r["chips"]) for r in rows] == [
      (g, n) for g in ("v6e", "v7x") for n in scaling.CHIP_COUNTS]
  v7x64 = rows[-1]
  assert v7x64["devices"] == 128 and v7x64["best C"] == 2
  assert v7x64["speedup"] > 1.9
