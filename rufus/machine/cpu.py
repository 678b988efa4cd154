"""What this machine is: its CPU's instruction sets, class and cores, found in one place.

The same code lands on a mixed fleet (AVX-512 with native bf16, AVX2 with bf16 emulated, AMX,
ARM), and which kernels are fast, which compiled artefacts may be loaded and which precision
pays all follow from it: compile caches are keyed by :func:`cpu_key`
(:mod:`rufus.machine.caches`), the precision choice by it and the model
(:mod:`rufus.machine.precision`), and every model logs :func:`describe` at start and exports
it as the ``rufus_cpu_info`` metric so a figure can always be tied to its CPU class.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Mapping
from pathlib import Path

from rufus.env import environ

# CPU features that change which kernels torch, oneDNN and inductor generate.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")
# ``ATEN_CPU_CAPABILITY`` (PyTorch's and inductor's kernel choice) caps the ISA: the flags
# above the cap are not used, so what is built under it goes with the capped class.
ISA_CAPS = {"avx2": ("avx512", "amx"), "default": ("avx", "fma", "avx512", "amx")}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The ISA flags of this CPU (``/proc/cpuinfo``'s first ``flags``/``Features`` line)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return {f for f in value.split() if f in ISA_FLAGS}
    return set()


def effective_flags(flags: set[str], env: Mapping[str, str] | None = None) -> set[str]:
    """The flags kernels are built for: the CPU's, less those above ``ATEN_CPU_CAPABILITY``."""
    env = environ() if env is None else env
    dropped = ISA_CAPS.get(env.get("ATEN_CPU_CAPABILITY", "").lower(), ())
    return {f for f in flags if not f.startswith(dropped)} if dropped else set(flags)


def cpu_class(flags: set[str]) -> str:
    """A short name for the kernels this CPU can run: ``amx``, ``avx512-bf16``, ``avx512``,
    ``avx2``, ``arm-sve``, ``arm`` or ``baseline``."""
    if "amx_bf16" in flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512-bf16" if "avx512_bf16" in flags else "avx512"
    if "avx2" in flags:
        return "avx2"
    if "asimd" in flags:
        return "arm-sve" if "sve" in flags else "arm"
    return "baseline"


def native_bf16(flags: set[str]) -> bool:
    """Whether bf16 matrix products run natively (else they are emulated through fp32)."""
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def this_cpu(env: Mapping[str, str] | None = None) -> set[str]:
    """This CPU's flags as the kernels see them (capped by ``ATEN_CPU_CAPABILITY``)."""
    return effective_flags(cpu_flags(), env)


def cpu_key(flags: set[str] | None = None, machine: str | None = None) -> str:
    """``<arch>-<class>-<hash of every ISA flag>``: two CPUs share compiled kernels (and
    measured choices) only when every flag that matters is the same."""
    flags = this_cpu() if flags is None else flags
    machine = machine or platform.machine()
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:8]
    return f"{machine}-{cpu_class(flags)}-{digest}"


def cores() -> int:
    """Cores this process may run on (its affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def describe(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels of ``rufus_cpu_info`` and of the start log line."""
    flags = this_cpu(env)
    return {"cpu_class": cpu_class(flags), "cpu_key": cpu_key(flags),
            "native_bf16": str(native_bf16(flags)).lower(), "cores": str(cores()),
            "flags": " ".join(sorted(flags)) or "none"}
