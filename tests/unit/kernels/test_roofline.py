"""The int8 peak `warmpath plan --roofline` divides by, chosen from the flags recorded on each kind
of project machine (AVX2-only EPYC, Zen 4, Zen 5, Intel without AMX, Sapphire Rapids with AMX),
and a prompt's multiply-adds from the model's shape (Qwen2.5-Coder-0.5B's: the 0.36 G a token the
issue counts)."""

import json
from pathlib import Path

import pytest

from warmpath.config import ModelConfig
from warmpath.kernels.roofline import (
    attention_macs,
    int8_peak,
    linear_macs_per_token,
    prefill_share,
)

DATA = Path(__file__).parents[2] / "data"
QWEN05 = ModelConfig("qwen2", 151936, 896, 4864, 24, 14, 2, 64)


def cpuinfo(kind: str, vendor: str, family: int, mhz: float) -> str:
    flags = json.loads((DATA / f"plan_timings_{kind}.json").read_text())["flags"]
    return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 1\n"
            f"cpu MHz\t\t: {mhz:.3f}\nflags\t\t: fpu sse2 {' '.join(flags)}\n\n")


@pytest.mark.parametrize(("kind", "vendor", "family", "unit", "per_cycle"), [
    ("epyc_qwen05", "AuthenticAMD", 23, "AVX2", 64),
    ("zen5_qwen05", "AuthenticAMD", 25, "AVX-512 VNNI", 64),  # its flags on a Zen 4: half-width
    ("zen5_qwen05", "AuthenticAMD", 26, "AVX-512 VNNI", 128),
    ("emr", "GenuineIntel", 6, "AVX-512 VNNI", 128),
    ("spr", "GenuineIntel", 6, "AMX-INT8", 1024),
])
def test_the_peak_is_the_widest_int8_unit_the_cpu_has(kind, vendor, family, unit, per_cycle):
    peak = int8_peak(cpuinfo(kind, vendor, family, 2600.0), cores=2)
    assert (peak.unit, peak.macs_per_cycle) == (unit, per_cycle)
    assert peak.macs_per_s == pytest.approx(per_cycle * 2 * 2.6e9)
    assert int8_peak(cpuinfo(kind, vendor, family, 2600.0), cores=2, ghz=3.0).ghz == 3.0


def test_a_prompt_token_costs_its_linear_layers_and_attention_grows_with_the_context():
    assert linear_macs_per_token(QWEN05) == 357_826_560  # ~0.36 G
    # 2,000 tokens: each attends to itself and those before it, QK^T and PV
    assert attention_macs(QWEN05, 2000) == 24 * 2 * 14 * 64 * 2000 * 2001 // 2
    peak = int8_peak(cpuinfo("zen5_qwen05", "AuthenticAMD", 26, 2600.0), cores=2)
    # the arithmetic: 780 tokens/s on a Zen 5 is ~40% of its peak (1,800 tokens/s)
    share = prefill_share(QWEN05, 2000, 2000 / 780, peak)
    assert share.linear_share == pytest.approx(0.42, abs=0.01)
    assert share.total_share > share.linear_share
    assert "of the int8 peak" in share.report() and "AVX-512 VNNI" in share.report()
