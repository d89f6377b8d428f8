"""Models of the kernel on TPU hardware: specs, roofline, tiling, timeline, profiling."""
