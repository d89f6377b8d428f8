"""The project's TPU helpers the kernel bodies share: a launch's name, the
one `pallas_call` setup (`pallas_launch`), the compiled-mode VMEM check
(M11), and TPU v4's code paths (M10, M15), decided at trace time from the
target chip (interpreted: the v5+ paths unless `force_v4_paths()`).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from streamidx import semantics
from streamidx.semantics import LANES, cdiv, mib


def launch_name(kind: str, case: str, bq_sz: int, bkv_p: int,
                outputs=()) -> str:
  """A launch's name, upstream's spelling for every body:
  "StreamIdx<kind>TC-<c>-bq_<bq>-bkvp_<p>" (c: d, p, m), or
  "StreamIdx<kind>PageTC-bq_<bq>-bkvp_<p>"; kind "" for the vendored body,
  else "Dense", "Lean", "Fp4"; then "-<name>" per extra output."""
  extra = "".join(f"-{o}" for o in outputs)
  if case == "page":
    return f"StreamIdx{kind}PageTC-bq_{bq_sz}-bkvp_{bkv_p}{extra}"
  return f"StreamIdx{kind}TC-{case[0]}-bq_{bq_sz}-bkvp_{bkv_p}{extra}"


def pair_scratch(q, weights, scores, values, scale_block, *, seq_batch_size,
                 bq_sz, bkv_p, page_size, page_mode, kv_slots=2):
  """The VMEM scratch of a launch over a two-array cache (values u8[pages,
  rows_per_page, 4, head_dim], scales): `semantics.launch_scratch`'s."""
  _, rows_per_page, kv_packing, head_dim = values.shape
  return list(semantics.launch_scratch(
      seq_batch_size=seq_batch_size, bq_sz=bq_sz, bkv_p=bkv_p,
      page_size_per_kv_packing=rows_per_page, kv_packing=kv_packing,
      lkv_dim=head_dim, cache_dtype=jnp.uint8, num_q_heads=q.shape[1],
      head_dim=head_dim, q_dtype=q.dtype, weights_dtype=weights.dtype,
      num_out_sublanes=(scores.shape[1] if page_mode
                        else bkv_p * page_size // LANES),
      scale_block=scale_block, kv_slots=kv_slots))


def pallas_launch(kernel, spec, *, name, scratch, num_sem_rows, prefetch,
                  start, end, num_sem_ids, num_bo_sz, inputs, outputs,
                  blocks=None, case=None, num_cores=1, num_sem_slots=2):
  """One launch of a kernel body (`spec` its `driver.Launch`): its
  `pallas_call`, made and called, with the setup every body shares:
  compiled, the VMEM check (M11); scratch `scratch` ((name, shape, dtype),
  ...) then DMA semaphores [num_sem_rows, num_sem_slots, B]; scalar prefetch
  `prefetch`, i32[2] (start, end), i32[num_sem_ids] zeros, i32[num_bo_sz]
  of -1; grid (end - start) // B programs (num_cores > 1: a leading
  "parallel" axis); operands `inputs` then `outputs` in HBM, output i
  aliased to `outputs[i]`. Returns the outputs (one array, or a tuple)."""
  b, interpret = spec.seq_batch_size, spec.interpret
  blocks = blocks or (f"num_kv_pages_per_block={spec.bkv_p}, query rows per "
                      f"block {spec.bq_sz}, {b} sequence(s) per program")
  if interpret is False:
    check_launch_vmem(scratch, case=case or name, blocks=blocks,
                      vmem_limit_bytes=spec.vmem_limit_bytes)
  scratch_shapes = [pltpu.VMEM(shape, dtype) for _, shape, dtype in scratch]
  scratch_shapes.append(pltpu.SemaphoreType.DMA((num_sem_rows, num_sem_slots,
                                                 b)))
  start, end = jnp.asarray(start, jnp.int32), jnp.asarray(end, jnp.int32)
  scalars = (*prefetch, jnp.stack([start, end]),
             jnp.zeros((num_sem_ids,), jnp.int32),
             jnp.full((num_bo_sz,), -1, jnp.int32))
  num_programs = (end - start) // b
  if num_cores == 1:
    grid, dims = (num_programs,), ("arbitrary",)
  else:
    grid = (num_cores, cdiv(num_programs, num_cores))
    dims = ("parallel", "arbitrary")
  hbm = pl.BlockSpec(memory_space=pltpu.HBM)
  out_shape = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outputs]
  first_out = len(scalars) + len(inputs)
  one = len(outputs) == 1
  fn = pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(scalars),
          in_specs=[hbm] * (len(inputs) + len(outputs)),
          out_specs=hbm if one else [hbm] * len(outputs),
          grid=grid, scratch_shapes=scratch_shapes),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=dims, vmem_limit_bytes=spec.vmem_limit_bytes,
          disable_bounds_checks=True),
      out_shape=out_shape[0] if one else tuple(out_shape),
      input_output_aliases={first_out + i: i for i in range(len(outputs))},
      name=name, interpret=interpret)
  return jax.named_scope(name)(fn)(*scalars, *inputs, *outputs)


# streamidx (M11): the compiled-mode VMEM check (the scratch comes
# from streamidx.semantics.launch_scratch).
def check_launch_vmem(scratch, *, case: str, blocks: str, vmem_limit_bytes):
  """streamidx (M11): compiled, a ValueError naming the blocks where the
  launch's tiled scratch exceeds the chip's VMEM or `vmem_limit_bytes`."""
  info = target_tpu_info()
  if info is None:  # a chip JAX's table does not know: the compiler judges
    return
  need = semantics.scratch_vmem_bytes(scratch, info.generation)
  capacity = int(info.vmem_capacity_bytes)
  limit = capacity if vmem_limit_bytes is None else min(int(vmem_limit_bytes),
                                                        capacity)
  if need <= limit:
    return
  name, shape, dtype = max(
      scratch,
      key=lambda s: semantics.tiled_vmem_bytes(s[1], s[2], info.generation))
  largest = semantics.tiled_vmem_bytes(shape, dtype, info.generation)
  limit_text = ("no vmem_limit_bytes" if vmem_limit_bytes is None else
                f"vmem_limit_bytes={vmem_limit_bytes} ({mib(vmem_limit_bytes)})")
  raise ValueError(
      f"num_kv_pages_per_block/num_queries_per_block: the {case} launch's "
      f"VMEM scratch must fit the {mib(capacity)} of VMEM per TensorCore of "
      f"TPU {info.chip_version} and {limit_text} (got {blocks}: "
      f"{mib(need)} of scratch, {mib(largest)} of it {name} "
      f"{shape} {jnp.dtype(dtype).name}); use smaller blocks")


def target_tpu_info():
  """`pltpu.get_tpu_info()` of the chip traced for, None if JAX lacks it."""
  try:
    return pltpu.get_tpu_info()
  except ValueError:
    return None


_FORCE_V4_PATHS = False


class force_v4_paths:
  """streamidx (M10, M15): trace the kernels with v4's code on any target
  (the interpreter then runs what TPU v4 compiles); entering and leaving
  clears JAX's caches."""

  def __enter__(self):
    global _FORCE_V4_PATHS
    self._prev, _FORCE_V4_PATHS = _FORCE_V4_PATHS, True
    jax.clear_caches()  # jitted entry points traced without it retrace
    return self

  def __exit__(self, *exc):
    global _FORCE_V4_PATHS
    _FORCE_V4_PATHS = self._prev
    jax.clear_caches()
    return False


# streamidx (M10): KV entries widened to bf16 and scored at a time on v4.
WIDEN_CHUNK = 1024


def widen_fp8_for_mxu(interpret) -> bool:
  """streamidx (M10): widen the e4m3 KV tile to bf16 for the matmul? True
  when compiled for a chip before TPU v5 (or `force_v4_paths`)."""
  return _compiled_before_v5(interpret)


def _compiled_before_v5(interpret) -> bool:
  """Whether the chip traced for is compiled and before v5 (or v4 forced)."""
  if _FORCE_V4_PATHS:
    return True
  if interpret is not False:
    return False
  info = target_tpu_info()
  return info is not None and info.generation < 5


def pool_by_lane_segments_for(cols_per_page: int, interpret) -> bool:
  """streamidx (M15): pool pages by lane segments? True when compiled for a
  chip before TPU v5 (or `force_v4_paths`); there a page must divide a
  128-lane row or be whole lane rows (a ValueError otherwise)."""
  if not _compiled_before_v5(interpret):
    return False
  if 128 % cols_per_page and cols_per_page % 128:
    raise ValueError(
        f"cache: page mode before TPU v5 pools pages whose size divides 128 "
        f"or is a multiple of 128 (M15: no lane split or sublane gather "
        f"there) (got page_size {cols_per_page})")
  return True


def pool_pages_by_lane_segments(s_summed, cols_per_page: int):
  """streamidx (M15): the page max-pool of one KV block without a lane split.

  s_summed: f32[rows, bkv] token scores, bkv = 128 pages x `cols_per_page`
  (a divisor or a multiple of 128). Viewed as [rows, cols_per_page, 128],
  lane segment j of lane row r holds page g*r + j (g = 128 //
  cols_per_page); the g segment-masked copies stacked along the
  second-minor axis, transposed, and max-reduced over sublanes (which lands
  in lanes: a lane reduction would need the sublane gather v4 lacks) pool
  each page. Returns f32[rows, 128] segment-major (column j * cols_per_page
  + r: page g*r + j; `unpermute_lane_segment_pages` restores page order).
  """
  rows, bkv = s_summed.shape
  assert bkv == 128 * cols_per_page
  if cols_per_page % 128 == 0:  # whole lane rows a page: their max first
    s_summed = s_summed.reshape(rows, 128, cols_per_page // 128, 128).max(
        axis=2).reshape(rows, 128 * 128)
    cols_per_page = 128  # one segment: the columns stay in page order
  assert 128 % cols_per_page == 0
  g = 128 // cols_per_page

  def pool(x):  # [r, bkv] -> [r, 128]
    x = x.reshape(x.shape[0], cols_per_page, 128)
    segment = lax.broadcasted_iota(jnp.int32, x.shape, 2) // cols_per_page
    stacked = jnp.concatenate(
        [jnp.where(segment == j, x, -jnp.inf) for j in range(g)], axis=1)
    return jnp.swapaxes(stacked, 1, 2).max(axis=1)

  # Eight query rows (one sublane tile) at a time: the stacked copy is then
  # 8 x 128 x 128 f32 (512 KiB) of VMEM, not rows / 8 times that.
  return jnp.concatenate(
      [pool(s_summed[r:r + 8]) for r in range(0, rows, 8)], axis=0)


def unpermute_lane_segment_pages(page_scores, cols_per_page: int):
  """streamidx (M15): segment-major page columns f32[T, n * 128] (as
  `pool_pages_by_lane_segments` wrote them) back to page order."""
  if cols_per_page % 128 == 0:  # one segment a block: already page order
    return page_scores
  t, n = page_scores.shape
  g = 128 // cols_per_page
  x = page_scores.reshape(t, n // 128, g, cols_per_page)
  return jnp.swapaxes(x, -1, -2).reshape(t, n)
