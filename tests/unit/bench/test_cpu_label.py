"""A benchmark report names the machine that measured it: the CPU and its vector units (the
project's machines differ by AVX2 only / AVX-512 VNNI and BF16 / AMX), from the flags recorded on
each kind of machine."""

import json
from pathlib import Path

import pytest

from warmpath.cpu import cpu_flags, cpu_label, cpu_name

DATA = Path(__file__).parents[2] / "data"


def cpuinfo_text(name: str, family: int, model: int, flags: list[str]) -> str:
    core = ("processor\t: {n}\nvendor_id\t: x\n"
            f"cpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: {name}\n"
            f"flags\t\t: fpu sse2 {' '.join(flags)}\n\n")
    return core.format(n=0) + core.format(n=1)


def recorded_flags(kind: str) -> list[str]:
    return json.loads((DATA / f"plan_timings_{kind}.json").read_text())["flags"]


@pytest.mark.parametrize(("kind", "name", "family", "model", "label"), [
    ("epyc_qwen05", "AMD EPYC", 25, 1, "AMD EPYC (family 25 model 1; AVX2, no AMX), 2 CPUs"),
    ("emr", "Intel(R) Xeon(R) Processor", 6, 207,
     "Intel(R) Xeon(R) Processor (family 6 model 207; AVX2 AVX-512 VNNI BF16, no AMX), 2 CPUs"),
    ("zen5_qwen05", "AMD EPYC", 26, 2,
     "AMD EPYC (family 26 model 2; AVX2 AVX-512 VNNI BF16, no AMX), 2 CPUs"),
    ("spr", "Intel(R) Xeon(R) Processor", 6, 143,
     "Intel(R) Xeon(R) Processor (family 6 model 143; AVX2 AVX-512 VNNI BF16 AMX), 2 CPUs"),
])
def test_the_label_names_the_vector_units_that_choose_the_kernel(kind, name, family, model, label):
    text = cpuinfo_text(name, family, model, recorded_flags(kind))
    assert cpu_label(text, cpus=2) == label
    assert cpu_name(text) == name


def test_an_arm_box():
    arm = "processor\t: 0\nFeatures\t: fp asimd sve\nCPU part\t: 0xd40\n"
    assert cpu_flags(arm) == "fp asimd sve"
    # no x86 units to name, no family line: the name alone
    assert cpu_label(arm, cpus=4).endswith(", 4 CPUs")
