"""Helpers for the kernel walkthrough notebook: source excerpts, the change
ledger, score checks and Markdown output.

The walkthrough builds the StreamIndex kernel up from the reference in small
Pallas kernels whose bodies live in the notebook's cells (they are what it
teaches). What is not teaching material lives here, tested
(tests/test_walkthrough.py):

    excerpt(module, "outer.inner")   numbered source lines of a (nested)
                                     function, with the file's line numbers
    matching_lines(module, regex)    (line number, text) of matching lines
    ledger(module)                   the local-modification ledger (M1..Mn)
                                     parsed from the module header, with the
                                     lines that carry each `streamidx (M<n>)`
                                     marker
    check_scores(got, want, bound)   two score matrices agree: the same -inf
                                     pattern, finite values within 2 * bound
    ScoreChecks                      named checks that print and assert
    notebook_line_counts(path)       non-blank Markdown and code lines
    capture_races(fn)                runs fn under `streamidx.race_check()`,
                                     keeping the detector's printed reports
    compile_rows(kernels, gens)      compiles kernels for TPU generations
                                     (libtpu, no TPU): the compiler's verdict
    compile_summary(rows)            those verdicts in one sentence
    launch_rows, kv_page_dmas        the tiling model's launches as table rows
    block_size_rows                  decode launches at several bkv_p
    decode_step_cost                 bytes and bound of one decode step
    causal_rule_rows                 entries seen per position, both rules
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import json
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = [
    "Excerpt",
    "excerpt",
    "matching_lines",
    "LedgerEntry",
    "ledger",
    "ScoreCheck",
    "check_scores",
    "ScoreChecks",
    "notebook_line_counts",
    "RaceRun",
    "capture_races",
    "compile_rows",
    "compile_summary",
    "kv_page_dmas",
    "launch_rows",
    "block_size_rows",
    "decode_step_cost",
    "causal_rule_rows",
]


def _module_path(module) -> str:
  """The module's file relative to the package root's parent
  (`streamidx/kernels/vendored.py`), or its absolute path."""
  path = Path(inspect.getsourcefile(module)).resolve()
  top = module.__name__.split(".")[0]
  for parent in path.parents:
    if parent.name == top:
      return str(path.relative_to(parent.parent))
  return str(path)


@dataclasses.dataclass(frozen=True)
class Excerpt:
  """Lines `first..last` (1-based, inclusive) of `path`."""

  path: str
  name: str
  first: int
  last: int
  lines: tuple[str, ...]

  def __str__(self) -> str:
    width = len(str(self.last))
    head = f"# {self.path}, lines {self.first}-{self.last}: {self.name}"
    body = [f"{n:>{width}} | {line}"
            for n, line in zip(range(self.first, self.last + 1), self.lines)]
    return "\n".join([head, *body])

  @property
  def where(self) -> str:
    """`path:first-last`, for prose."""
    return f"{self.path}:{self.first}-{self.last}"


def _find_def(tree: ast.AST, qualname: str) -> ast.AST:
  node = tree
  for part in qualname.split("."):
    found = None
    for child in ast.walk(node):
      if (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)) and child.name == part
          and child is not node):
        found = child
        break
    if found is None:
      raise ValueError(f"qualname: no definition {part!r} in {qualname!r}")
    node = found
  return node


def excerpt(module, qualname: str, *, start: str | None = None,
            stop: str | None = None) -> Excerpt:
  """The source of function (or class) `qualname` of `module`, numbered.

  Args:
    module: a module object, e.g. `streamidx.kernels.vendored`.
    qualname: dotted path through nested definitions, e.g.
      "_scores_kernel._fetch_bkv" (a function defined inside another, which
      `inspect.getsource` cannot reach).
    start, stop: optional substrings; the excerpt then runs from the first
      line of the definition containing `start` to the first line after it
      containing `stop` (both included).

  Line numbers are the file's, decorators included.
  """
  source = inspect.getsource(module)
  lines = source.splitlines()
  node = _find_def(ast.parse(source), qualname)
  first = min([node.lineno] + [d.lineno for d in
                               getattr(node, "decorator_list", [])])
  last = node.end_lineno
  if start is not None:
    hits = [n for n in range(first, last + 1) if start in lines[n - 1]]
    if not hits:
      raise ValueError(f"start: {start!r} not in {qualname}")
    first = hits[0]
  if stop is not None:
    hits = [n for n in range(first, last + 1) if stop in lines[n - 1]]
    if not hits:
      raise ValueError(f"stop: {stop!r} not in {qualname} after line {first}")
    last = hits[0]
  return Excerpt(_module_path(module), qualname, first, last,
                 tuple(lines[first - 1:last]))


def matching_lines(module, pattern: str) -> list[tuple[int, str]]:
  """(1-based line number, stripped text) of every line matching `pattern`."""
  rx = re.compile(pattern)
  return [(n, line.strip()) for n, line in
          enumerate(inspect.getsource(module).splitlines(), start=1)
          if rx.search(line)]


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
  """One local modification: its tag (M3), first sentence and full text,
  and the lines of the module marked `# streamidx (M3...)`."""

  tag: str
  title: str
  text: str
  marker_lines: tuple[int, ...]


_ENTRY = re.compile(r"^# (M\d+)\s+(.*)$")
_CONTINUATION = re.compile(r"^#\s{2,}(\S.*)$")
_MARKER = re.compile(r"streamidx \(((?:M\d+)(?:,\s*M\d+)*)\)")


def ledger(module) -> list[LedgerEntry]:
  """The `M<n>` ledger in the header comment of `module`, in order.

  An entry starts with a line `# M<n>  text` and continues over the
  following comment lines indented by at least two spaces. Marker lines are
  those carrying `streamidx (M<n>)` or `streamidx (M<a>, M<n>)`, outside
  the header. Raises ValueError if the header has no entry.
  """
  lines = inspect.getsource(module).splitlines()
  entries: list[list[str]] = []
  header_end = 0
  for n, line in enumerate(lines):
    if not line.startswith("#"):
      header_end = n
      break
    m = _ENTRY.match(line)
    if m:
      entries.append([m.group(1), m.group(2)])
      continue
    c = _CONTINUATION.match(line)
    if c and entries:
      entries[-1].append(c.group(1))
    elif entries and line.strip("# -"):
      entries[-1].append(None)  # a comment line that is not a continuation
  if not entries:
    raise ValueError(f"{module.__name__}: no M<n> ledger in its header")
  markers: dict[str, list[int]] = {}
  for n, line in enumerate(lines[header_end:], start=header_end + 1):
    for group in _MARKER.findall(line):
      for tag in re.findall(r"M\d+", group):
        markers.setdefault(tag, []).append(n)
  out = []
  for tag, *parts in entries:
    if None in parts:
      parts = parts[:parts.index(None)]
    text = " ".join(parts)
    title = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    out.append(LedgerEntry(tag, title, text, tuple(markers.get(tag, ()))))
  return out


@dataclasses.dataclass(frozen=True)
class ScoreCheck:
  """How two f32 score matrices of the same rows compare.

  same_mask: both are -inf at exactly the same places (masked entries).
  max_diff: the largest |got - want| over the finite entries.
  max_ratio: the largest |got - want| / (2 * bound[row]) (<= 1 passes).
  """

  rows: int
  cols: int
  same_mask: bool
  max_diff: float
  max_ratio: float
  visible: int

  @property
  def ok(self) -> bool:
    return self.same_mask and self.max_ratio <= 1.0

  def summary(self) -> str:
    return (f"{self.rows} rows x {self.cols} entries: "
            f"{'same' if self.same_mask else 'DIFFERENT'} -inf pattern "
            f"({self.visible} visible), max |diff| {self.max_diff:.3g} "
            f"= {self.max_ratio:.3g} x the allowed 2 x summation bound")


def check_scores(got, want, bound) -> ScoreCheck:
  """Compares kernel scores with reference scores, within the derived bound.

  Args:
    got: f32[R, >= C] scores from a kernel (columns past C are ignored).
    want: f32[R, C] reference scores (`streamidx.token_scores` rows), -inf
      where an entry is not visible.
    bound: f64[R], per row the bound `metrics.summation_error_bound` gives
      on each side's distance to the exact score; two correct f32
      evaluations differ by at most 2 * bound.
  """
  want = np.asarray(want, np.float64)
  got = np.asarray(got, np.float64)
  if got.ndim != 2 or want.ndim != 2 or got.shape[0] != want.shape[0]:
    raise ValueError(f"got, want: must be [rows, cols] with the same rows "
                     f"(got {got.shape} and {want.shape})")
  if got.shape[1] < want.shape[1]:
    raise ValueError(f"got: fewer columns than want ({got.shape[1]} < "
                     f"{want.shape[1]})")
  got = got[:, :want.shape[1]]
  bound = np.broadcast_to(np.asarray(bound, np.float64), (want.shape[0],))
  masked_got, masked_want = np.isneginf(got), np.isneginf(want)
  same_mask = bool(np.array_equal(masked_got, masked_want)
                   and not np.isnan(got).any())
  both = ~masked_got & ~masked_want & np.isfinite(got)
  diff = np.abs(np.where(both, got, 0.0) - np.where(both, want, 0.0))
  allowed = 2.0 * bound[:, None]
  ratio = np.where(both, diff / np.where(allowed > 0, allowed, np.inf), 0.0)
  ratio = np.where(both & (allowed == 0) & (diff > 0), np.inf, ratio)
  return ScoreCheck(rows=int(want.shape[0]), cols=int(want.shape[1]),
                    same_mask=same_mask, max_diff=float(diff.max(initial=0)),
                    max_ratio=float(ratio.max(initial=0)),
                    visible=int((~masked_want).sum()))


class ScoreChecks(dict):
  """name -> ScoreCheck, in the order added.

  `add` compares like `check_scores`, prints one line, and raises
  AssertionError (stopping a notebook) when the check fails.
  """

  def add(self, name: str, got, want, bound) -> None:
    c = check_scores(got, want, bound)
    self[name] = c
    print(f"{name}: {c.summary()}")
    if not c.ok:
      raise AssertionError(f"{name}: {c.summary()}")


def notebook_line_counts(path) -> dict[str, int]:
  """Non-blank source lines of a notebook's Markdown and code cells."""
  nb = json.loads(Path(path).read_text(encoding="utf-8"))
  counts = {"markdown": 0, "code": 0}
  for cell in nb["cells"]:
    if cell["cell_type"] not in counts:
      continue
    src = cell["source"]
    src = "".join(src) if isinstance(src, list) else src
    counts[cell["cell_type"]] += sum(1 for l in src.splitlines() if l.strip())
  return counts


@dataclasses.dataclass
class RaceRun:
  """What `capture_races` saw: the result, the race report, the messages."""

  result: Any
  report: Any  # streamidx.modes.RaceReport
  messages: list[str]

  @property
  def races_found(self) -> bool:
    return self.report.races_found


def capture_races(fn: Callable[[], Any], **options) -> RaceRun:
  """Runs `fn()` under `streamidx.race_check(**options)`, result waited for.

  The detector prints one "RACE DETECTED" block per race it sees; they are
  kept in `messages` (one string per block) instead of flooding the output.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from streamidx import modes  # pylint: disable=g-import-not-at-top

  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    with modes.race_check(**options) as report:
      result = jax.block_until_ready(fn())
  text = buf.getvalue()
  blocks = [b.strip() for b in re.split(r"(?=RACE DETECTED)", text)
            if b.strip().startswith("RACE DETECTED")]
  return RaceRun(result, report, blocks)


def compile_rows(kernels: dict[str, tuple[Callable, tuple]],
                 generations: Sequence[str]) -> list[dict]:
  """Compiles each kernel for each TPU generation; one table row per kernel.

  Args:
    kernels: name -> (fn, args). `fn(*args)` must trace its `pallas_call`s
      compiled (`interpret=False`, or left to `streamidx.resolve_interpret`);
      `args` are arrays (or `ShapeDtypeStruct`s) made before the call: inside
      `compile_for` nothing can be computed on the compile-only device.
    generations: "v4" .. "v7x" (`streamidx.modes.TOPOLOGIES`), compiled
      without a TPU through `streamidx.compile_for` (needs libtpu), or
      "local": the default device, a TPU.

  Returns rows `{"kernel": name, <generation>: verdict, ...}`, the verdict
  "compiles (Mosaic)" when the compiled program holds the Mosaic kernel (a
  `tpu_custom_call`), "compiles, but no Mosaic kernel" when it does not (the
  kernel was traced interpreted), else "fails: " and the compiler's error in
  one line (`streamidx.lab.aot.summarize_error`). A failure does not raise.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from streamidx import modes  # pylint: disable=g-import-not-at-top
  from streamidx.lab import aot  # pylint: disable=g-import-not-at-top

  def verdict(fn, args, generation):
    try:
      if generation == "local":
        compiled = jax.jit(fn).lower(*args).compile()
      else:
        with modes.compile_for(generation) as target:
          compiled = jax.jit(fn).lower(*target.specs(args)).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's error is the result
      return f"fails: {aot.summarize_error(e)}"
    if "tpu_custom_call" in compiled.as_text():
      return "compiles (Mosaic)"
    return "compiles, but no Mosaic kernel"

  return [{"kernel": name, **{g: verdict(fn, args, g) for g in generations}}
          for name, (fn, args) in kernels.items()]


def compile_summary(rows: Sequence[dict]) -> str:
  """One sentence over `compile_rows`-style rows: how many kernel x
  generation compiles the compiler accepted, and each rejection with its
  error. "skipped: ..." cells are quoted once; other cells (a generation a
  kernel was not compiled for) are not counted."""
  accepted, rejected, other = [], [], []
  for row in rows:
    for gen, v in row.items():
      if gen == "kernel":
        continue
      kind = (accepted if v.startswith("compiles (Mosaic)") else
              rejected if v.startswith(("fails", "compiles, but")) else
              other if v.startswith("skipped") else None)
      if kind is not None:
        kind.append((row["kernel"], gen, v))
  parts = []
  if accepted or rejected:
    parts.append(f"{len(accepted)} of {len(accepted) + len(rejected)} kernel x "
                 "generation compiles accepted by the TPU compiler")
  parts += [f"{k} on {g}: {v}" for k, g, v in rejected]
  parts += sorted({v for _, _, v in other})
  return "; ".join(parts) if parts else "nothing compiled"


# ---------------------------------------------------------------------------
# Tables of the tiling model, for the notebook's section 6 and its exercises.


def kv_page_dmas(launch) -> int:
  """KV page DMAs one `tiling.Launch` starts: bkv_p per sequence per step."""
  return (sum(pr.num_bq * pr.num_bkv for pr in launch.programs)
          * launch.seq_batch_size * launch.bkv_p)


def launch_rows(plan) -> list[dict]:
  """One row per launch of a `tiling.plan`: its sequences, programs, block
  sizes, steps, KV page DMAs and VMEM scratch (KiB, logical shapes)."""
  return [dict(launch=l.case, sequences=f"[{l.start_seq}, {l.end_seq})",
               programs=l.grid, bq=l.bq_sz, bkv_p=l.bkv_p, steps=l.num_steps,
               kv_page_dmas=kv_page_dmas(l),
               vmem_scratch_kib=round(l.vmem_bytes / 1024, 1))
          for l in plan.launches]


def block_size_rows(batch, bkv_ps: Sequence[int], *, fmt: str, num_heads: int,
                    num_kv_pages_per_block: int, num_queries_per_block: int,
                    decode_req_batch_size: int) -> list[dict]:
  """The decode launches of `batch` at each decode block size `bkv_p`.

  The prefill and mixed launches keep `num_kv_pages_per_block`. A bkv_p whose
  block is not a multiple of 128 entries (the kernel refuses it) is skipped.
  Per row: bkv_p, entries per block, decode steps, KV KiB read, the share of
  the entries read that belong to the sequences (`tiling.block_waste`), and
  the KV double buffer's VMEM (KiB).
  """
  from streamidx.lab.model import tiling  # pylint: disable=g-import-not-at-top

  rows = []
  for bkv_p in bkv_ps:
    if batch.page_size * bkv_p % 128:
      continue
    p = tiling.plan(batch, fmt=fmt, num_heads=num_heads,
                    num_kv_pages_per_block=(bkv_p, num_kv_pages_per_block,
                                            num_kv_pages_per_block),
                    num_queries_per_block=(1, num_queries_per_block,
                                           num_queries_per_block),
                    decode_req_batch_size=decode_req_batch_size)
    dec = [l for l in p.launches if l.case in ("decode", "decode_rest")]
    with_programs = [l for l in dec if l.grid] or dec
    rows.append(dict(
        bkv_p=bkv_p, bkv_entries=bkv_p * batch.page_size,
        decode_steps=sum(l.num_steps for l in dec),
        kv_kib_read=sum(kv_page_dmas(l) for l in dec) * p.geometry.page_bytes
        / 1024,
        entries_used=f"{tiling.block_waste(p)['entry_efficiency']:.0%}",
        kv_buffer_kib=max(tiling.scratch_bytes(l.scratch)["bkv_x2"]
                          for l in with_programs) / 1024))
  return rows


def decode_step_cost(batch_size: int, context_tokens: int, *,
                     generation: str = "v6e", fmt: str = "fp8",
                     num_heads: int = 64, page_size: int = 128,
                     compression_ratio: int = 4, k: int = 512) -> dict:
  """HBM bytes and the roofline bound of one decode step of the real kernel.

  `batch_size` decode sequences of `context_tokens` tokens, block sizes from
  the block-size table (`streamidx.block_sizes`) for `generation`. Returns
  entries per sequence, the cache bytes the sequences hold, the KV bytes the
  kernel reads (whole KV blocks), the f32 score bytes it writes, the bytes
  the cache would hold with the scales kept apart (129 B per entry, layout
  "fp8_e8m0_scale_apart"), the kernel's FLOPs per byte, the generation's
  ridge point, and the kernel-stage and whole-call bounds (seconds).
  """
  from streamidx import batch as batch_lib  # pylint: disable=g-import-not-at-top
  from streamidx import variants  # pylint: disable=g-import-not-at-top
  from streamidx.lab.model import hardware, roofline, tiling  # pylint: disable=g-import-not-at-top
  from streamidx.lab.studies import formats  # pylint: disable=g-import-not-at-top

  b = batch_lib.make_mixed_batch(decode=[context_tokens] * batch_size,
                                 page_size=page_size,
                                 compression_ratio=compression_ratio)
  row = variants.block_sizes("vendored", cache_format=fmt,
                             num_heads=num_heads, page_size=page_size,
                             generation=generation)
  p = tiling.plan(b, fmt=fmt, num_heads=num_heads, **row.kwargs())
  kernel = {c.name: c for c in roofline.costs(p, k=k)}["kernel"]
  bound = roofline.predict(p, k=k, generations=[generation])[generation]
  entries = context_tokens // compression_ratio
  return dict(
      entries=entries, bkv_p=p.launches[0].bkv_p,
      cache_bytes=batch_size * entries * p.geometry.record_bytes,
      kv_bytes_read=kernel.bytes_read["kv_cache"],
      score_bytes=kernel.bytes_written["scores"],
      scale_apart_bytes=batch_size * entries
      * formats.bytes_per_entry("fp8_e8m0_scale_apart"),
      intensity=kernel.intensity,
      ridge=hardware.spec(generation).ridge_point(),
      kernel_s=bound["kernel"], call_s=bound["total"])


def causal_rule_rows(compression_ratio: int, positions) -> list[dict]:
  """Per absolute position p: the entries each causal rule lets the query
  see, and whether the vendored ("seed") rule sees more."""
  from streamidx import semantics  # pylint: disable=g-import-not-at-top

  def seen(n):
    return f"0..{n - 1}" if n else "none"

  rows = []
  for p in positions:
    seed = int(semantics.causal_visible_bound(int(p), compression_ratio, "seed"))
    model = int(semantics.causal_visible_bound(int(p), compression_ratio,
                                               "model"))
    rows.append(dict(p=int(p), seen_vendored=seen(seed), seen_model=seen(model),
                     leaks=seed > model))
  return rows
