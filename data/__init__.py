"""Data files the package reads, shipped in the wheel as `streamidx.data`.

    tpu_specs.json   the TPU hardware table behind `streamidx.lab.model.hardware`
                     (every number with its public source)

Read them with `importlib.resources.files("streamidx.data")`.
"""
