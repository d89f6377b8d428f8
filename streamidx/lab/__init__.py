"""streamidx.lab: what the notebooks, the benchmark and the studies use (its
modules: ARCHITECTURE.md), importable by short names too (`from
streamidx.lab import tiling, plots`); not imported by `import streamidx`.
"""

import importlib

_MODULES = {name: f"streamidx.lab.{folder}{name}" for folder, names in (
    ("model.", ("hardware", "roofline", "tiling", "timeline", "profiling",
                "scaling")),
    ("studies.", ("cases", "addressing", "quant", "costs")),
    ("", ("sharding", "plots", "tables", "params", "workbook", "bench",
          "shapes")),
    ("bench.", ("record",)),
) for name in names}


def __getattr__(name):
  if name in _MODULES:
    return importlib.import_module(_MODULES[name])
  raise AttributeError(f"module 'streamidx.lab' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_MODULES))
