"""Which backend computes which step shape on this machine: the plan. Measured at the first start of
a model on a machine (plan_timing.py), saved under $WARMPATH_HOME/plans/, loaded after;
runner.route() reads it.

Step times are kept per backend and shape class in milliseconds, in the layout of
`tests/data/plan_timings_spr.json`: {"decode": {"RxCTX": ms}, "chunk": {"K@CTX": ms}} per backend, a
decode class being one step of R sequences at CTX tokens of context, a chunk class K new tokens over
CTX cached ones. Pure Python (no torch): the planner's choice is tested with recorded timings of
other CPUs.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from warmpath.store import write_atomic

# native-int8-bf16attn: int8 products with the attention in bf16 too (AMX tiles or AVX512-BF16 dot
# products: a candidate only where the CPU has one), native-int8 with it in fp32.
BACKENDS = ("native-int8", "native-int8-bf16attn", "native-fp32", "torch-bf16", "torch-fp32",
            "torch-fp16")
# a torch backend's
TORCH_DTYPES = {"torch-fp32": "float32", "torch-bf16": "bfloat16", "torch-fp16": "float16"}
# Batch- and chunk-invariant: a sequence's numbers never depend on what shares its step or on where
# its prompt was cut into chunks, so a greedy request repeats whatever the load and the cache state
# (the kernel's tests).
DETERMINISTIC = ("native-int8", "native-int8-bf16attn", "native-fp32")
# rows, context
DECODE_SHAPES = ((1, 512), (4, 512), (16, 512), (64, 512), (1, 2048), (4, 2048), (16, 2048))
# new tokens, cached tokens
CHUNK_SHAPES = tuple((k, c) for k in (8, 32, 128, 512) for c in (0, 2048, 6144))
# A deterministic plan is one backend for every shape, so it needs only which candidate is fastest:
# that is read from the classes of a step of at most this much work (the cheap ones; a model's size
# scales which they are), a candidate dropped once it trails the leader by MARGIN over at least
# MIN_SHAPES of them. A plan that mixes backends per shape (nondeterminism allowed) times every
# class.
SCREEN_GFLOP = 64.0
MARGIN, MIN_SHAPES = 1.25, 4
# A configuration named by dtype / kernel / activations (not measured) has a fixed rule (fixed()):
# with fp32 activations the native kernel takes sequences of at most MAX_CHUNK new tokens (decodes,
# a warm request's new tokens) and prompt chunks whose whole context is at most NATIVE_CONTEXT
# tokens (there its products keep up with torch's GEMMs and share one pass with the step's decodes);
# torch's attention wins over longer contexts. With int8 activations every sequence runs natively:
# the products' speed-up outweighs the attention, and a prompt's numerics then never depend on how
# it was chunked (docs/benchmarks.md, "The CPU fast path").
MAX_CHUNK = 32
NATIVE_CONTEXT = 512

Timings = dict[str, dict[str, dict[str, float]]]  # backend -> "decode" | "chunk" -> shape key -> ms


def decode_key(rows: int, context: int) -> str:
    return f"{rows}x{context}"


def chunk_key(new: int, cached: int) -> str:
    return f"{new}@{cached}"


def step_gflop(cfg, kind: str, a: int, context: int) -> float:
    """The work of one step of a class, in GFLOP: the products of every token computed (the head's
    on each decoded row, on a chunk's last token) and the attention over its context. cfg: a
    ModelConfig."""
    h, d = cfg.hidden_size, cfg.head_dim
    per_token = 2 * cfg.num_layers * (h * (cfg.num_heads + 2 * cfg.num_kv_heads) * d +
                                      cfg.num_heads * d * h + 3 * h * cfg.intermediate_size)
    head = 2 * h * cfg.vocab_size
    per_context = 4 * cfg.num_layers * cfg.num_heads * d  # q.k and p.v, per token per context token
    if kind == "decode":
        return a * (per_token + head + per_context * context) / 1e9
    return (a * (per_token + per_context * (context + a / 2)) + head) / 1e9


def plan_steps(cfg, full: bool) -> list[tuple[str, str, int, int, int]]:
    """(kind, key, rows, new tokens, cached tokens) of the classes to time, cheapest first: all of
    them (`full`), else those of at most SCREEN_GFLOP. A model with a short context times a class at
    the longest context it has (the class keeps its name)."""
    def fit(cached: int, new: int) -> int:
        return min(cached, max(0, (cfg.max_position_embeddings - new - 1) // 16 * 16))

    steps = [("decode", decode_key(r, c), r, 1, fit(c, 1)) for r, c in DECODE_SHAPES]
    steps += [("chunk", chunk_key(k, c), 1, k, fit(c, k)) for k, c in CHUNK_SHAPES]
    work = {s[1]: step_gflop(cfg, s[0], s[2] if s[0] == "decode" else s[3], s[4]) for s in steps}
    steps.sort(key=lambda s: work[s[1]])
    return steps if full else [s for s in steps if work[s[1]] <= SCREEN_GFLOP]


def trailing(timings: Timings, among: list[str]) -> list[str]:
    """The candidates that trail the fastest by more than MARGIN (geometric mean of the ratios over
    the classes both have times for, at least MIN_SHAPES of them): not worth timing further for a
    one-backend plan."""
    def shapes(b: str) -> set[tuple[str, str]]:
        return {(kind, k) for kind, t in timings[b].items() for k in t}

    def ratio(b: str, leader: str) -> float:
        common = shapes(b) & shapes(leader)
        if len(common) < MIN_SHAPES:
            return 1.0
        return math.exp(
            sum(math.log(timings[b][kind][k] / timings[leader][kind][k])
                for kind, k in common) / len(common))

    leader = min(among, key=lambda b: ratio(b, among[0]))  # those timed alike share their classes
    return [b for b in among if b != leader and ratio(b, leader) > MARGIN]


def _parse(key: str) -> tuple[int, int]:
    a, b = key.replace("@", "x").split("x")
    return int(a), int(b)


@dataclass
class BackendPlan:
    """One native backend and one torch backend at most (each holds its own weights), and per shape
    class which of them computes it."""

    native: str | None  # "native-int8" | "native-int8-bf16attn" | "native-fp32" | None
    torch: str | None  # "torch-bf16" | "torch-fp32" | None
    decode: dict[str, str]  # decode shape key -> backend
    chunk: dict[str, str]  # chunk shape key -> backend
    timings: Timings = field(default_factory=dict)
    deterministic: bool = True
    # what it was measured for (machine, model, code): a different key means measure again
    key: str = ""
    # the KV cache's dtype when kv_cache_dtype is auto: one 16-bit cache for every backend
    cache: str = "bfloat16"
    # chunks go by MAX_CHUNK / NATIVE_CONTEXT (fixed()), not by the chunk table
    fixed_rule: bool = False

    @property
    def backends(self) -> list[str]:
        return [b for b in (self.native, self.torch) if b is not None]

    def for_decode(self, rows: int, context: int) -> str:
        return self.decode[_nearest(self.decode, rows, context)]

    def for_chunk(self, new: int, cached: int) -> str:
        if self.fixed_rule:
            return self.native if new <= MAX_CHUNK or cached + new <= NATIVE_CONTEXT else self.torch
        return self.chunk[_nearest(self.chunk, new, cached)]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # engines starting together never read half a plan
        write_atomic(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> BackendPlan:
        return cls(**json.loads(Path(path).read_text()))

    def table(self) -> str:
        """ms per candidate per shape and the choice, as `warmpath plan` prints it."""
        names = [b for b in BACKENDS if b in self.timings]
        lines = [
            f"plan: {' + '.join(self.backends)} "
            f"({'deterministic' if self.deterministic else 'nondeterministic'})",
            "| shape | " + " | ".join(names) + " | chosen |", "|---|" + "---|" * (len(names) + 1)
        ]
        for kind, choice in (("decode", self.decode), ("chunk", self.chunk)):
            for key, chosen in choice.items():
                cells = [_ms(self.timings[b].get(kind, {}).get(key)) for b in names]
                label = (f"decode {key.replace('x', ' x ')}" if kind == "decode" else
                         f"chunk {key.replace('@', ' @ ')}")
                lines.append(f"| {label} | " + " | ".join(cells) + f" | {chosen} |")
        return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _nearest(choice: dict[str, str], a: int, context: int) -> str:
    """The class closest to (a rows or new tokens, context): a factor of 2 in rows counts as much as
    1,024 tokens of context (a few hundred cached tokens change a step's cost far less than doubling
    its rows)."""
    def distance(key: str) -> float:
        ka, kc = _parse(key)
        return abs(math.log2(max(a, 1) / ka)) + abs(context - kc) / 1024

    return min(choice, key=distance)


def choose(timings: Timings, allow_nondeterministic: bool = False, key: str = "") -> BackendPlan:
    """The fastest plan the timings allow. Deterministic (the default): one deterministic backend
    for every shape — mixing two would make a sequence's numbers depend on its step's size or its
    chunking. Otherwise any native backend with any torch backend, each shape to the faster of the
    two. Among candidate plans the one with the lowest geometric mean of its per-shape times wins
    (fewer backends on a tie: less memory); of one-backend plans, one timed on more classes first (a
    screened measurement times a trailing candidate no further)."""
    have = [b for b in BACKENDS if b in timings]
    natives = [b for b in have if b.startswith("native")]
    torches = [b for b in have if b.startswith("torch")]
    if allow_nondeterministic:
        pairs = [(n, t) for n in [None, *natives] for t in [None, *torches] if n or t]
    else:
        pairs = [(n, None) for n in natives if n in DETERMINISTIC] or [(None, t) for t in torches]
    if not pairs:
        raise ValueError("no backend has timings to plan with")
    best: tuple = None
    for native, torch in pairs:
        members = [b for b in (native, torch) if b]
        choice = {kind: _fastest(timings, members, kind) for kind in ("decode", "chunk")}
        times = [timings[b][kind][k] for kind in choice for k, b in choice[kind].items()]
        if len(members) == 1:
            # one backend computes every class, timed or not (a screen times a few)
            one = single(members[0])
            choice = {"decode": one.decode, "chunk": one.chunk}
        if not times:
            continue
        score = sum(math.log(max(t, 1e-6)) for t in times) / len(times)
        if not allow_nondeterministic:
            # a screened candidate timed on fewer classes was dropped as trailing
            score = (-len(times), score)
        plan = BackendPlan(native, torch, choice["decode"], choice["chunk"], timings,
                    all(b in DETERMINISTIC for b in members), key)
        if best is None or (score, len(members)) < best[:2]:
            best = (score, len(members), plan)
    if best is None:
        raise ValueError("the timings cover no shape")
    return best[2]


def _fastest(timings: Timings, members: list[str], kind: str) -> dict[str, str]:
    """Per shape the member with the lowest time; shapes some member has no time for are left to
    those that do."""
    shapes = sorted({k for b in members for k in timings[b].get(kind, {})}, key=_parse)
    return {
        k: min((b for b in members if k in timings[b].get(kind, {})),
               key=lambda b: timings[b][kind][k])
        for k in shapes
    }


def native_options(backend: str) -> dict[str, str]:
    """The NativeForward arguments a native backend's name stands for."""
    activations, _, attention = backend.removeprefix("native-").partition("-")
    return {"activations": activations, "attention": "bf16" if attention == "bf16attn" else "fp32"}


def single(backend: str, key: str = "", cache: str = "bfloat16") -> BackendPlan:
    """A plan of one backend for every shape (a named plan: `--plan native-int8`)."""
    if backend not in BACKENDS:
        raise ValueError(
            f"plan must be auto, a plan file or one of {', '.join(BACKENDS)}; got {backend!r}")
    native, torch = (backend, None) if backend.startswith("native") else (None, backend)
    return BackendPlan(native, torch, {decode_key(r, c): backend
                                       for r, c in DECODE_SHAPES},
                       {chunk_key(k, c): backend
                        for k, c in CHUNK_SHAPES}, {}, backend in DETERMINISTIC, key, cache)


def fixed(native: str | None, torch: str) -> BackendPlan:
    """The plan of a configuration named by dtype / kernel / activations: the torch model in that
    dtype (the KV cache's too), with the native kernel beside it where asked. int8 activations
    compute every sequence natively (no torch model); fp32 ones decodes and short chunks (MAX_CHUNK,
    NATIVE_CONTEXT), torch the rest."""
    cache = TORCH_DTYPES[torch]
    if native is None or native == "native-int8":
        return single(native or torch, cache=cache)
    decode = {decode_key(r, c): native for r, c in DECODE_SHAPES}
    plan = BackendPlan(native, torch, decode, {}, {}, False, "", cache, True)
    # the rule's table, for `table()`
    plan.chunk = {chunk_key(k, c): plan.for_chunk(k, c) for k, c in CHUNK_SHAPES}
    return plan
