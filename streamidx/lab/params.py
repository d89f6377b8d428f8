"""Checking a notebook's parameters before anything runs.

Each notebook's first cell after its `parameters` cell is one call::

    from streamidx.lab.params import check_notebook
    check_notebook("03_fp8_packing", globals())

so that a papermill run with a bad `-p` value stops there, naming the
parameter and its rule (`ParameterError`). The rules of every notebook are
written below, one function per notebook in `NOTEBOOKS`, each a list of
checks on a `Parameters` view of the notebook's globals; every parameter the
notebook's `parameters` cell declares has a rule (tests/test_notebook_params.py
checks that, and that the default and CI parameters pass).

`check` holds the single-value checks the rules are made of::

    check.integer("num_seqs", num_seqs, min=1)
    check.choice("fmt", fmt, ("fp8", "bf16"))

On a TPU the same call also scales the notebook up (`tpu_scaling`): the
parameters `notebooks/tpu_parameters.json` gives TPU sizes for take them,
unless the run set them (papermill's injected values, or a value that is not
the notebook's default), the rules check the scaled values, and one printed
line names what was scaled, what was kept and the machine.
`STREAMIDX_TPU_SCALE=0` turns it off, `=1` turns it on off-TPU (to test it).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import numbers
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, MutableMapping

__all__ = ["ParameterError", "check", "Parameters", "NOTEBOOKS",
           "check_notebook", "rules", "TpuScaling", "tpu_scaling",
           "load_tpu_parameters", "TPU_PARAMETERS_FILE", "TPU_SCALE_ENV"]

LANES = 128  # a token-mode KV block is a whole number of 128-entry lane rows


class ParameterError(ValueError):
  """A notebook parameter breaks its rule."""


def _fail(name, rule, value):
  raise ParameterError(f"notebook parameter {name!r}: {rule} (got {value!r})")


class check:  # pylint: disable=invalid-name
  """Namespace of parameter checks; each returns the value it accepted."""

  @staticmethod
  def integer(name, value, *, min=None, max=None, multiple_of=None):  # pylint: disable=redefined-builtin
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      _fail(name, "must be an int", value)
    if min is not None and value < min:
      _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
      _fail(name, f"must be <= {max}", value)
    if multiple_of is not None and value % multiple_of:
      _fail(name, f"must be a multiple of {multiple_of}", value)
    return int(value)

  @staticmethod
  def number(name, value, *, min=None, max=None):  # pylint: disable=redefined-builtin
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      _fail(name, "must be a number", value)
    if min is not None and value < min:
      _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
      _fail(name, f"must be <= {max}", value)
    return value

  @staticmethod
  def choice(name, value, options: Iterable):
    options = tuple(options)
    if value not in options:
      _fail(name, f"must be one of {options}", value)
    return value

  @staticmethod
  def boolean(name, value):
    if not isinstance(value, bool):
      _fail(name, "must be True or False", value)
    return value

  @staticmethod
  def integers(name, values, *, min=None, max=None, nonempty=True):  # pylint: disable=redefined-builtin
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
      _fail(name, "must be a list of ints", values)
    values = list(values)
    if nonempty and not values:
      _fail(name, "must not be empty", values)
    for i, v in enumerate(values):
      check.integer(f"{name}[{i}]", v, min=min, max=max)
    return [int(v) for v in values]

  @staticmethod
  def string(name, value):
    if not isinstance(value, str) or not value:
      _fail(name, "must be a non-empty string", value)
    return value


class Parameters:
  """A notebook's parameters (its globals()), checked by name.

  Each method checks one parameter (the `check` rule of the same name, or a
  compound rule below), records it in `checked` and returns its value;
  `p[name]` reads a value for a rule that depends on it.
  """

  def __init__(self, namespace: Mapping, notebook: str):
    self.namespace = namespace
    self.notebook = notebook
    self.checked: list[str] = []

  def __getitem__(self, name):
    if name not in self.namespace:
      raise ParameterError(
          f"notebook parameter {name!r}: missing (the parameters cell of "
          f"{self.notebook} must assign it)")
    return self.namespace[name]

  def _mark(self, name):
    if name not in self.checked:
      self.checked.append(name)

  def _rule(self, fn, name, *args, **kw):
    value = fn(name, self[name], *args, **kw)
    self._mark(name)
    return value

  def integer(self, name, **kw):
    return self._rule(check.integer, name, **kw)

  def number(self, name, **kw):
    return self._rule(check.number, name, **kw)

  def choice(self, name, options):
    return self._rule(check.choice, name, options)

  def boolean(self, name):
    return self._rule(check.boolean, name)

  def integers(self, name, **kw):
    return self._rule(check.integers, name, **kw)

  def string(self, name):
    return self._rule(check.string, name)

  def choices(self, name, options):
    """A non-empty list, each item one of `options`."""
    values = self[name]
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
      _fail(name, f"must be a list of items of {tuple(options)}", values)
    values = list(values)
    if not values:
      _fail(name, "must not be empty", values)
    for i, v in enumerate(values):
      check.choice(f"{name}[{i}]", v, options)
    self._mark(name)
    return values

  def page_size(self, name="page_size"):
    """Entries per page: a multiple of 4 (FP8 packs 4 records per word)."""
    return self.integer(name, min=4, multiple_of=4)

  def pairs(self, name, *, min_q_len=0, nonempty=False):
    """A list of [q_len, seq_len] with min_q_len <= q_len <= seq_len."""
    pairs = self[name]
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
      _fail(name, "must be a list of [q_len, seq_len] pairs", pairs)
    pairs = list(pairs)
    if nonempty and not pairs:
      _fail(name, "must hold at least one [q_len, seq_len] pair", pairs)
    for i, pair in enumerate(pairs):
      values = check.integers(f"{name}[{i}]", pair, min=0)
      if len(values) != 2:
        _fail(f"{name}[{i}]", "must be [q_len, seq_len]", pair)
      q_len, seq_len = values
      check.integer(f"{name}[{i}] q_len", q_len, min=min_q_len, max=seq_len)
    self._mark(name)
    return [tuple(p) for p in pairs]

  def per_case(self, name, *, min=1):  # pylint: disable=redefined-builtin
    """Three ints, (decode, prefill, mixed), as the kernel takes block sizes."""
    values = check.integers(name, self[name], min=min)
    if len(values) != 3:
      check.integer(f"len({name})", len(values), min=3, max=3)
    self._mark(name)
    return values

  def per_case_or_table(self, name, *, lanes: bool = False):
    """None (the block-size table's row, `streamidx.block_sizes`, which the
    notebook looks up) or `per_case` (and `lane_blocks` with `lanes`)."""
    if self[name] is None:
      self._mark(name)
      return None
    values = self.per_case(name)
    if lanes:
      self.lane_blocks(name)
    return values

  def lane_blocks(self, name, page_size: str = "page_size"):
    """KV block sizes in pages (an int or a list) that make whole lane rows.

    A token-mode KV block of `bkv_p` pages holds page_size * bkv_p entries,
    which must be a multiple of 128 (checked after `page_size` itself).
    """
    ps = self[page_size]
    value = self[name]
    many = isinstance(value, (list, tuple))
    values = value if many else [value]
    step = LANES // math.gcd(ps, LANES)
    for i, v in enumerate(values):
      label = f"{name}[{i}]" if many else name
      check.integer(label, v, min=1)
      if (ps * v) % LANES:
        _fail(label, f"{page_size} * {name} must be a multiple of {LANES}, so "
              f"a multiple of {step} at {page_size} {ps}", v)
    self._mark(name)
    return value


# --------------------------------------------------------------------------
# The rules of each notebook
# --------------------------------------------------------------------------

NOTEBOOKS: dict[str, Callable[[Parameters], None]] = {}


def _rules(notebook: str):
  def register(fn):
    NOTEBOOKS[notebook] = fn
    return fn
  return register


@_rules("00_quickstart")
def _quickstart(p: Parameters):
  p.string("output_dir")
  p.choice("fmt", ("fp8", "bf16"))
  p.integer("compression_ratio", min=1)
  p.integer("num_heads", min=1)
  p.integer("k", min=1)
  p.page_size()
  p.integers("decode_seq_lens", min=1, nonempty=False)
  p.pairs("prefill")
  p.pairs("mixed")
  p.lane_blocks("num_kv_pages_per_block")
  p.integer("num_queries_per_block", min=1)
  p.integer("plot_row", min=-1)
  p.integer("seed")


@_rules("02_cache_layout")
def _cache_layout(p: Parameters):
  p.string("output_dir")
  p.page_size()
  ratio = p.integer("compression_ratio", min=1)
  p.integer("num_heads", min=1)
  decode = p.integers("decode_seq_lens", min=1, nonempty=False)
  prefill = p.pairs("prefill", nonempty=True)  # section 5 draws its first chunk
  mixed = p.pairs("mixed")
  p.integer("decode_req_batch_size", min=1)
  p.lane_blocks("num_kv_pages_per_block")
  p.integer("num_queries_per_block", min=1)
  seq_lens = decode + [s for _, s in prefill] + [s for _, s in mixed]
  b = p.integer("probe_seq", min=0, max=len(seq_lens) - 1)
  p.integer("probe_entry", min=0, max=seq_lens[b] // ratio - 1)
  p.integer("mask_window", min=1)
  p.integer("hbm_num_heads", min=1)
  p.integer("hbm_head_dim", min=128, multiple_of=128)
  p.integers("hbm_contexts", min=1)
  dsv4_page_size = p.integer("dsv4_page_size", min=4, multiple_of=4)
  p.integer("dsv4_batch", min=1)
  tokens = p.integer("dsv4_context_tokens", min=ratio * dsv4_page_size)
  p.integer("dsv4_k", min=1, max=tokens // ratio)
  p.integer("seed")


@_rules("03_fp8_packing")
def _fp8_packing(p: Parameters):
  p.string("output_dir")
  p.integer("num_heads", min=1)
  p.integer("compression_ratio", min=1)
  page_size = p.page_size()
  p.integer("query_tokens", min=1)
  contexts = p.integers("contexts", min=page_size)
  ks = p.integers("ks", min=1)
  entries = p.choice("headline_entries", contexts)
  p.integer("headline_k", min=1, max=entries)
  p.choice("headline_k", ks)
  p.integer("outlier_channels", min=1, max=128)
  p.number("outlier_scale", min=1)
  p.integer("num_records", min=16)
  p.integer("seed")
  p.integer("num_seeds", min=2)  # error bars need two seeds at least


@_rules("04_kernel_tiling")
def _kernel_tiling(p: Parameters):
  p.string("output_dir")
  p.choice("fmt", ("fp8", "bf16"))
  p.integer("num_heads", min=1)
  p.integer("head_dim", min=128, multiple_of=128)
  p.integer("compression_ratio", min=1)
  p.page_size()
  p.integer("k", min=1)
  p.per_case_or_table("num_kv_pages_per_block", lanes=True)
  p.per_case_or_table("num_queries_per_block")
  p.integer("decode_req_batch_size", min=1)
  p.integer("vmem_limit_bytes", min=1)
  p.integer("dsv4_batch", min=1)
  p.integer("dsv4_context_tokens", min=1)
  p.integers("decode_kv_block_choices", min=1)
  p.lane_blocks("decode_kv_block_choices")
  q_len = p.integer("prefill_q_len", min=1)
  p.integer("prefill_context_tokens", min=q_len)
  p.integers("prefill_q_block_choices", min=1)
  p.integers("prefill_kv_block_choices", min=1)
  p.lane_blocks("prefill_kv_block_choices")
  p.integer("mix_num_seqs", min=1)
  p.integer("mix_median_tokens", min=1)
  p.number("mix_sigma", min=0)
  low = p.integer("mix_min_tokens", min=1)
  p.integer("mix_max_tokens", min=low)
  p.integer("mix_trials", min=1)
  p.integers("mix_batch_sizes", min=1)
  p.integer("random_trials", min=1)
  p.integers("run_decode", min=1, nonempty=False)
  p.pairs("run_prefill")
  p.pairs("run_mixed")
  p.page_size("run_page_size")
  p.integer("run_num_heads", min=1)
  p.per_case("run_kv_blocks")
  p.lane_blocks("run_kv_blocks", page_size="run_page_size")
  p.per_case("run_q_blocks")
  p.integer("run_decode_batch", min=1)
  p.integer("seed")
  # Section 7: compiled for each generation (libtpu, no TPU).
  from streamidx import variants as variants_lib  # pylint: disable=g-import-not-at-top
  gens = ("v4", "v5e", "v5p", "v6e", "v7x")
  p.choices("aot_variants", tuple(variants_lib.VARIANTS))
  p.choices("aot_generations", gens)
  p.choices("aot_formats", ("fp8", "bf16", "dense_fp8"))
  p.integer("aot_jobs", min=1)
  p.choices("vmem_generations", gens)
  p.integers("vmem_decode_kv_pages", min=1)
  p.lane_blocks("vmem_decode_kv_pages")
  p.integers("vmem_prefill_q_blocks", min=1)
  p.choices("schedule_generations", gens)
  p.integers("schedule_kv_pages", min=1)
  p.lane_blocks("schedule_kv_pages")
  # Section 8: the variants' static schedules and the dense kernel's cores.
  p.choices("variant_generations", gens)
  p.choices("megacore_generations", gens)
  # Section 9: the top-k model.
  p.choices("topk_generations", gens)


@_rules("05_recall_parity")
def _recall_parity(p: Parameters):
  from streamidx import variants  # pylint: disable=g-import-not-at-top
  from streamidx.lab.studies import cases  # pylint: disable=g-import-not-at-top
  p.string("output_dir")
  p.integer("seed")
  p.choice("parity_scope", cases.SCOPES)
  if isinstance(p["race_variants"], (list, tuple)) and not p["race_variants"]:
    p._mark("race_variants")  # pylint: disable=protected-access  (none: no race run)
  else:
    p.choices("race_variants", tuple(variants.VARIANTS))
  p.integer("causal_ratio", min=2)  # at ratio 1 the two rules agree
  p.pairs("causal_prefill", min_q_len=2, nonempty=True)  # prefill chunks
  p.integer("causal_k", min=1)
  p.integer("causal_num_heads", min=1)
  entries = p.integers("long_entries", min=1)
  rows = p.integer("long_rows", min=1)
  ratio = p.integer("long_ratio", min=1)
  p.integer("num_heads", min=1)
  p.page_size("long_page_size")
  # Every row must see more than k entries: the last `long_rows` tokens of
  # the shortest sequence see at least entries - ceil(long_rows / ratio).
  p.integers("long_ks", min=1, max=min(entries) - -(-rows // ratio) - 1)
  p.boolean("long_kernel_check")
  page_entries = p.integer("page_entries", min=1)
  page_rows = p.integer("page_rows", min=1)
  sizes = p.integers("page_sizes", min=4)
  for i, ps in enumerate(sizes):
    check.integer(f"page_sizes[{i}]", ps, multiple_of=4)  # FP8 kv_packing
    check.integer(f"page_entries (page_sizes[{i}] = {ps})", page_entries,
                  multiple_of=ps)
  budgets = p.integers("page_budgets", min=1, max=page_entries - page_rows)
  for i, budget in enumerate(budgets):
    for ps in sizes:
      check.integer(f"page_budgets[{i}] (page size {ps})", budget,
                    multiple_of=ps)
  p.choice("quote_page_budget", budgets)
  p.choice("quote_page_size", sizes)


@_rules("06_tpu_profiling")
def _tpu_profiling(p: Parameters):
  p.string("output_dir")
  p.string("runs_glob")
  p.choices("modes", ("token", "page"))
  p.choice("fmt", ("fp8", "bf16"))
  ratio = p.integer("compression_ratio", min=1)
  p.integer("decode_req_batch_size", min=1)
  for prefix in ("tpu", "cpu"):
    p.integers(f"{prefix}_batch_sizes", min=1)
    p.integers(f"{prefix}_context_tokens", min=ratio)
    p.integer(f"{prefix}_num_heads", min=1)
    p.page_size(f"{prefix}_page_size")
    p.integer(f"{prefix}_k", min=1)
    p.per_case(f"{prefix}_kv_blocks")
    p.lane_blocks(f"{prefix}_kv_blocks", page_size=f"{prefix}_page_size")
    p.per_case(f"{prefix}_q_blocks")
    p.integer(f"{prefix}_page_q_block", min=1)
    p.integer(f"{prefix}_iterations", min=1)
  p.integer("warmup", min=1)
  p.boolean("check_results")
  p.integer("max_host_key_bytes", min=1)
  from streamidx import topk as topk_lib  # pylint: disable=g-import-not-at-top
  p.choices("tpu_topk_methods", topk_lib.TOPK_METHODS)
  p.choices("cpu_topk_methods", topk_lib.TOPK_METHODS)
  p.boolean("compare_sort_decode")
  p.choice("schedule_bound", ("tpu", "always", "never"))
  p.choice("model_generation", ("v4", "v5e", "v5p", "v6e", "v7x"))
  p.integer("seed")


@_rules("01_kernel_walkthrough")
def _kernel_walkthrough(p: Parameters):
  p.string("output_dir")
  p.integer("seed")
  p.choice("fmt", ("fp8", "bf16"))
  p.integer("compression_ratio", min=1)
  p.integer("num_heads", min=1)
  p.integer("k", min=1)
  p.page_size()
  p.lane_blocks("num_kv_pages_per_block")
  p.integer("num_queries_per_block", min=1)
  p.integer("decode_req_batch_size", min=1)
  p.integers("decode_seq_lens", min=1)  # steps 2-4 score the decode rows
  p.pairs("prefill", min_q_len=1)
  p.pairs("mixed", min_q_len=1)
  p.integer("exercise_batch", min=1)
  p.integer("exercise_context_tokens", min=4)


@_rules("07_multichip")
def _multichip(p: Parameters):
  from streamidx.lab.model import hardware  # pylint: disable=g-import-not-at-top
  from streamidx.lab import sharding  # pylint: disable=g-import-not-at-top
  p.string("output_dir")
  p.choice("fmt", ("fp8", "bf16"))
  p.integer("compression_ratio", min=1)
  p.integer("num_heads", min=1)
  p.integer("k", min=1)
  p.page_size()
  p.integer("pages_per_seq", min=1)
  decode = p.integers("decode_seq_lens", min=1, nonempty=False)
  prefill = p.pairs("prefill", min_q_len=1)
  mixed = p.pairs("mixed", min_q_len=1)
  ratio, ps, pps = (p["compression_ratio"], p["page_size"], p["pages_per_seq"])
  longest = max(decode + [s for _, s in prefill] + [s for _, s in mixed],
                default=0)
  if longest == 0:
    _fail("decode_seq_lens", "the batch needs at least one sequence",
          decode)
  if -(-(longest // ratio) // ps) > pps:
    _fail("pages_per_seq", f"must hold the longest sequence ({longest} "
          f"tokens = {-(-(longest // ratio) // ps)} pages of {ps})", pps)
  nd = p.integer("num_data", min=1)
  nc = p.integer("num_context", min=1)
  if nc & (nc - 1):
    _fail("num_context", "must be a power of two (the 2-D layout's tree "
          "merge)", nc)
  p.choices("run_layouts", ("sequence-parallel", "context-parallel", "2d"))
  p.choices("model_generations", hardware.GENERATIONS)
  p.integer("model_num_seqs", min=1)
  p.integer("model_context_tokens", min=4)
  p.integers("crossover_chips", min=1)
  lat = p["latencies_us"]
  if isinstance(lat, (str, bytes)) or not isinstance(lat, Iterable) or not (
      list(lat)):
    _fail("latencies_us", "must be a non-empty list of numbers", lat)
  for i, x in enumerate(lat):
    check.number(f"latencies_us[{i}]", x, min=0)
  p._mark("latencies_us")  # pylint: disable=protected-access
  runs = p["compile_runs"]
  if isinstance(runs, (str, bytes)) or not isinstance(runs, Iterable):
    _fail("compile_runs", "must be a list of [topology, layout]", runs)
  for i, run in enumerate(runs):
    if (isinstance(run, (str, bytes)) or not isinstance(run, Iterable)
        or len(list(run)) != 2):
      _fail(f"compile_runs[{i}]", "must be [topology, layout]", run)
    topo, layout = run
    check.choice(f"compile_runs[{i}] topology", topo,
                 tuple(sharding.TOPOLOGIES))
    check.choice(f"compile_runs[{i}] layout", layout, sharding.LAYOUTS)
  p._mark("compile_runs")  # pylint: disable=protected-access
  p.integer("seed")
  del nd


def _multichip_devices(namespace: Mapping) -> None:
  """07_multichip: virtual CPU devices for its meshes, asked for before the
  TPU scaling below starts JAX's backends (the count is fixed then)."""
  from streamidx.lab.studies import multichip  # pylint: disable=g-import-not-at-top
  nd, nc = namespace.get("num_data"), namespace.get("num_context")
  if all(isinstance(x, int) and not isinstance(x, bool) and x > 0
         for x in (nd, nc)):
    multichip.reserve_cpu_devices(nd * nc)


# What a notebook needs done before JAX starts a backend (the first thing
# `check_notebook` may do is ask JAX for it): notebook -> fn(namespace).
BEFORE_BACKEND: dict[str, Callable[[Mapping], None]] = {
    "07_multichip": _multichip_devices,
}


def check_notebook(notebook: str, namespace: MutableMapping) -> None:
  """Checks the parameters of `notebook` ("03_fp8_packing" or its file name)
  in `namespace` (the notebook's `globals()`) against its rules, after
  scaling them up on a TPU.

  Where `tpu_scaling` is on (a TPU, or STREAMIDX_TPU_SCALE=1), the TPU sizes
  it picks are checked with the rest and, if they pass, written into
  `namespace`; one line is printed: what was scaled from what to what, what
  was kept and why, and the machine. Off-TPU nothing changes and nothing is
  printed. Returns None (a notebook cell ends with this call).

  Raises:
    ParameterError: naming the first parameter that breaks its rule (and,
      when TPU sizes were applied, which ones and how to turn them off).
  """
  rule = rules(notebook)
  if _stem(notebook) in BEFORE_BACKEND:
    BEFORE_BACKEND[_stem(notebook)](namespace)
  scaling = tpu_scaling(_stem(notebook), namespace)
  if scaling is None or not scaling.values:
    rule(Parameters(namespace, notebook))
  else:
    try:
      rule(Parameters({**namespace, **scaling.values}, notebook))
    except ParameterError as e:
      raise ParameterError(
          f"{e} [with the TPU sizes of {', '.join(scaling.values)} from "
          f"{scaling.source}; {TPU_SCALE_ENV}=0 runs without them]") from None
    namespace.update(scaling.values)
  if scaling is not None:
    print(scaling.line())


def _stem(notebook: str) -> str:
  return notebook[:-len(".ipynb")] if notebook.endswith(".ipynb") else notebook


def rules(notebook: str) -> Callable[[Parameters], None]:
  """The rule function of `notebook` ("03_fp8_packing" or its file name)."""
  name = _stem(notebook)
  if name not in NOTEBOOKS:
    raise ValueError(f"notebook: no parameter rules for {notebook!r} (rules "
                     f"exist for {sorted(NOTEBOOKS)}; add them to "
                     "streamidx/lab/params.py)")
  return NOTEBOOKS[name]


# --------------------------------------------------------------------------
# Scaling up on a TPU
# --------------------------------------------------------------------------

TPU_PARAMETERS_FILE = "tpu_parameters.json"
TPU_SCALE_ENV = "STREAMIDX_TPU_SCALE"
# The first line of the cell papermill injects after `parameters`.
PAPERMILL_HEADER = "# Parameters"


@dataclasses.dataclass
class TpuScaling:
  """What `tpu_scaling` decided for one notebook run.

  values: name -> TPU value for the parameters to replace; replaced: name ->
  the value each had; kept: name -> why a parameter with TPU sizes keeps its
  value ("set by papermill", "set by hand: not the default ..."); at_tpu:
  parameters already at their TPU value; note: why nothing applies (no
  table found, no entry, or the entry's `why` when it scales nothing).
  """

  notebook: str
  reason: str  # why scaling is on: "the JAX backend is tpu" or the opt-in
  source: str | None = None  # the tpu_parameters.json read
  values: dict[str, Any] = dataclasses.field(default_factory=dict)
  replaced: dict[str, Any] = dataclasses.field(default_factory=dict)
  kept: dict[str, str] = dataclasses.field(default_factory=dict)
  at_tpu: list[str] = dataclasses.field(default_factory=list)
  note: str | None = None

  def line(self, machine: str | None = None) -> str:
    """The one line `check_notebook` prints (machine: describe_machine())."""
    if machine is None:
      from streamidx import modes  # pylint: disable=g-import-not-at-top
      machine = modes.describe_machine()
    head = f"TPU sizes for {self.notebook} ({self.reason}"
    if self.note is not None and not self.values:
      return f"{head}): none applied: {self.note}. Machine: {machine}"
    parts = [", ".join(f"{n} {self.replaced[n]!r} -> {v!r}"
                       for n, v in self.values.items()) or "none applied"]
    if self.kept:
      parts.append("kept as set: " + ", ".join(
          f"{n} ({why})" for n, why in self.kept.items()))
    if self.at_tpu:
      parts.append("already at TPU size: " + ", ".join(self.at_tpu))
    return f"{head}; {self.source}): {'; '.join(parts)}. Machine: {machine}"


def _scale_setting(environ: Mapping[str, str]) -> str:
  """"auto" (scale on a TPU), "on" or "off", from STREAMIDX_TPU_SCALE."""
  value = environ.get(TPU_SCALE_ENV, "").strip().lower()
  settings = {"": "auto", "auto": "auto", "1": "on", "0": "off"}
  if value not in settings:
    raise ValueError(f"{TPU_SCALE_ENV}: must be 0 (never scale), 1 (scale "
                     f"off-TPU too) or auto/unset (scale on a TPU) (got "
                     f"{environ[TPU_SCALE_ENV]!r})")
  return settings[value]


def tpu_parameters_paths() -> list[Path]:
  """Where `tpu_scaling` looks for tpu_parameters.json, in order: the
  working folder (a notebook's kernel runs in its folder: papermill, Jupyter,
  and Colab after the install cell), then this checkout's notebooks/."""
  here = Path.cwd() / TPU_PARAMETERS_FILE
  checkout = Path(__file__).resolve().parents[2] / "notebooks" / TPU_PARAMETERS_FILE
  return [here] if here == checkout else [here, checkout]


def load_tpu_parameters(path: str | os.PathLike) -> dict[str, dict]:
  """Reads tpu_parameters.json: {notebook file name: {"why": str,
  "parameters": {name: {"default": value, "tpu": value}}, "together":
  [[name, ...], ...]}} ("together" optional).

  "default" is the value the notebook's parameters cell assigns (a run whose
  value differs set it, and keeps it), "tpu" the value a TPU run takes;
  the names of a "together" group scale only all at once (one rule ties
  them, e.g. page_size and num_kv_pages_per_block): if the run set one, the
  others keep their values too.

  Raises:
    ValueError: naming the file and the entry that breaks this shape.
  """
  table = json.loads(Path(path).read_text(encoding="utf-8"))
  def bad(where, rule):
    raise ValueError(f"{path}: {where}: {rule}")
  if not isinstance(table, dict):
    bad("top level", "must be an object {notebook file name: entry}")
  for name, entry in table.items():
    if not name.endswith(".ipynb"):
      bad(name, "must be a notebook file name (NN_name.ipynb)")
    if (not isinstance(entry, dict)
        or not {"why", "parameters"} <= set(entry) <= {"why", "parameters", "together"}
        or not isinstance(entry["why"], str) or not entry["why"]
        or not isinstance(entry["parameters"], dict)):
      bad(name, 'must be {"why": "<why these sizes>", "parameters": {...}} '
          '(and optionally "together": [[names], ...])')
    for pname, spec in entry["parameters"].items():
      if not isinstance(spec, dict) or set(spec) != {"default", "tpu"}:
        bad(f"{name} {pname}", 'must be {"default": value, "tpu": value}')
    for group in entry.get("together", []):
      if (not isinstance(group, list) or len(group) < 2
          or not set(group) <= set(entry["parameters"])):
        bad(f"{name} together", "must be lists of two or more of its parameters "
            f"(got {group!r})")
  return table


def injected_parameters(namespace: Mapping) -> set[str]:
  """Names papermill injected into this kernel: assigned in an executed cell
  whose first line is papermill's "# Parameters" (IPython keeps every
  executed cell's source in the namespace's `In`); empty outside IPython."""
  history = namespace.get("In", namespace.get("_ih", ()))
  names: set[str] = set()
  for source in history if isinstance(history, (list, tuple)) else ():
    first_line = source.split("\n", 1)[0] if isinstance(source, str) else ""
    if first_line.strip() != PAPERMILL_HEADER:
      continue
    try:
      tree = ast.parse(source)
    except SyntaxError:
      continue
    for node in tree.body:
      if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
  return names


def _same(a, b) -> bool:
  """Equal as JSON values (tuples as lists; True is not 1, 20 is not 20.0)."""
  def plain(v):
    return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
  try:
    return json.dumps(plain(a), sort_keys=True) == json.dumps(plain(b), sort_keys=True)
  except (TypeError, ValueError):
    return False


def tpu_scaling(notebook: str, namespace: Mapping, *,
                table: Mapping[str, dict] | None = None,
                environ: Mapping[str, str] | None = None,
                backend: str | None = None) -> TpuScaling | None:
  """The TPU sizes of `notebook` for the run whose globals are `namespace`.

  On only where `jax.default_backend() == "tpu"` (`backend` overrides the
  lookup) or STREAMIDX_TPU_SCALE=1; never with STREAMIDX_TPU_SCALE=0 (None
  then, and off-TPU). A parameter with TPU sizes takes them only if its
  value is still the notebook's default as the table records it, papermill
  did not inject it, and no other parameter of its "together" group was
  set. So a value passed with -p is kept even when it equals the default,
  and one set by hand (in the parameters cell, or before the check) is kept
  even when the notebook file was saved with it: the recorded default does
  not move with the file.

  Args:
    notebook: "00_quickstart" (or its file name).
    namespace: the notebook's globals() (read only here).
    table: a loaded tpu_parameters.json; None: the first file of
      `tpu_parameters_paths()`.
    environ: for STREAMIDX_TPU_SCALE (default os.environ).
  """
  name = _stem(notebook)
  setting = _scale_setting(os.environ if environ is None else environ)
  if setting == "off":
    return None
  if backend is None:
    import jax  # pylint: disable=g-import-not-at-top
    backend = jax.default_backend()
  if setting == "auto" and backend != "tpu":
    return None
  reason = ("the JAX backend is tpu" if setting == "auto" else
            f"{TPU_SCALE_ENV}=1, JAX backend {backend}")
  source = "the given table"
  if table is None:
    found = [p for p in tpu_parameters_paths() if p.is_file()]
    if not found:
      return TpuScaling(name, reason, note=f"no {TPU_PARAMETERS_FILE} in "
                        + " or ".join(str(p.parent) for p in tpu_parameters_paths()))
    source, table = str(found[0]), load_tpu_parameters(found[0])
  entry = table.get(name + ".ipynb")
  if entry is None:
    return TpuScaling(name, reason, source,
                      note=f"{source} has no entry for {name}.ipynb")
  result = TpuScaling(name, reason, source)
  injected = injected_parameters(namespace)
  for pname, spec in entry["parameters"].items():
    if pname not in namespace:
      continue  # the rules name it as missing
    value = namespace[pname]
    if pname in injected:
      result.kept[pname] = "set by papermill"
    elif _same(value, spec["tpu"]):
      result.at_tpu.append(pname)
    elif not _same(value, spec["default"]):
      result.kept[pname] = f"set by hand: not the default {spec['default']!r}"
    else:
      result.values[pname] = json.loads(json.dumps(spec["tpu"]))  # a fresh copy
      result.replaced[pname] = value
  for group in entry.get("together", []):
    held = [n for n in group if n in result.kept]
    for pname in group:
      if held and pname in result.values:
        del result.values[pname]
        result.replaced.pop(pname)
        result.kept[pname] = f"with {held[0]}"
  if not entry["parameters"]:
    result.note = entry["why"]
  return result
