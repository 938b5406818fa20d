"""AsyncEngine: the Engine steps in its own thread; each request gets an asyncio stream of deltas.

Only the step thread touches the Engine. The event loop hands it commands (add, abort) through a thread-safe
queue that is drained at every step boundary, gets outputs back with call_soon_threadsafe, and reads the engine's
state from the EngineSnapshot the step thread publishes at each boundary. torch releases
the GIL inside its kernels, so the HTTP loop keeps serving while a step computes. When there is no work the
thread sleeps on an Event; a new command wakes it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from warmpath.engine.engine import Engine
from warmpath.engine.request import RequestOutput, SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The step loop died; the server answers 503 until restarted."""


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    session_id: str | None
    deadline: float | None
    cache_salt: str | None
    stream: asyncio.Queue
    loop: asyncio.AbstractEventLoop


@dataclass(frozen=True)
class EngineSnapshot:
    """What the event loop and /metrics may read of the engine: published by the step thread at each step
    boundary (after the commands are taken in, and after each step), so nothing outside it reads live state."""

    stats: dict  # Engine.stats()
    prompt_left: tuple[int, ...]  # prompt tokens still to compute, per waiting or running request (warm-ups not)
    latency_chunk: int | None  # Scheduler.latency_chunk
    quick_until: float  # Scheduler.quick_until(), on `clock`
    clock: Callable[[], float]

    @classmethod
    def of(cls, engine: Engine) -> EngineSnapshot:
        sched = engine.scheduler
        left = tuple(r.num_tokens - r.num_computed_tokens - 1 for r in (*sched.waiting, *sched.running)
                     if not r.warmup)
        return cls(engine.stats(), left, sched.latency_chunk, sched.quick_until(), sched.clock)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _WarmUp:
    request_id: str
    prompt_token_ids: list[int]
    session_id: str | None
    cache_salt: str | None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker pool (torch's libgomp, which the native kernel shares).

    Why: libgomp counts every pool's threads, and once there are more than cores it stops spinning at
    barriers (a few hundred iterations, whatever OMP_WAIT_POLICY / GOMP_SPINCOUNT say) and sleeps on a futex
    instead, at each of a step's parallel regions. Loading the model in the main thread leaves a pool there;
    with the step thread's own pool a 2-core machine has 4 (docs/benchmarks.md, "Server vs engine", has the cost).
    Returns whether the runtime had omp_pause_resource_all (OpenMP 5.0)."""
    try:
        pause = ctypes.CDLL(None).omp_pause_resource_all
    except (AttributeError, OSError):
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause(1) == 0  # omp_pause_soft: the threads end; a later parallel region in this thread starts anew


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Add] = {}
        # Prompt tokens of requests admitted but not yet in the scheduler (the command queue, and the moment
        # between the overloaded check and the submission): the estimate must count them, or a burst that
        # arrives within one step all passes the check.
        self._queued: dict[str, int] = {}
        self._stop = False
        self.error: BaseException | None = None
        # Seconds per computed token, smoothed: the queue estimate behind "overloaded".
        self.seconds_per_token = 0.0
        self.step_overhead = 0.0
        # Called in the step thread after every step with the engine (metrics, tests). Must be quick.
        self.step_listeners: list = []
        self.snapshot = EngineSnapshot.of(engine)  # replaced (never changed) by the step thread
        # From here on the step thread does the computing: the loading thread's pool would only make libgomp
        # stop spinning in the step thread's barriers (release_thread_pool).
        release_thread_pool()
        self._thread = threading.Thread(target=self._run, name="warmpath-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.engine.close()

    # -- event-loop side -------------------------------------------------------------------------------
    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        session_id: str | None = None,
        deadline: float | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. Leaving the iteration early (client gone, cancelled) aborts it."""
        if not self.alive:
            raise EngineDeadError("the engine loop is not running")
        self.engine.validate(prompt_token_ids, params)  # bad input fails here, in the caller
        self._queued[request_id] = len(prompt_token_ids)
        stream: asyncio.Queue = asyncio.Queue()
        self._commands.put(_Add(request_id, prompt_token_ids, params, session_id, deadline, cache_salt, stream,
                                asyncio.get_running_loop()))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))
        self._wake.set()

    def warm_up(self, request_id: str, prompt_token_ids: list[int], session_id: str | None,
                cache_salt: str | None = None) -> None:
        """Compute a refused request's prompt for its session's next one (Engine.warm_up), in the step thread."""
        self._commands.put(_WarmUp(request_id, list(prompt_token_ids), session_id, cache_salt))
        self._wake.set()

    def reserve(self, request_id: str, num_tokens: int) -> None:
        """Count a request about to be submitted in the estimate from now on (see _queued)."""
        self._queued[request_id] = num_tokens

    def unreserve(self, request_id: str) -> None:
        self._queued.pop(request_id, None)

    def estimate_wait(self) -> float:
        """Seconds until a new request could be scheduled: the prompt tokens queued ahead of it (waiting
        requests and unfinished prefills, and those not yet taken from the command queue), at the measured
        cost per token and per step. With prompt chunks paced (Scheduler.latency_chunk), what is ahead takes at
        most a chunk each per step: if that leaves room in the budget, the new request joins the next step."""
        snap, budget = self.snapshot, self.engine.config.max_num_batched_tokens
        remaining = [*snap.prompt_left, *self._queued.values()]  # warm-ups yield to everyone: not counted
        cap, quick = snap.latency_chunk, snap.clock() < snap.quick_until
        step = sum(min(n, cap) for n in remaining) if cap is not None and quick else budget
        if step < budget:  # the step that is running, then ours
            return step * self.seconds_per_token + (self.step_overhead if step else 0.0)
        ahead = sum(remaining)
        steps = -(-ahead // budget)
        return ahead * self.seconds_per_token + steps * self.step_overhead

    # -- step thread -----------------------------------------------------------------------------------
    def _drain_commands(self) -> None:
        """Take in the queued commands, then publish the snapshot: a request leaves _queued only once the snapshot
        that counts it in the scheduler is out, so estimate_wait never misses it in between."""
        added = []
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                try:
                    self.engine.add_request(cmd.request_id, cmd.prompt_token_ids, cmd.params, cmd.session_id,
                                            cmd.deadline, cmd.cache_salt)
                    self._streams[cmd.request_id] = cmd
                except Exception as e:  # validated already; anything left goes back to its caller
                    cmd.loop.call_soon_threadsafe(cmd.stream.put_nowait, e)
                added.append(cmd.request_id)  # in the scheduler now (counted there), or refused
            elif isinstance(cmd, _WarmUp):
                self.engine.warm_up(cmd.request_id, cmd.prompt_token_ids, cmd.session_id, cmd.cache_salt)
            else:
                self.engine.abort(cmd.request_id)
        self.snapshot = EngineSnapshot.of(self.engine)
        for request_id in added:
            self._queued.pop(request_id, None)

    def _run(self) -> None:
        try:
            while not self._stop:
                self._drain_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait()
                    self._wake.clear()
                    continue
                before = self.engine.stats()["num_computed_tokens"]
                t = time.perf_counter()
                outputs = self.engine.step()
                self._learn_cost(self.engine.stats()["num_computed_tokens"] - before, time.perf_counter() - t)
                self.snapshot = EngineSnapshot.of(self.engine)
                for listener in self.step_listeners:
                    listener(self.engine)
                for out in outputs:
                    sub = self._streams.get(out.request_id)
                    if sub is None:
                        continue
                    if out.finished:
                        del self._streams[out.request_id]
                    sub.loop.call_soon_threadsafe(sub.stream.put_nowait, out)
        except BaseException as e:  # the loop is dead: every waiter hears it, /health turns 503
            log.exception("engine loop died")
            self.error = e
            for sub in self._streams.values():
                sub.loop.call_soon_threadsafe(sub.stream.put_nowait, EngineDeadError(f"engine loop died: {e!r}"))
            self._streams.clear()

    def _learn_cost(self, tokens: int, seconds: float) -> None:
        """Step time ~ overhead + tokens x cost: small steps (decodes) teach the overhead, big ones the cost."""
        def ema(old: float, new: float) -> float:
            return new if old == 0 else 0.8 * old + 0.2 * new

        if tokens >= 64:
            self.seconds_per_token = ema(self.seconds_per_token, max(0.0, seconds - self.step_overhead) / tokens)
        elif tokens > 0:
            self.step_overhead = ema(self.step_overhead, seconds)
