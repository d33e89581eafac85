"""XLA flags for the suite's processes on CPU (pytest's own, and the runs it starts)."""

import os

# LLVM's optimizations off where no GPU is: on CPU the suite's time goes to compiling small
# XLA programs more than to running them (the whole suite on 2 cores ~22 -> 18 min; a
# sharding test alone 56 -> 32-38 s). HLO passes, and so the programs' semantics, do not depend
# on it. On the GPU machine the flag is left out, so GPU-marked tests compile as a run does.
FAST_COMPILE = "" if os.path.exists("/dev/nvidia0") else "--xla_backend_optimization_level=0"


def xla_flags(devices: int = 1) -> str:
  """XLA_FLAGS for a process with `devices` host devices."""
  return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}".rstrip()
