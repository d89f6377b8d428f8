"""streamidx.lab.studies.formats: bytes per entry of each entry layout."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from streamidx import cache
from streamidx.lab.studies import formats


# --------------------------------------------------------------------------
# Bytes per entry.


def test_bytes_per_entry_at_head_dim_128_are_256_256_132_129():
  got = {name: formats.bytes_per_entry(name) for name in formats.ENTRY_LAYOUTS}
  assert got == {"fp8_packed": 256, "bf16": 256, "fp8_f32_scale_apart": 132,
                 "fp8_e8m0_scale_apart": 129}


@pytest.mark.parametrize("head_dim", [128, 256, 512])
@pytest.mark.parametrize("name", formats.KERNEL_LAYOUTS)
def test_kernel_layouts_take_their_bytes_from_the_cache_format(name, head_dim):
  lay = formats.entry_layout(name, head_dim)
  assert lay.total_bytes == cache.record_bytes(lay.cache_format, head_dim)
  # The packed array really is that many bytes per entry.
  keys = jnp.ones((1, 8, head_dim), jnp.float32)
  packed = cache.pack_cache(keys, lay.cache_format)
  assert packed.nbytes == 8 * lay.total_bytes


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("name", formats.ENTRY_LAYOUTS)
def test_layout_parts_add_up(name, head_dim):
  lay = formats.entry_layout(name, head_dim)
  assert lay.value_bytes + lay.scale_bytes + lay.pad_bytes == lay.total_bytes
  assert lay.pad_bytes >= 0 and lay.value_bytes >= head_dim
  assert lay.scales_inline == (lay.cache_format is not None)


def test_fp8_packed_record_is_values_scale_and_padding_to_128_lanes():
  lay = formats.entry_layout("fp8_packed", 128)
  assert (lay.value_bytes, lay.scale_bytes, lay.pad_bytes) == (128, 1, 127)


@pytest.mark.parametrize("bad", [0, 64, 130, -128])
def test_entry_layout_rejects_head_dims_the_layouts_cannot_hold(bad):
  with pytest.raises(ValueError, match="head_dim"):
    formats.entry_layout("fp8_packed", bad)


def test_entry_layout_rejects_unknown_names():
  with pytest.raises(ValueError, match="layout must be one of"):
    formats.entry_layout("fp4", 128)
