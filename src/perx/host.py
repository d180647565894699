"""What a result depends on besides the code and its seeds: the host's CPU and what numba compiles for it.

numba compiles perx's kernels for the host CPU (LLVM's host target, with every instruction the CPU has), so
two machines that differ here may round some floating-point operations differently, and a long chaotic
computation (a training run, the Cliffwalk oracle's thousands of greedy steps) can then take another path.
Studies record :func:`describe` beside their results so that such a difference can be traced.
"""

from __future__ import annotations

import os
import platform
from typing import Any

_X86_LEVELS = (("x86-64-v2", ("cx16", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3")),
               ("x86-64-v3", ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe")),
               ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")))


def describe() -> dict[str, Any]:
    """The CPU count and model, numba's version and LLVM target, the x86-64 level (v2, v3, v4) the CPU
    reaches and its feature flags as LLVM sees them. Cost: reads /proc/cpuinfo once."""
    out: dict[str, Any] = {"cpus": os.cpu_count(), "machine": platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            out["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        out["cpu"] = platform.processor() or None
    try:
        import llvmlite.binding as llvm
        import numba

        features = {k for k, v in llvm.get_host_cpu_features().items() if v}
        out["numba"] = numba.__version__
        out["numba_target"] = llvm.get_host_cpu_name()
        level = "x86-64" if platform.machine() in ("x86_64", "AMD64") else platform.machine()
        if level == "x86-64":
            for name, needs in _X86_LEVELS:
                if not set(needs) <= features:
                    break
                level = name
        out["isa_level"] = level
        out["cpu_features"] = ",".join(sorted(features))
    except (ImportError, RuntimeError):  # pragma: no cover - numba depends on llvmlite
        pass
    return out
