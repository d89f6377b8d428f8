"""The notebooks' studies: cache layout, FP8 quantization, parity and recall."""
