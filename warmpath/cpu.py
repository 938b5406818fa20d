"""What CPU this is, read from /proc/cpuinfo: its name, its flags, and the label a benchmark report
carries. The label names the vector units that decide which kernel path is fastest (AVX2 only,
AVX-512 VNNI / BF16, AMX), so a figure says which of the project's machines measured it. No torch
here: the wire and the tools use it too."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# (flag in /proc/cpuinfo, name in the label); AMX is any of amx_tile / amx_bf16 / amx_int8
_UNITS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"),
          ("avx512_bf16", "BF16"), ("amx_", "AMX"))


def cpuinfo(text: str | None = None) -> dict[str, str]:
    """The first core's fields (the others repeat them); empty where /proc/cpuinfo cannot be
    read."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name(text: str | None = None) -> str:
    """The CPU's brand string ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+")."""
    return cpuinfo(text).get("model name") or platform.processor() or "unknown"


def cpu_flags(text: str | None = None) -> str:
    """The flags line (x86) or features line (Arm), as /proc/cpuinfo writes it."""
    info = cpuinfo(text)
    return info.get("flags") or info.get("Features") or platform.processor()


def cpu_label(text: str | None = None, cpus: int | None = None) -> str:
    """"AMD EPYC (family 26 model 2; AVX2 AVX-512 VNNI BF16, no AMX), 2 CPUs": the name, the family,
    and the vector units present, with AMX named where it is absent, since that is the first split
    between the machines."""
    if text is None:  # read once: the name, the family and the flags come from the same text
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    info = cpuinfo(text)
    flags = cpu_flags(text).split()
    units = [
        name for unit, name in _UNITS
        if any(f == unit or (unit.endswith("_") and f.startswith(unit)) for f in flags)
    ]
    if units and "AMX" not in units:
        units[-1] += ", no AMX"
    family = (f"family {info['cpu family']} model {info.get('model', '?')}"
              if "cpu family" in info else "")
    detail = "; ".join(x for x in (family, " ".join(units)) if x)
    count = cpus if cpus is not None else os.cpu_count()
    return cpu_name(text) + (f" ({detail})" if detail else "") + f", {count} CPUs"
