"""The Pallas kernels: the kernel bodies (vendored, dense, lean, fp4, with
the block maxima's hook and the TPU helpers they share), the one driver
and the entry points (`entries`). ARCHITECTURE.md's module map says what
each module holds and its layer list what it may import; LEDGER.md beside
them lists the vendored kernel's local modifications.
"""
