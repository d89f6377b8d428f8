"""streamidx.lab: what the notebooks, the benchmark and the studies use.

Not imported by `import streamidx`; it may load matplotlib and papermill.
ARCHITECTURE.md describes its modules (model/, studies/, bench/ and the
rest) and where new ones go. They are importable by their short names too:
`from streamidx.lab import tiling, plots`.
"""

import importlib

_MODULES = {
    "hardware": "streamidx.lab.model.hardware",
    "roofline": "streamidx.lab.model.roofline",
    "tiling": "streamidx.lab.model.tiling",
    "timeline": "streamidx.lab.model.timeline",
    "profiling": "streamidx.lab.model.profiling",
    "scaling": "streamidx.lab.model.scaling",
    "sharding": "streamidx.lab.sharding",
    "cases": "streamidx.lab.studies.cases",
    "formats": "streamidx.lab.studies.formats",
    "addressing": "streamidx.lab.studies.addressing",
    "quant": "streamidx.lab.studies.quant",
    "parity": "streamidx.lab.studies.parity",
    "costs": "streamidx.lab.studies.costs",
    "plots": "streamidx.lab.plots",
    "tables": "streamidx.lab.tables",
    "params": "streamidx.lab.params",
    "workbook": "streamidx.lab.workbook",
    "walkthrough": "streamidx.lab.walkthrough",
    "bench": "streamidx.lab.bench",
}


def __getattr__(name):
  if name in _MODULES:
    return importlib.import_module(_MODULES[name])
  raise AttributeError(f"module 'streamidx.lab' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_MODULES))
