"""streamidx.lab: what the notebooks, the benchmark and the studies use.

Not imported by `import streamidx`; it may load matplotlib and papermill.

    model/    hardware (TPU specs), roofline, tiling (the one model of the
              kernel's launches, loops, VMEM and DMAs), timeline (DMAs
              recorded from the interpreter), profiling (jax.profiler),
              scaling (the decode step on many chips; context parallelism)
    studies/  cases (the case matrix: named batches x variants, run and
              compared), formats (bytes per entry), addressing (causal
              masks), quant (FP8 analysis), parity (notebook 05's studies), costs (bytes, wasted
              blocks and launches counted from the interpreter's DMAs)
    bench/    the benchmark (`python -m streamidx.bench`)
    sharding  the sharded layouts compiled for TPU slices, their collectives
    plots, tables (text and Markdown tables), params (notebook parameter
    checks), workbook (the papermill runner), walkthrough (source excerpts
    and compile verdicts of the kernel walkthrough notebook)

The modules are importable by their short names too:
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
