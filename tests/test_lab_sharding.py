"""lab.sharding: collectives read from compiled HLO; the TPU-slice compiles.

The compiles need libtpu (`pip install 'libtpu==0.0.42.*'`) and are skipped
without it; the HLO reader is checked on HLO lines of the form the TPU
compiler prints (taken from a v6e:2x2 compile of the context-parallel
layout).
"""


import pytest

from streamidx.lab import sharding
import tiers

HLO = """
  %all-gather.1 = s32[8,2048,2]{2,1,0:T(8,128)S(1)} all-gather(%fusion.3), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={1}, use_global_device_ids=true
  %all-gather-start.2 = (s32[8,512,2]{2,1,0}, s32[8,1024,2]{2,1,0}) all-gather-start(%x), channel_id=2, replica_groups={{0,1},{2,3}}, dimensions={1}
  %all-gather-done.2 = s32[8,1024,2]{2,1,0} all-gather-done(%all-gather-start.2)
  %collective-permute-start.1 = (s32[8,512,2]{2,1,0}, s32[8,512,2]{2,1,0}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%y), channel_id=3, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
  %collective-permute-done.1 = s32[8,512,2]{2,1,0} collective-permute-done(%collective-permute-start.1)
  %custom-call.5 = f32[8,18,128]{2,1,0} custom-call(%a), custom_call_target="tpu_custom_call"
"""


def test_collectives_are_read_with_their_sizes_and_groups():
  got = sharding.collectives(HLO)
  assert [(c.op, c.shapes, c.group_size) for c in got] == [
      ("all-gather", ("s32[8,2048,2]",), 4),
      ("all-gather", ("s32[8,1024,2]",), 2),
      ("collective-permute", ("s32[8,512,2]",), 2),
  ]
  assert [c.output_bytes for c in got] == [131072, 65536, 32768]
  # An all-gather brings in (G - 1) / G of its output, a permute all of it.
  assert [c.received_bytes for c in got] == [98304, 32768, 32768]


def test_unknown_layout_and_topology_are_rejected():
  with pytest.raises(ValueError, match="topology: must be one of"):
    sharding.compile_sharded("v9:2x2", "context-parallel")




@tiers.needs_libtpu
@pytest.mark.parametrize("topology,layout,variant,kw", [
    ("v6e:2x2", "2d", "vendored", {}),
    ("tpu7x:2x2x1", "context-parallel", "vendored_page",
     dict(page_size=16, pages_per_share=128, num_queries_per_block=8)),
])
def test_sharded_layout_compiles_for_a_tpu_slice_with_its_merge(
    topology, layout, variant, kw):
  r = sharding.compile_sharded(topology, layout, variant=variant, **kw)
  assert r.ok, r.error
  assert r.has_kernel  # the Mosaic kernel, not the interpreter
  assert [c.op for c in r.collectives] == ["all-gather"]
  assert r.received_bytes == r.model_received_bytes > 0
