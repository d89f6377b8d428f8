"""Inputs too large for `make_inputs`' f32 keys (`--record`): the cache
built a few pages at a time in any format (`random_cache`) and the kernel's
arguments (`long_context_args`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from streamidx import cache as cache_lib
from streamidx.lab.shapes import Shape

def random_cache(total_pages: int, page_size: int, head_dim: int = 128,
                 fmt: str = "fp8", *, seed: int = 0,
                 pages_per_step: int = 256) -> tuple:
  """A seeded N(0, 1) cache in `fmt` (`cache.CACHE_FORMATS`): the tuple of
  its arrays, packed gcd(total_pages, pages_per_step) pages at a time in one
  `lax.map` (keys of group i from `fold_in(key(seed), i)`, the same keys in
  every format): one group's f32 keys (16 MiB) beside the packed cache, not
  8 GiB of them at 64 x 256K entries."""
  step = math.gcd(total_pages, pages_per_step)
  layout = cache_lib.CACHE_FORMATS[fmt]

  @jax.jit
  def build(key):
    def group(i):
      keys = jax.random.normal(jax.random.fold_in(key, i),
                               (step, page_size, head_dim), jnp.float32)
      return tuple(layout.pack(keys))
    out = jax.lax.map(group, jnp.arange(total_pages // step))
    return tuple(a.reshape((total_pages,) + a.shape[2:]) for a in out)

  return build(jax.random.key(seed))


def long_context_args(shape: Shape, *, seed: int = 0):
  """The kernel's 7 positional arguments for a long-context shape: q, weights
  drawn as `batch.make_inputs` draws them, the cache from `random_cache`
  (one array, or the tuple of a multi-array format)."""
  b = shape.batch()
  rng = np.random.default_rng(seed)
  t, h, d = b.num_tokens, shape.num_heads, shape.head_dim
  q = rng.standard_normal((t, h, d), np.float32)
  w = np.abs(rng.standard_normal((t, h), np.float32)) / np.sqrt(h)
  cache = random_cache(b.total_num_pages, shape.page_size, d, shape.fmt,
                       seed=seed + 1)
  return (jnp.asarray(q).astype(jnp.bfloat16), jnp.asarray(w),
          cache[0] if len(cache) == 1 else cache, *b.kernel_arrays())

