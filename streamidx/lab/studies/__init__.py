"""The notebooks' studies: the case matrix, entry formats, HBM bytes,
addressing and masks, FP8 quantization, parity and recall."""
