"""Every call the API accepts compiles for TPU v5e, v6e and v7x (no TPU).

A draw is a seeded random valid call: a variant of `streamidx.VARIANTS` and
one of its cache formats, a head count, head_dim, a page size the format
packs, and a ragged batch (`make_mixed_batch`: decode, prefill and mixed
sequences of random lengths, spare sequence slots). It is lowered and
compiled with `streamidx.compile_for` on abstract arrays
(`lab.aot.compile_entry`: a compile depends on shapes only), its block
sizes left to the block-size table, as a call that leaves them None gets
them. A compiler error fails the test; so does a ValueError, since every
draw is a call the API accepts.

CI: one draw per variant with small shapes, the generations in turn, in
this one process, the selection the chip's default (`topk_method` None:
"blocktop" on all three); the full tier (tests/tiers.py) adds every other
variant and generation, and `FULL_DRAWS` larger draws of each with any
selection the variant takes.
The compile matrix (`python -m streamidx.aot`) compiles the named
production shapes.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamidx as si
from streamidx import cache
from streamidx.lab import aot, shapes

import tiers


GENERATIONS = ("v5e", "v6e", "v7x")
FULL_DRAWS = 2  # per variant and generation, full tier


@dataclasses.dataclass(frozen=True)
class Domain:
  """What a draw picks from."""

  heads: tuple[int, ...]
  head_dims: tuple[int, ...]
  min_page: int  # entries per page, at least (the format's smallest if more)
  max_page: int  # at most
  any_page: bool  # any multiple of the format's smallest page, else x 2**i
  max_tokens: int  # a sequence's tokens, at most
  max_q: int  # a prefill or mixed sequence's query rows, at most
  decode_q_lens: tuple[int, ...]
  any_topk_method: bool  # else the chip's default (topk_method None)


# CI: pages of 16 to 64 entries, powers of two (the full tier takes any size
# the format packs: odd sizes make token mode's KV blocks of whole lane rows
# long, 42-entry pages 64 a block; 8-entry pages 48 a block, unrolled; and
# 4- and 128-entry pages cost a page-mode compile 2-3 times a 16-entry
# page's).
CI = Domain(heads=(1, 2, 4, 8), head_dims=(64, 128), min_page=16, max_page=64,
            any_page=False, max_tokens=2048, max_q=32, decode_q_lens=(1,),
            any_topk_method=False)
FULL = Domain(heads=(1, 3, 4, 8, 12, 16, 32, 64), head_dims=(64, 128, 256),
              min_page=1, max_page=256, any_page=True, max_tokens=65536,
              max_q=256, decode_q_lens=(1, 1, 2, 4), any_topk_method=True)


@functools.lru_cache(maxsize=None)
def page_multiple(fmt: str) -> int:
  """The smallest page size the format's packer takes (`CACHE_FORMATS`)."""
  for p in range(1, 65):
    keys = jax.ShapeDtypeStruct((1, p, 128), jnp.float32)
    try:
      jax.eval_shape(cache.CACHE_FORMATS[fmt].pack, keys)
      return p
    except ValueError:
      continue
  raise AssertionError(f"no page size up to 64 packs as {fmt}")


@dataclasses.dataclass(frozen=True)
class Draw:
  variant: str
  fmt: str
  shape: shapes.CallShape
  static: dict

  def __str__(self):
    s = self.shape
    return (f"{self.variant} {self.fmt}: {s.note}, {s.num_heads} heads, "
            f"head_dim {s.head_dim}, k {s.k}, {self.static}")


def draw(variant: str, seed: int, domain: Domain = CI) -> Draw:
  """A random valid call of `variant` (seeded; module docstring): the first
  candidate the static checks accept (`refused`: a refusal before the
  compiler is the other outcome a call may have)."""
  rng = np.random.default_rng(seed)
  for _ in range(20):
    d = _candidate(variant, rng, domain)
    if refused(d) is None:
      return d
  raise AssertionError(f"20 candidates of {variant} (seed {seed}) refused")


def refused(d: "Draw") -> str | None:
  """The static checks' ValueError for the draw's call (block sizes from
  the table for any generation: v5e, v6e and v7x give page mode's launch
  the same VMEM), or None where they accept it."""
  v = si.VARIANTS[d.variant]
  try:
    call, arrays = v.kernel.bind(
        *aot.entry_args(d.variant, d.shape, d.fmt),
        **aot.entry_static(d.variant, d.shape, d.static))
    si.validate.static_validate(call, *arrays)
  except ValueError as e:
    return str(e)
  return None


def _candidate(variant: str, rng, domain: Domain) -> "Draw":
  v = si.VARIANTS[variant]
  pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
  fmt = pick(v.cache_formats)
  step = page_multiple(fmt)
  least = -(-domain.min_page // step)  # pages of `least` x step and up
  if domain.any_page:
    page = step * int(rng.integers(least, domain.max_page // step + 1))
  else:
    page = step * least * 2 ** int(rng.integers(
        0, (domain.max_page // (step * least)).bit_length()))
  ratio = 1 if v.mode == "page" else pick((1, 2, 4))
  dq = 1 if v.mode == "page" else pick(domain.decode_q_lens)
  counts = rng.integers(0, (4, 2, 2))  # decode, prefill, mixed sequences
  if not counts.any():
    counts[0] = 1
  tokens = lambda lo: int(rng.integers(lo, domain.max_tokens + 1))  # noqa: E731

  def chunk():
    seq = tokens(1)
    return int(rng.integers(1, min(seq, domain.max_q) + 1)), seq

  batch = si.make_mixed_batch(
      decode=[tokens(dq) for _ in range(counts[0])],
      prefill=[chunk() for _ in range(counts[1])],
      mixed=[chunk() for _ in range(counts[2])], decode_q_len=dq,
      page_size=page, compression_ratio=ratio,
      max_num_seqs=int(counts.sum() + rng.integers(0, 3)))
  k = int(rng.integers(1, (batch.pages_per_seq if v.mode == "page"
                           else 2 * domain.max_q) + 1))
  shape = shapes.CallShape(
      f"draw-{variant}", v.mode, batch.num_tokens, batch.max_num_seqs,
      batch.pages_per_seq, page, pick(domain.heads), pick(domain.head_dims),
      k, ratio, batch.describe(), dq)
  static = {}
  if v.mode == "token":
    # CI: the chip's default method (None: `topk.defaults`, "blocktop" on
    # v5e, v6e and v7x), what a call that names none compiles.
    static["topk_method"] = (pick(v.topk_methods) if domain.any_topk_method
                             else None)
  return Draw(variant, fmt, shape, static)


def assert_compiles(d: Draw, generation: str):
  try:
    aot.compile_entry(d.variant, d.shape, d.fmt, generation, **d.static)
  except Exception as e:  # pylint: disable=broad-except
    pytest.fail(f"{generation}: {d}: {aot.summarize_error(e)}")
  finally:
    jax.clear_caches()  # a draw's programs are its own (GBs, full tier)


def test_draws_are_valid_calls_of_every_variant():
  """The draws span the domain: every variant, several page sizes, head
  counts and batches; each a call the static checks accept."""
  draws = [draw(name, seed) for name in si.VARIANTS for seed in range(3)]
  assert {d.variant for d in draws} == set(si.VARIANTS)
  assert len({d.shape.page_size for d in draws}) >= 3
  assert len({d.shape.num_heads for d in draws}) > 2
  for d in draws:
    assert refused(d) is None, d
    call = si.VARIANTS[d.variant].kernel.call(
        *aot.entry_args(d.variant, d.shape, d.fmt),
        **aot.entry_static(d.variant, d.shape, d.static))
    assert call.has_blocks and call.block_source, d


# CI: every variant once, the generations taken in turn (each of v5e, v6e
# and v7x compiles a third of the variants); the full tier compiles every
# variant on every generation.
_CI_PAIRS = [(v, GENERATIONS[i % len(GENERATIONS)])
             for i, v in enumerate(si.VARIANTS)]


@tiers.needs_libtpu
@pytest.mark.parametrize("variant,generation", tiers.split(
    [(v, g) for v in si.VARIANTS for g in GENERATIONS],
    lambda vg: vg in _CI_PAIRS))
def test_a_random_call_compiles(variant, generation):
  """One small draw per variant and generation (seeded by both)."""
  assert_compiles(draw(variant, _seed(variant, generation)), generation)


def _seed(variant, generation, n=0):
  return 100 * n + 10 * list(si.VARIANTS).index(variant) + GENERATIONS.index(
      generation)


@tiers.needs_libtpu
@tiers.FULL
@pytest.mark.parametrize("n", range(1, 1 + FULL_DRAWS))
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("variant", list(si.VARIANTS))
def test_a_larger_random_call_compiles(variant, generation, n):
  """Full tier: `FULL_DRAWS` draws of the larger domain per variant and
  generation, any page size the format packs, any selection."""
  assert_compiles(draw(variant, _seed(variant, generation, n), FULL),
                  generation)


@tiers.needs_libtpu
def test_v4_refuses_the_packed_fp8_page_kernel_past_its_block_bound():
  """TPU v4 (M10's bf16 widening, M15's pooling): 128-entry pages of packed
  FP8 overflow its VMEM at any head count or rows; refused before the
  compiler, naming the argument and the bound. The aot matrix reports
  the row as refused."""
  shape = shapes.COMPILE_BY_NAME["page-64h-prefill"]
  with si.compile_for("v4") as target:
    args = aot.entry_args("vendored_page", shape, "fp8", target)
    with pytest.raises(ValueError, match=r"page_size: on TPU v4 .* <= 8192"):
      si.streamindex_page_topk.lower(*args, k_pages=shape.k,
                                     num_queries_per_block=4)
  (row,) = aot.matrix(quick=False, variants=["vendored_page"],
                      generations=["v4"], formats=["fp8"],
                      shapes=["page-64h-prefill"])
  assert row.refused.startswith("ValueError: page_size: on TPU v4")
  assert aot.compile_row(row).ok
