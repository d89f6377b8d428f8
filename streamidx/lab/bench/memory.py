"""Memory as the OS counts it (`PeakMemory`, /proc)."""

from __future__ import annotations

import resource
import sys


def proc_bytes(field: str, path: str = "/proc/self/status") -> int | None:
  """A "Field:  N kB" line of a /proc file, in bytes; None if absent."""
  try:
    with open(path, encoding="ascii") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


class PeakMemory:
  """Peak resident memory since `start()` (which resets VmHWM through
  /proc/self/clear_refs) by VmHWM, not tracemalloc (it misses XLA's C++
  buffers); off Linux ru_maxrss since the process started (`method`)."""

  def __init__(self):
    self.method = "VmHWM since process start (/proc/self/status)"
    self.rss_before = None

  def start(self):
    self.rss_before = proc_bytes("VmRSS")
    try:
      with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
      self.method = "VmHWM after reset (/proc/self/clear_refs)"
    except OSError:
      self.method = "ru_maxrss since process start"

  def peak(self) -> int:
    hwm = proc_bytes("VmHWM")
    if hwm is not None and self.method.startswith("VmHWM"):
      return hwm
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def mib(x):
  """Bytes -> MiB rounded to 0.1 (None stays None)."""
  return None if x is None else round(x / 2**20, 1)
