"""Every default lives here, once. One dataclass per component; CLI flags map 1:1 to fields."""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


def warmpath_home() -> Path:
    """Where fetched models and caches live: $WARMPATH_HOME, default ~/.cache/warmpath."""
    return Path(os.environ.get("WARMPATH_HOME", Path.home() / ".cache" / "warmpath"))


KV_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}  # the KV cache dtypes
KV_INT8_SCALE_BYTES = 2  # an int8 KV row's fp16 scale, after its values (models/kv_quant.py)

# The settings that take one of a few words, each named once: the config refuses any other when it
# is built (check_choices), so the components that read them need not check again.
Device = Literal["cpu", "cuda"]
# fp32 / bf16 / fp16: aliases
Dtype = Literal["auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"]
KVCacheDtype = Literal["auto", "float32", "bfloat16", "float16", "int8"]
GemvDtype = Literal["none", "float16", "bfloat16"]
Kernel = Literal["auto", "native", "torch"]
KernelActivations = Literal["auto", "fp32", "int8"]  # kernels/native.py ACTIVATIONS, and auto
SpeculativeMethod = Literal["none", "ngram", "suffix", "draft"]
CompletionScope = Literal["auto", "statement", "line", "block", "none"]  # api/scope.py
FimLayout = Literal["anchored", "cursor"]  # api/fim.py LAYOUTS
ShortContextMode = Literal["auto", "off", "always"]  # ServerConfig.short_context
CacheIsolation = Literal["none", "key"]
# router/policies.py
RoutingPolicy = Literal["round-robin", "least-load", "session", "prefix", "hybrid"]


@functools.cache
def _choices(cls: type) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is Literal}


def check_choices(config) -> None:
    """Every Literal-typed field of `config` holds one of its words; a ValueError names the field
    and them."""
    for name, allowed in _choices(type(config)).items():
        if (value := getattr(config, name)) not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


@dataclass
class ModelConfig:
    """Shape of a Llama-family decoder, read from a checkpoint (GGUF metadata or HF config.json)."""

    architecture: str  # "llama" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """K and V of every layer and KV head for one token, in a cache of kv_dtype (an int8 row
        also holds its fp16 scale: models/kv_quant.py)."""
        row = self.head_dim * KV_ELEMENT_BYTES[kv_dtype] + (KV_INT8_SCALE_BYTES
                                                            if kv_dtype == "int8" else 0)
        return 2 * self.num_layers * self.num_kv_heads * row


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's own knobs (the simulator builds a Scheduler from these alone)."""

    # Per-step token budget (prefill chunks + decodes): small enough that decoding streams keep
    # moving while a long prompt prefills, large enough that the prompt's TTFT barely grows
    # (benchmarks/engine_batching.py).
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64  # the most requests running at once
    # While another session is quick (decoding, or typing on a warm prefix), a prompt's chunk takes
    # at most what this machine computes in this long (measured from the steps run:
    # Scheduler.observe), so a keystroke arriving behind another session's long prompt waits for a
    # short step, not a 512-token one; 0: off (chunks fill the budget). Cold sessions alone are
    # never paced: short chunks would only add each step's fixed cost.
    step_target_ms: float = 100.0
    # A session's request left mid-prompt (past its deadline, or closed by its client) leaves its
    # prompt computing on, with what budget the others leave, until the session's next request
    # comes: that keystroke then finds the prefix cached.
    warm_late_prompts: bool = True
    # Warm-ups waiting for an idle step hold at most this many prompt tokens per tenant (its
    # credential's, server/tenancy.py) and in all: each refused or late request leaves one, and a
    # client can send any number of them; past a bound the oldest go first
    # (warmpath_warm_ups_dropped).
    warm_up_tokens_per_tenant: int = 65536
    warm_up_tokens: int = 131072  # warm-ups' prompt tokens waiting, all tenants together


@dataclass
class EngineConfig:
    # A bundled name (fetched on first use), a path to a .gguf file, or an HF directory; by default
    # a code model (`make serve`'s), not SmolLM2, the tests' fast chat model, which cannot complete
    # code.
    model: str = "qwen2.5-coder-0.5b"
    dtype: Dtype = "auto"  # "auto" (bf16 where the CPU has it, else fp32), "float32", "bfloat16"
    device: Device = "cpu"  # "cpu" or "cuda"
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # overrides memory_budget and kv_cache_memory when set
    kv_cache_memory: int = 1 << 30  # bytes of KV cache (bf16 SmolLM2: ~46k tokens per GiB)
    # One budget for resident weights + the largest step's working buffers + KV (e.g. "2GiB"): the
    # KV pool is what is left (models/footprint.py; `warmpath simulate` counts the same way).
    # Replaces kv_cache_memory when set.
    memory_budget: str | None = None
    # The cache's own dtype: auto (the model's; 16-bit under a plan) | float32 | bfloat16 | float16
    # | int8 (a scale per token and KV head: ~2x the sessions of bf16 in the same memory, only where
    # asked for)
    kv_cache_dtype: KVCacheDtype = "auto"
    # A disk tier for the KV cache (engine/kv_tier.py): every cached prefix block is also written
    # here, so one evicted from RAM, or lost to a restart, is read back instead of computed. Off
    # when unset.
    kv_offload_dir: str | None = None
    # The disk tier's bound over its whole directory (every key's blocks: other models, plans and
    # code versions, other servers on it): blocks of keys no server uses go first, then the least
    # recently used.
    kv_offload_bytes: str = "4GiB"
    # Blocks waiting for the tier's writer hold at most this much RAM; past it a block is not kept
    # on disk (a slow disk costs the tier, never the step: warmpath_kv_tier_dropped_blocks).
    kv_offload_queue_bytes: str = "256MiB"
    # the longest prompt + answer, in tokens; default: the model's context length
    max_model_len: int | None = None
    # The scheduler's knobs (SchedulerConfig above; frozen, so one default instance is shared
    # safely), each field a flag of its own (--max-num-batched-tokens ...).
    scheduler: SchedulerConfig = SchedulerConfig()
    enable_prefix_caching: bool = True  # reuse the KV blocks of a prompt's cached prefix
    # threads of a step (the kernel's and torch's); default: all cores
    num_threads: int | None = None
    # threads for decode-only steps; default: all (num_threads)
    num_decode_threads: int | None = None
    # One thread while another process holds a core, every core otherwise, from what the OS counts
    # during the native kernel's steps (engine/threads.py): a machine shared with other work slows
    # down instead of stalling.
    thread_tuning: bool = True
    # "float16" / "bfloat16": also keep half-width weight copies and use them for steps of at most
    # gemv_max_rows tokens (decode of a few streams), where reading weights is the cost; fp32 models
    # on CPU only. Off by default: such steps are then not token-identical to fp32. "none" keeps one
    # copy.
    gemv_dtype: GemvDtype = "none"
    gemv_max_rows: int = 4  # steps of at most this many tokens use the gemv_dtype copies
    # The native CPU kernel (warmpath/kernels/): one compiled call over the checkpoint's own
    # quantized blocks (GGUF Q4_1 / Q8_0; fp32 for other tensors). "native": on, "torch": off,
    # "auto": on for a float32 model on the CPU when a C compiler is there. Which sequences of a
    # step it computes: runner.route().
    kernel: Kernel = "auto"
    # Activations of the native kernel's Q4_1 / Q8_0 products: "fp32" (exact: the fp32 weights'
    # values, another order of summation), "int8" (each row quantized per block of 32, llama.cpp's
    # Q8 activations: faster, not token-identical to fp32; benchmarks/bf16_agreement.py --dtype
    # float32 --kernel-activations int8 measures the agreement), "auto": int8 when dtype is "auto"
    # (the fast default, as bf16 is where the CPU has it), fp32 when float32 is asked for.
    kernel_activations: KernelActivations = "auto"
    # Which backend computes which step shape (warmpath/engine/plan.py): "auto" measures them on
    # this machine at the first start of a model (cached under $WARMPATH_HOME/plans/; `warmpath
    # plan` prints it) whenever dtype, kernel and kernel_activations are all "auto"; a backend name
    # (native-int8, native-fp32, torch-bf16, torch-fp32) or a plan file forces one.
    plan: str = "auto"
    # Let the plan mix a native and a torch backend where that is faster: a greedy request's tokens
    # may then depend on what shares its steps and on how much of its prompt was cached.
    allow_nondeterministic: bool = False
    # Speculative decoding (engine/proposers.py): "ngram" guesses from the request's own tokens,
    # "suffix" also from its session's earlier requests, "draft" with a small model; each guess is
    # verified in the request's next step and kept only where the model samples it, so outputs are
    # the model's own; a step verifies guesses only while this machine's measured step times say it
    # pays, and never beside a prompt (docs/engine.md, "Speculative decoding"). "none": off.
    speculative_method: SpeculativeMethod = "suffix"
    # "draft": a second, smaller model with the same tokenizer guesses (engine/draft.py), in its own
    # KV pool
    speculative_draft_model: str | None = None
    speculative_draft_blocks: int = 1024  # KV blocks of the draft model's own pool
    num_speculative_tokens: int = 4  # the most tokens guessed for a request in one step
    # no guessing in a step with more decoding requests (compute-bound there)
    speculative_max_seqs: int = 4
    seed: int = 0  # of the sampler's generator (a request's own seed overrides it)

    def __post_init__(self):
        check_choices(self)


@dataclass
class ConnectionLimits:
    """What server and router both hold clients to (warmpath/api/serving.py runs uvicorn with them):
    a client that keeps a connection without finishing its request is cut off, and none can hold
    unbounded many."""

    # seconds to send a request's headers (from connect, or after the last answer)
    header_timeout: float = 10.0
    body_timeout: float = 30.0  # seconds to send a request's whole body; past it 408
    keep_alive_timeout: float = 5.0  # seconds an idle connection stays open between two requests
    max_connections: int = 1024  # connections past this are answered 503 and closed
    max_header_bytes: int = 64 << 10  # request line and headers; larger: 431
    # A session id (X-Session-Id, `user`) longer than this is kept as a hash of itself: server and
    # router key state by session, and a header may be 64 KiB.
    max_session_id_chars: int = 128


@dataclass
class ServiceConfig(ConnectionLimits):
    """What `warmpath serve` and `warmpath route` both are to their clients: where they listen, whom
    they let in, what they call their model and where its fill-in-the-middle answers end."""

    host: str = "127.0.0.1"  # address to listen on (0.0.0.0: every interface)
    port: int = 8000  # TCP port to listen on
    # when set, every route but /health needs "Authorization: Bearer <key>"
    api_key: str | None = None
    # More accepted keys, one per line: one per tenant. A "#" at a line's start or after a space
    # starts a comment ("#" inside a key is part of it).
    api_keys_file: str | None = None
    # larger request bodies get 413, counted as they arrive (chunked too)
    max_body_bytes: int = 4 << 20
    # default: the engine's model spec (a router's: its nodes' model)
    served_model_name: str | None = None
    # Where a fill-in-the-middle answer ends (api/scope.py): "auto" (the rest of the line after
    # typed code, else the cursor's block), "statement", "line", "block" or "none"; a request's
    # `scope` overrides it. A router applies it to the answers of engines with no completion scope
    # of their own (vLLM, SGLang, llama.cpp).
    completion_scope: CompletionScope = "auto"

    def __post_init__(self):
        check_choices(self)


@dataclass
class ServerConfig(ServiceConfig):
    # Prefix-cache isolation (README, "Security"): "key" mixes a hash of the request's API key (and
    # the tenant a router names, server/tenancy.py) into its cache salt, so clients with different
    # keys never share KV blocks nor see each other's hits; "none" shares the cache across keys (a
    # request's `cache_salt` still keeps it apart).
    cache_isolation: CacheIsolation = "none"
    # FIM prompts of prefix-first families: "anchored" puts the prefix's last lines after the middle
    # marker, so typing leaves the prompt before it cached (api/fim.py anchor()); "cursor": the
    # prefix up to the cursor.
    fim_layout: FimLayout = "anchored"
    # The most tokens of a FIM suffix a prompt keeps, its first lines (api/fim.py keep_suffix()):
    # "all" the whole suffix the client sends (its own window bounds it); "auto" what this machine
    # computes in 250 ms (measured once, kept with the plan), 64 at least, so moving the anchor or
    # opening a file stays nearer an editor's deadline, for a cost in exact matches on real files
    # (docs/benchmarks.md); or a number of tokens.
    fim_suffix_tokens: str = "all"
    # A cold file's first answers (engine/scheduler/_short_context.py): "auto" answers a FIM request
    # that sets a deadline (X-Deadline-Ms, t_max_prompt_ms) from its short context (the prefix's
    # last lines, the suffix's first) when its whole prompt, mostly uncached, could not give a first
    # token within first_token_ms; the whole prompt warms on for the next keystroke. "off": never;
    # "always": every FIM request (its quality: warmpath eval).
    short_context: ShortContextMode = "auto"
    first_token_ms: float = 300.0  # the first-token budget "auto" answers within
    # The short context's size: the tokens this machine computes in this long (measured at start),
    # 128 at least; more costs time, less costs exact matches (docs/editors.md).
    short_context_ms: float = 150.0
    # The confidence gate (server/confidence.py): a fill-in-the-middle answer whose first line's
    # tokens are less probable than this (their geometric mean) is silenced; 0 shows every answer. A
    # request's `min_confidence` overrides it.
    min_confidence: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        for name in ("first_token_ms", "short_context_ms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0; got {getattr(self, name)}")


@dataclass
class RouterConfig(ServiceConfig):
    port: int = 8080  # TCP port to listen on (the router's default, beside a node's 8000)
    # Upstreams: `node [ENGINE=]URL` (repeated) for one pool; `tier NAME=URL,URL` (repeated,
    # smallest model first) for model tiering.
    node: list[str] | None = None
    # `[ENGINE=]URL [drain]` per line (# comments), added to `node`; reloaded when it changes.
    # ENGINE (warmpath, vllm, sglang, llamacpp, openai) is detected from the node's /v1/models when
    # not given.
    nodes_file: str | None = None
    # NAME=URL[,URL...]: a model tier, smallest model first (repeated)
    tier: list[str] | None = None
    policy: RoutingPolicy = "hybrid"  # round-robin | least-load | session | prefix | hybrid
    # bounded loads: a node takes one more request while its load <= c x average
    load_factor: float = 1.25
    # ... and always while its load is under this many requests (sessions stay home)
    affinity_floor: int = 4
    virtual_nodes: int = 100  # points per node on the hash ring
    # the prefix index hashes prompts in blocks of this many characters
    prefix_block_chars: int = 64
    prefix_index_blocks: int = 65536  # per node; least recently routed blocks are forgotten first
    # seconds between /health checks and /metrics scrapes (load, counters)
    health_interval: float = 1.0
    health_failures: int = 3  # failed checks in a row before a node leaves the ring
    connect_timeout: float = 2.0  # seconds; a node that does not accept in time counts as failed
    # tiering: /v1/completions with at most this many tokens can be a line completion
    line_max_tokens: int = 32
    cache_entries: int = 1024  # response cache (temperature 0 only); 0 turns it off
    cache_ttl: float = 300.0  # seconds a cached answer stays valid
    admin_key: str | None = None  # /admin/* (drain, node list) needs it; without one, /admin is off
    # Sent to the nodes, with each client's tenant (a hash of its credential, router/forward.py) so
    # a node's --cache-isolation key still keeps clients apart; default: the client's Authorization
    # header.
    upstream_api_key: str | None = None
    # A node that stops answering (hung, frozen, cut off without a reset) or leaves the ring: while
    # nothing has reached the client the request fails over; a stream already started ends with the
    # error event.
    first_byte_timeout: float = 60.0  # seconds from sending a streamed request to its first event
    # seconds for a whole (non-streamed) answer, which comes all at once
    response_timeout: float = 600.0
    idle_timeout: float = 60.0  # seconds between two events of a stream


@dataclass
class ClientConfig:
    """The editor plugin (warmpath.client): how `warmpath bench` and `warmpath simulate` ask for
    suggestions."""

    debounce_ms: float = 75.0  # keystrokes closer than this send no request
    deadline_ms: float = 300.0  # first token later than this: the suggestion is dropped
    # the whole suggestion; forwarded as X-Deadline-Ms so the server stops too
    max_time_ms: float = 3000.0
    max_tokens: int = 16
    temperature: float = 0.0
    fim: bool = True  # send the text after the cursor as `suffix`


@dataclass
class SLO:
    """TTFT targets that goodput counts against (`warmpath bench --slo-ms / --agent-slo-ms`)."""

    editor_ttft_s: float = 0.300  # later, a suggestion is worth little under a moving cursor
    agent_ttft_s: float = 5.0


@dataclass
class BenchConfig:
    """`warmpath bench` defaults: the trace it generates and how runs follow one another."""

    workload: str = "editor"
    developers: int = 12  # sessions: developers (and agents, for mixed)
    duration: float = 300.0  # seconds of (compressed) trace time
    rate: float = 30.0  # idle time compressed this many times
    agent_share: float = 0.25  # mixed: share of sessions that are agents
    seed: int = 0
    cooldown: float = 5.0  # seconds between the runs of two servers
    drain_s: float = 30.0  # after the trace: how long requests still in flight may finish


@dataclass
class SimConfig:
    """`warmpath simulate` defaults (the editor client's deadline is ClientConfig's)."""

    profile: str = "cpu-smollm2"
    workload: str = "editor"
    sessions: int = 12
    duration: float = 3600.0  # simulated seconds of traffic
    rate: float = 1.0  # idle time compressed this many times
    seed: int = 0
    nodes: int = 1
    policy: str = "hybrid"  # the router's policy for fleets
    tokenizer: str = "auto"  # auto | model | chars
    drain_s: float = 30.0  # after the trace: how long requests still in flight may finish
    sample_every_s: float = 1.0  # pool-use samples
    # fleets: each sample looks up every session's prefix on its node
    fleet_sample_every_s: float = 10.0
    # fleets (--fleet): router replicas, each its own Router with its own open-request counts
    replicas: int = 1
    replica_by: str = "developer"  # what the balancer in front of them keys on: developer | request
    # --fleet --sweep nodes: the fewest nodes keeping editor goodput at least this (None: this share
    # of what --nodes nodes get: cold prefills cap goodput below 1 on some hardware whatever the
    # fleet's size)
    target_goodput: float | None = None
    target_share: float = 0.95
    # --sweep developers: the goodput to keep (None: target_share of the best)
    capacity_goodput: float | None = None
    # a router replica (one process, one core) planned to this share of its core at peak
    router_busy: float = 0.5

