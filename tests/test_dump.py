"""The dump layer (streamidx.lab.dump) on synthetic dump text, and the
trip-count check on compiled loops whose counts are known."""


import os

import jax.numpy as jnp
from jax import lax
import pytest

from streamidx.lab import dump, shapes

# A top-level program: a loop of 3 bundles + 4 delay slots whose index runs
# to 37 (XLA's form: increment, compare, select, branch back), calling
# `body_fusion` once an iteration; then a conditional's two arms.
_TLP = """\
     0   :  { %s1_s1 = smov 0 /* copy for cssa */ }
   0x1 LB: > { %s2_s2 = sld [smem:[#allocation1_spill]] } /* Start region 9 */
   0x2   : > { %3 = inlined_call %s2_s2 /* %body_fusion = fusion(%x) */ }
   0x3   : > { %s4_s3 = sadd.s32 1, %s2_s2 }
   0x4   : > { %p5_p0 = scmp.lt.s32.totalorder %s4_s3, 37 }
   0x5   : > { %s6_s4 = scalar_select /*predicate=*/%p5_p0, /*on_true=*/1, /*on_false=*/0 }
   0x6   : > { %s7_s5 = sand.u32 1, %s6_s4 }
   0x7   : > { %p8_p1 = scmp.eq.s32.totalorder %s7_s5, 0 }
   0x8   :  { %9 = sbr.rel (!%p8_p1) target = $region9 }
   0x9   :  {}
   0xa   :  {}
   0xb   :  {}
   0xc   :  {}
   0xd   :  { %10 = inlined_call /* %sort.1 = sort(%a) */ }
   0xe   :  { %11 = inlined_call /* %sort.2 = sort(%b) */ }
"""
# A pipelined Mosaic-style loop nested in another: "loop exit test" form,
# the index from a phi of a materialized constant.
_FUSION = """\
     0   :  { %s1_s1 = smov 2 /* materialized constant */ }
   0x1 LB: > { %s2_s2 = sphi %s1_s1, %s5_s5 } /* Start region 3 */
   0x2 LB: >> { %s3_s3 = sphi %s0_s0, %s6_s6 } /* Start region 4 */
   0x3   : >> { %s6_s6 = sadd.s32 1, %s3_s3 }
   0x4   : >> { %p7_p7 = scmp.ge.s32.totalorder %s6_s6, 10 /* loop exit test */ }
   0x5   :  { %8 = sbr.rel (!%p7_p7) target = $region4 }
   0x6   :  {}
   0x7   :  {}
   0x8   :  {}
   0x9   :  {}
   0xa   : > { %s5_s5 = sadd.s32 1, %s2_s2 }
   0xb   : > { %p9_p9 = scmp.ge.s32.totalorder %s5_s5, 6 /* loop exit test */ }
   0xc   :  { %10 = sbr.rel (!%p9_p9) target = $region3 }
   0xd   :  {}
   0xe   :  {}
   0xf   :  {}
  0x10   :  {}
  0x11   :  { %s11_s11 = sld [smem:[#allocation2]] }
"""
_DYNAMIC = """\
   0x0 LB: > { %s2_s2 = sphi %s0_s0, %s5_s5 } /* Start region 3 */
   0x1   : > { %s5_s5 = sadd.s32 1, %s2_s2 }
   0x2   : > { %p9_p9 = scmp.ge.s32.totalorder %s5_s5, %s7_s7 /* loop exit test */ }
   0x3   :  { %10 = sbr.rel (!%p9_p9) target = $region3 }
   0x4   :  {}
   0x5   :  {}
   0x6   :  {}
   0x7   :  {}
"""
# Two Mosaic loops as the compiler leaves them in a long kernel: a compare
# under a predicate ("(%p0_p0), "), and an index spilled to SMEM and
# reloaded before its exit test.
_SPILLED = """\
     0   :  { %s1_s1 = smov 0 /* copy for cssa */ }
   0x1 LB: > { %s2_s2 = sphi %s1_s1, %s3_s3 } /* Start region 5 */
   0x2   : > { %s3_s3 = sadd.s32 1, %s2_s2 }
   0x3   : > { %p4_p4 = scmp.ge.s32.totalorder (%p0_p0), %s3_s3, 4 }
   0x4   :  { %5 = sbr.rel (!%p4_p4) target = $region5 }
   0x5   :  {}
   0x6   :  {}
   0x7   :  {}
   0x8   :  {}
   0x9 LB: > { %s6_s6 = sphi %s1_s1, %s8_s8 } /* Start region 6 */
   0xa   : > { %s7_s7 = sadd.s32 1, %s6_s6 }
   0xb   : > { %9 = sst [smem:[#allocation7_spill]] %s7_s7 }
   0xc   : > { %s8_s8 = sld [smem:[#allocation7_spill]] }
   0xd   : > { %p10_p10 = scmp.ge.s32.totalorder %s8_s8, 9 /* loop exit test */ }
   0xe   :  { %11 = sbr.rel (!%p10_p10) target = $region6 }
   0xf   :  {}
  0x10   :  {}
  0x11   :  {}
  0x12   :  {}
"""
_HLO = """\
%region_0 (p: f32[4]) -> s32[2] {
  ROOT %sort.1 = s32[2] sort(%p)
}

%region_1 (p: f32[4]) -> s32[2] {
  ROOT %sort.2 = s32[2] sort(%p)
}

ENTRY %main (x: f32[4]) -> s32[2] {
  %call-start = ((f32[8,128]), f32[8,128], u32[]) call-start(%x), async_execution_thread="sparsecore", to_apply=%c
  ROOT %cond = s32[2] conditional(%i, %x, %x), branch_computations={%region_0, %region_1}
}
"""


def _comp(name, text):
  bundles = tuple(dump.parse_bundles(text))
  return dump.Computation(name, bundles, tuple(dump.find_loops(bundles)))


def test_trip_count_read_from_the_compare_of_the_incremented_index():
  tlp = _comp("TLP", _TLP)
  assert [(l.start, l.end, l.trips) for l in tlp.loops] == [(1, 0xC, 37)]
  assert tlp.bundles[1].depth == 1 and tlp.bundles[0].depth == 0


def test_nested_loops_multiply_and_the_phi_constant_is_the_start():
  f = _comp("body_fusion", _FUSION)
  assert [(l.start, l.trips, l.depth) for l in f.loops] == [(1, 4, 1), (2, 10, 2)]
  # 0x0 and 0x11 once; 0xa..0x10 (the outer tail) x 4; 0x1 x 4; the inner
  # loop 0x2..0x9 (8 bundles) x 10 x 4.
  count = dump.executed({"body_fusion": f}, root="body_fusion")
  assert count.total == 2 + 4 * (1 + 7) + 8 * 10 * 4


def test_inlined_calls_count_their_callee_per_iteration_and_conditionals():
  comps = {"TLP": _comp("TLP", _TLP), "body_fusion": _comp("body_fusion", _FUSION),
           "sort.1": _comp("sort.1", "0 : { %s1 = smov 0 }\n0x1 : { }\n"),
           "sort.2": _comp("sort.2", "0 : { %s1 = smov 0 }\n")}
  conds, sc = dump.read_hlo(_HLO)
  assert sc == [dump.SparseCoreCall("call-start", "f32[8,128]", 4096)]
  fusion = 2 + 4 * 8 + 8 * 10 * 4
  both = dump.executed(comps, conditionals=conds)
  assert both.total == 1 + 12 * 37 + 2 + 37 * fusion + 2 + 1
  assert both.conditionals == (("cond", "every branch (upper bound)"),)
  one = dump.executed(comps, conditionals=conds, taken={"cond": 1})
  assert one.total == both.total - 2
  with pytest.raises(ValueError, match="taken"):
    dump.executed(comps, conditionals=conds, taken={"cond": 2})


def test_trip_count_through_a_predicated_compare_and_a_spilled_index():
  c = _comp("k", _SPILLED)
  assert [(l.start, l.trips) for l in c.loops] == [(1, 4), (9, 9)]


def test_a_register_bound_is_a_dynamic_trip_count_the_caller_supplies():
  c = _comp("k", _DYNAMIC)
  assert c.loops[0].trips is None
  with pytest.raises(ValueError, match="trips"):
    dump.executed({"k": c}, root="k")
  got = dump.executed({"k": c}, root="k", trips={("k", 0): 5})
  assert got.total == 8 * 5 and got.dynamic == (("k", 0, 5),)


def test_a_dynamic_loop_inside_a_branch_not_taken_runs_no_trip():
  """A loop whose every call is into a branch that does not run (a
  `topk.base.again` loop, inlined in the top level) needs no trip count:
  0; taken the other way, it is a dynamic loop like any."""
  text = _DYNAMIC.replace(
      "   0x4   :  {}", "   0x4   :  { %3 = inlined_call /* %sort.1 = sort(%a) */ }")
  comps = {"TLP": _comp("TLP", text),
           "sort.1": _comp("sort.1", "0 : { %s1 = smov 0 }\n")}
  conds = [dump.Conditional("cond", (frozenset({"x"}), frozenset({"sort.1"})))]
  got = dump.executed(comps, conditionals=conds, taken={"cond": 0})
  assert got.total == 0 and got.dynamic == ()
  assert ("TLP loop at 0x0", "in a branch not taken") in got.conditionals
  with pytest.raises(ValueError, match="trips"):
    dump.executed(comps, conditionals=conds, taken={"cond": 1})
  ran = dump.executed(comps, conditionals=conds, taken={"cond": 1},
                      trips={("TLP", 0): 3})
  assert ran.total == 3 * (8 + 1) and ran.dynamic == (("TLP", 0, 3),)


def fori_program(x, *, n: int, m: int = 0):
  """A program whose loop counts are known, for checking `trip_count`: a
  `lax.fori_loop` of `n` iterations over f32 `x` (each with an inner loop of
  `m` iterations when m > 0). `dump.compile_dumps`'s child imports it
  as test_dump:fori_program (tests/ on its PYTHONPATH)."""
  def inner(_, c):
    return c * 1.0001 + jnp.sin(c)

  def outer(_, c):
    if m:
      c = jnp.cos(lax.fori_loop(0, m, inner, c))
      return c
    return inner(0, c)

  return lax.fori_loop(0, n, outer, x)


def test_trip_counts_of_compiled_fori_loops_scale_exactly(monkeypatch,
                                                          tmp_path):
  """count(N) = a + b * N at N = 3, 5, 8, and a nested pair multiplies:
  the loops' trips read from the v7x dump are N (and M)."""
  monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.abspath(__file__)))
  progs = [dict(generation="v7x", fn="test_dump:fori_program",
                kwargs=dict(n=n, m=m), args=[((8, 1024), "float32")])
           for n, m in ((3, 0), (5, 0), (8, 0), (3, 4), (5, 4), (5, 7))]
  dump.compile_dumps(progs, dump_dir=str(tmp_path))
  mods = dump.read_modules(str(tmp_path))
  assert len(mods) == len(progs)
  got = [dump.executed(comps, conditionals=conds, sparsecore=sc)
         for comps, conds, sc in mods]
  flat, nested = [c.total for c in got[:3]], [c.total for c in got[3:]]
  b = (flat[1] - flat[0]) // 2
  assert flat[1] - flat[0] == 2 * b and flat[2] - flat[1] == 3 * b and b > 0
  a = flat[0] - 3 * b
  assert [a + b * n for n in (3, 5, 8)] == flat
  for c, n in zip(got[:3], (3, 5, 8)):
    assert [l[3] for l in c.loops if l[0] == "TLP"] == [n]
  # nested: count = a2 + N * (c + M * d); the inner body's call runs N * M times
  for c, (n, m) in zip(got[3:], ((3, 4), (5, 4), (5, 7))):
    assert sorted(l[3] for l in c.loops if l[0] == "TLP") == sorted([n, m])
    calls = {r[0]: r[1] for r in c.by_call}
    assert max(calls.values()) == n * m
  per_outer = (nested[1] - nested[0]) // 2  # c + 4 d
  d = (nested[2] - nested[1]) // (5 * 3)
  assert nested[1] - nested[0] == 2 * per_outer and nested[2] - nested[1] == 15 * d
  assert nested[0] - 3 * per_outer == nested[1] - 5 * per_outer  # the same a2


def test_resized_is_the_decode_shape_at_other_seqs_and_tokens():
  """`lab.schedule --seqs/--tokens`: the same geometry, its sequences and
  pages changed; bad sizes and non-decode shapes named, not rounded."""
  base = shapes.COMPILE_BY_NAME["dsv4-decode-4k"]
  s = shapes.resized(base, tokens=2**20)
  assert (s.name, s.max_num_seqs, s.num_tokens, s.pages_per_seq) == (
      "dsv4-decode-4k@64x1048576", 64, 64, 2**20 // 4 // 128)
  assert (s.num_heads, s.page_size, s.k) == (base.num_heads, base.page_size,
                                             base.k)
  mtp = shapes.resized(shapes.COMPILE_BY_NAME["dsv4-mtp2-decode-4k"], seqs=16)
  assert (mtp.max_num_seqs, mtp.num_tokens, mtp.pages_per_seq) == (16, 32, 8)
  for kw, arg in ((dict(tokens=1000), "tokens"), (dict(seqs=0), "seqs")):
    with pytest.raises(ValueError, match=arg):
      shapes.resized(base, **kw)
  with pytest.raises(ValueError, match="shape"):
    shapes.resized(shapes.COMPILE_BY_NAME["dsv4-mixed"], seqs=8)


def test_recorded_launch_row_recompiles_to_the_same_counts():
  """data/step_schedule.json's v7x decode launch (the whole module) is what
  the compiler gives today."""
  from streamidx.lab import schedule
  from streamidx.lab.model import roofline

  shape = "dsv4-decode-4k"
  blocks = shapes.table_blocks(shapes.COMPILE_BY_NAME[shape], "vendored", "fp8",
                              "v7x").kwargs()
  s, = schedule.launch_schedules("vendored", "v7x", "fp8", shape, blocks,
                                 launches=["decode"])
  rec = roofline.launch_record("v7x", "vendored", "fp8", "decode",
                                  s.seq_batch_size, s.bkv_p, s.bq_sz)
  assert rec is not None and rec["compiled_shape"] == shape
  assert (s.program.outside, list(s.program.levels)) == (rec["outside"],
                                                         rec["levels"])
