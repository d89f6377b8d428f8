"""Data files the package reads, shipped in the wheel as `streamidx.data`.

    tpu_specs.json   the TPU hardware table behind `streamidx.lab.model.hardware`
                     (every number with its public source)
    decode_schedule.json   bundles per KV page of the decode launches
    step_schedule.json     bundles the step's compiled programs execute
                           (`streamidx.lab.dump`), each row with its command
    public_measurements.json   public TPU measurements of the pipeline, cited

Read them with `importlib.resources.files("streamidx.data")`.
"""
