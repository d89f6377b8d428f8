"""Named shapes, in one module: the indexer geometries (`DSV4`, `GLM_PAGE`,
`GLM_TOKEN`), the batches the benchmark and the models name (`Shape`), and
the static call shapes the compile matrix compiles (`CallShape`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from streamidx import semantics
from streamidx import variants as variants_lib


@dataclasses.dataclass(frozen=True)
class Indexer:
  """An indexer's geometry: index heads, head_dim, compression ratio (tokens
  per entry) and entries per cache page."""

  num_heads: int
  head_dim: int
  compression_ratio: int
  page_size: int


# DeepSeek-V4's lightning indexer as tpu-inference serves it; GLM's page mode.
DSV4 = Indexer(num_heads=64, head_dim=128, compression_ratio=4, page_size=128)
GLM_PAGE = Indexer(num_heads=32, head_dim=128, compression_ratio=1,
                   page_size=64)
# GLM-5.2's token-mode decode as sglang-jax #1642 measured it (page size not
# stated there: GLM_PAGE's assumed).
GLM_TOKEN = GLM_PAGE


@dataclasses.dataclass(frozen=True)
class Shape:
  """One batch: `num_seqs` decode sequences of `seq_len` tokens (`q_len`
  query rows each), or one prefill sequence whose last `q_len` tokens query;
  k kept; DeepSeek-V4's geometry and FP8 by default."""

  name: str
  kind: str  # "decode" or "prefill"
  num_seqs: int
  q_len: int
  seq_len: int
  k: int
  num_heads: int = DSV4.num_heads
  head_dim: int = DSV4.head_dim
  compression_ratio: int = DSV4.compression_ratio
  page_size: int = DSV4.page_size
  fmt: str = "fp8"

  entries_per_seq = property(lambda s: s.seq_len // s.compression_ratio)
  entries = entries_per_seq  # the score buffer's columns
  num_tokens = property(lambda s: s.num_seqs * s.q_len)
  rows = num_tokens  # the score buffer's rows
  pages = property(lambda s: max(1, semantics.cdiv(s.entries, s.page_size)))
  pages_per_seq = pages  # `batch()`'s, as `CallShape` names it
  decode_q_len = 1  # `batch()`'s decode sequences query one row each

  def with_(self, **kw) -> "Shape":
    return dataclasses.replace(self, **kw)

  def batch(self):
    """The `RaggedBatch` (contiguous pages) this shape describes."""
    from streamidx import batch as batch_lib  # pylint: disable=g-import-not-at-top
    ranges = ({"decode": [self.seq_len] * self.num_seqs}
              if self.kind == "decode"
              else {"prefill": [(self.q_len, self.seq_len)]})
    return batch_lib.make_mixed_batch(
        **ranges, page_size=self.page_size,
        compression_ratio=self.compression_ratio)

  def visible_pairs(self) -> int:
    """(query row, entry) pairs visible under the model rule."""
    pos = self.seq_len - self.q_len + np.arange(self.q_len)
    bound = semantics.causal_visible_bound(pos, self.compression_ratio, "model")
    return self.num_seqs * int(np.minimum(bound, self.entries_per_seq).sum())

  def flops(self) -> int:
    """q.k dot products of the visible pairs (2 per multiply-add)."""
    return 2 * self.visible_pairs() * self.num_heads * self.head_dim

  def kernel_kwargs(self) -> dict:
    """The static arguments every implementation takes: k and the ratio."""
    return dict(k=self.k, compression_ratio=self.compression_ratio)

  def describe(self) -> str:
    rows = (f"decode {self.num_seqs} seqs x" if self.kind == "decode"
            else f"prefill {self.q_len} queries at")
    return (f"{rows} {self.seq_len} tokens ({self.entries_per_seq} entries), "
            f"k {self.k}")


def table_blocks(shape, variant: str, fmt: str, generation: str | None = None):
  """The block-size table's row (`streamidx.blocks.BlockSizes`) for `variant` in cache
  format `fmt` at `shape` (a `Shape` or a `CallShape`: its heads, head_dim, page size,
  pages per sequence and decode rows); generation None: the chip the call runs on."""
  v = variants_lib.get(variant)
  return v.block_sizes(
      cache_format=fmt, num_heads=shape.num_heads, page_size=shape.page_size,
      generation=generation, decode_q_len=shape.decode_q_len if v.mode == "token" else 1,
      head_dim=shape.head_dim, pages_per_seq=shape.pages_per_seq)


# The benchmark's default sweep and CI's.
SWEEP = [
    Shape("decode_8x16K_k512", "decode", 8, 1, 16384, 512),
    Shape("decode_32x16K_k512", "decode", 32, 1, 16384, 512),
    Shape("decode_8x64K_k2048", "decode", 8, 1, 65536, 2048),
    Shape("prefill_128q_16K_k512", "prefill", 1, 128, 16384, 512),
    Shape("prefill_512q_32K_k2048", "prefill", 1, 512, 32768, 2048),
]
QUICK = [
    Shape("decode_4x4K_k512", "decode", 4, 1, 4096, 512),
    Shape("prefill_32q_2K_k256", "prefill", 1, 32, 2048, 256),
]


def parse_shape(text: str) -> Shape:
  """The benchmark's `--shapes` item: 'decode:SEQSxSEQ_LEN:K', 'prefill:QxSEQ_LEN:K' or
  a `SWEEP` or `QUICK` name."""
  named = {s.name: s for s in SWEEP + QUICK}
  if text in named:
    return named[text]
  try:
    kind, dims, k = text.split(":")
    a, seq_len = (int(x) for x in dims.lower().split("x"))
    seqs, q_len = {"decode": (a, 1), "prefill": (1, a)}[kind]
    shape = Shape(text, kind, seqs, q_len, seq_len, int(k))
  except (ValueError, KeyError):
    shape = None
  if shape is None or min(a, seq_len, shape.k) < 1:
    raise ValueError(
        f"--shapes: {text!r} is neither a named shape ({sorted(named)}) nor "
        "'decode:SEQSxSEQ_LEN:K' / 'prefill:QxSEQ_LEN:K' with positive sizes")
  return shape


# DeepSeek-V4's decode step (k 512) at 1M and 128K tokens: the selection's
# timing shapes (`bench --topk`); the first is the scaling model's.
DSV4_DECODE_1M = Shape("dsv4 decode B=64 1M", "decode", 64, 1, 2**20, 512)
DSV4_DECODE_128K = Shape("dsv4 decode B=64 128K", "decode", 64, 1, 2**17, 512)


@dataclasses.dataclass(frozen=True)
class CallShape:
  """The static shapes of one call: all a compile depends on."""

  name: str
  mode: str  # "token" or "page"
  num_tokens: int  # rows of q
  max_num_seqs: int
  pages_per_seq: int
  page_size: int  # entries per page
  num_heads: int
  head_dim: int
  k: int  # k (token) or k_pages (page)
  compression_ratio: int
  note: str = ""
  decode_q_len: int = 1  # query rows per decode sequence (M17)

  total_pages = property(lambda self: self.max_num_seqs * self.pages_per_seq)


def _token(name, num_tokens, seqs, tokens, k, note, decode_q_len=1, g=DSV4):
  """A token-mode call shape of indexer `g` (DeepSeek-V4's by default):
  `seqs` slots of `tokens` tokens of cache."""
  return CallShape(name, "token", num_tokens, seqs,
                   tokens // g.compression_ratio // g.page_size, g.page_size,
                   g.num_heads, g.head_dim, k, g.compression_ratio, note,
                   decode_q_len)


def _page(name, g, note, *, num_tokens=4096, seqs=2, tokens=65536,
          budget=2048):
  """A page-mode call shape of indexer `g` (ratio 1): `seqs` slots of
  `tokens` tokens, k_pages the pages of a `budget`-token budget."""
  return CallShape(name, "page", num_tokens, seqs, tokens // g.page_size,
                   g.page_size, g.num_heads, g.head_dim,
                   budget // g.page_size, g.compression_ratio, note)


def _decode(name, seqs, tokens, k, note, decode_q_len=1, g=DSV4):
  return _token(name, seqs * decode_q_len, seqs, tokens, k, note,
                decode_q_len, g)


# The compile matrix's shapes (`lab.aot`): DeepSeek-V4's indexer, GLM-5.2's
# token-mode decode (`lab.calibration`'s launch records), README's batch,
# GLM's page mode and page mode at DeepSeek-V4's 64 heads and 128-entry pages.
README = Indexer(num_heads=16, head_dim=128, compression_ratio=4, page_size=16)
PAGE_64_HEADS = Indexer(num_heads=DSV4.num_heads, head_dim=DSV4.head_dim,
                        compression_ratio=1, page_size=DSV4.page_size)
COMPILE: tuple[CallShape, ...] = (
    _decode("dsv4-decode-4k", 64, 4096, 512, "64 decode seqs x 4K tokens"),
    _decode("dsv4-decode-32k", 64, 32768, 512, "64 decode seqs x 32K tokens"),
    _decode("dsv4-decode-128k", 64, 131072, 2048,
            "64 decode seqs x 128K tokens, k 2048"),
    # Speculative decoding (M17): one draft token, 2 query rows a sequence;
    # compiled with decode_q_len 1 instead, the same batch is all mixed.
    _decode("dsv4-mtp2-decode-4k", 64, 4096, 512,
            "64 decode seqs x 4K tokens x 2 query rows (MTP, gamma = 1)", 2),
    _token("dsv4-mixed", 32 + 4 * 1024, 36, 32768, 512,
          "32 decode seqs + 4 prefill chunks of 1024 tokens, 32K context"),
    _decode("glm-decode-4k", 64, 4096, 2048,
            "GLM-5.2 token mode: 64 decode seqs x 4K tokens, k 2048",
            g=GLM_TOKEN),
    # README's quickstart: decode [900, 2048], prefill (24, 700), mixed
    # (12, 400): 38 query rows, 4 slots, 2048 tokens = 32 pages of 16.
    _token("readme-quickstart", 2 + 24 + 12, 4, 2048, 32,
           "README's batch: 16 heads, 16-entry pages, k 32", g=README),
    _page("glm-page-prefill", GLM_PAGE,
          "2 seqs x 64K tokens, 4096 query rows, 2048-token budget "
          "(32 pages)"),
    _page("page-64h-prefill", PAGE_64_HEADS,
          "GLM's batch at 64 heads and 128-entry pages: 2 seqs x 64K "
          "tokens, 4096 query rows, 2048-token budget (16 pages)"),
)
COMPILE_BY_NAME = {s.name: s for s in COMPILE}


def resized(shape: CallShape, seqs: int | None = None,
            tokens: int | None = None) -> CallShape:
  """Decode `shape` (token mode, every query row a decode sequence's) at
  `seqs` sequences of `tokens` tokens of cache (None: its own), named
  "<name>@<seqs>x<tokens>"."""
  if shape.mode != "token" or (shape.num_tokens
                               != shape.max_num_seqs * shape.decode_q_len):
    raise ValueError(f"shape: must be a token-mode decode shape to resize "
                     f"(got {shape.name!r})")
  per_page = shape.compression_ratio * shape.page_size
  for arg, v in (("seqs", seqs), ("tokens", tokens)):
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                          or v < 1 or (arg == "tokens" and v % per_page)):
      rule = ("a positive multiple of compression_ratio x page_size = "
              f"{per_page}" if arg == "tokens" else "a positive int")
      raise ValueError(f"{arg}: must be {rule} (got {v!r})")
  seqs = seqs or shape.max_num_seqs
  pages = tokens // per_page if tokens else shape.pages_per_seq
  return dataclasses.replace(
      shape, name=f"{shape.name}@{seqs}x{pages * per_page}",
      num_tokens=seqs * shape.decode_q_len, max_num_seqs=seqs,
      pages_per_seq=pages)
