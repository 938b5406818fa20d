"""The machine's int8 peak, and what share of it a prompt's prefill reaches (`warmpath plan
--roofline`). No torch: pure arithmetic over /proc/cpuinfo and the model's shape.

Peak = cores x clock x the int8 multiply-adds one core issues a cycle, by the widest unit it has:
- AMX-INT8 (Sapphire Rapids on): TDPBUSD multiplies a 16x64 by a 64x16 tile, 16,384 multiply-adds,
  one every 16 cycles: 1,024 a cycle.
- AVX-512 VNNI: VPDPBUSD does 64 multiply-adds on 512 bits; two a cycle where the core has two
  512-bit FMA ports (Intel, Zen 5): 128; Zen 4 (AMD family 25) splits 512 bits in two halves: 64.
- AVX2: VPMADDUBSW + VPMADDWD do 32 multiply-adds on 256 bits, two a cycle: 64.
- none of these: 16 (SSE4.1's 128-bit PMADDUBSW).
The clock is /proc/cpuinfo's "cpu MHz" (what a VM reports: usually the base clock; turbo is higher,
so a share above 100% means the clock was higher than read), or --ghz.

A prompt token costs its linear layers (q|k|v, o, gate|up, down) hidden x outputs multiply-adds
each; attention adds 2 x heads x head_dim x the context before it (QK^T and PV), reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.config import ModelConfig
from warmpath.cpu import cpu_flags, cpuinfo


@dataclass(frozen=True)
class Peak:
    unit: str  # the widest int8 unit: "AMX-INT8", "AVX-512 VNNI", "AVX2", "SSE"
    macs_per_cycle: int  # int8 multiply-adds a core issues a cycle
    ghz: float
    cores: int

    @property
    def macs_per_s(self) -> float:
        return self.macs_per_cycle * self.ghz * 1e9 * self.cores

    def arithmetic(self) -> str:
        return (f"{self.unit}: {self.macs_per_cycle:,} int8 multiply-adds a cycle x {self.cores} "
                f"cores x {self.ghz:.2f} GHz = {self.macs_per_s / 1e12:.2f} T a second")


def int8_peak(text: str | None = None, cores: int = 1, ghz: float | None = None) -> Peak:
    """The int8 peak of the CPU /proc/cpuinfo `text` describes (None: this machine's)."""
    info, flags = cpuinfo(text), set(cpu_flags(text).split())
    if ghz is None:
        ghz = float(info.get("cpu MHz") or 0) / 1000
    if "amx_int8" in flags:
        return Peak("AMX-INT8", 1024, ghz, cores)
    if "avx512_vnni" in flags:
        zen4 = info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") == "25"
        return Peak("AVX-512 VNNI", 64 if zen4 else 128, ghz, cores)
    if "avx2" in flags:
        return Peak("AVX2", 64, ghz, cores)
    return Peak("SSE", 16, ghz, cores)


def linear_macs_per_token(m: ModelConfig) -> int:
    """Multiply-adds of one prompt token's linear layers, every layer (the head runs for the last
    token only: not counted)."""
    q, kv, h, i = (m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.hidden_size,
                   m.intermediate_size)
    return m.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * i)


def attention_macs(m: ModelConfig, tokens: int) -> int:
    """Multiply-adds of a `tokens`-token prompt's attention, computed from nothing (each token
    attends to itself and those before it: QK^T and PV)."""
    return m.num_layers * 2 * m.num_heads * m.head_dim * tokens * (tokens + 1) // 2


@dataclass(frozen=True)
class Share:
    tokens: int
    seconds: float
    linear_macs: int
    attention_macs: int
    peak: Peak

    @property
    def linear_share(self) -> float:
        """The linear layers' multiply-adds a second, as a share of the int8 peak."""
        return self.linear_macs / self.seconds / self.peak.macs_per_s

    @property
    def total_share(self) -> float:
        return (self.linear_macs + self.attention_macs) / self.seconds / self.peak.macs_per_s

    def report(self) -> str:
        return (f"prefill of {self.tokens:,} tokens: {self.seconds:.2f} s "
                f"({self.tokens / self.seconds:,.0f} tokens/s); linear layers "
                f"{self.linear_macs / self.seconds / 1e9:,.0f} G multiply-adds/s = "
                f"{self.linear_share:.1%} of the int8 peak, with attention "
                f"{self.total_share:.1%}\n  peak: {self.peak.arithmetic()}")


def prefill_share(m: ModelConfig, tokens: int, seconds: float, peak: Peak) -> Share:
    linear = tokens * linear_macs_per_token(m)
    return Share(tokens, seconds, linear, attention_macs(m, tokens), peak)
