"""AsyncEngine: the Engine steps in its own thread; each request gets an asyncio stream of deltas.

Only the step thread touches the Engine. The event loop submits a request (submit(): checked, or
refused when it cannot start before its deadline, before any answer starts), hands the step thread
commands (add, abort, warm up) through a thread-safe queue drained at every step boundary, gets
outputs back with call_soon_threadsafe, and reads the engine's state from the EngineSnapshot the
step thread publishes at each boundary. torch releases the GIL inside its kernels, so the HTTP loop
keeps serving while a step computes. When there is no work the thread sleeps on an Event; a new
command wakes it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from warmpath.engine.deadline import expires_at, refusal
from warmpath.engine.engine import Engine
from warmpath.engine.request import EngineRequest, FinishReason, RequestMetrics, RequestOutput

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The step loop died; the server answers 503 until restarted."""


class RequestStream:
    """One submitted request's outputs, read in the event loop. It ends at the request's deadline
    even between step boundaries (a step may be long): its last output then says DEADLINE, and the
    engine aborts the request (Scheduler.abort keeps a late prompt warming for its session). Closing
    it before its end aborts the request."""

    def __init__(self, owner: AsyncEngine, request: EngineRequest,
                 refused: FinishReason | None = None):
        self.owner, self.request = owner, request
        self.finished = False
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._last: RequestOutput | None = None
        if refused is not None:
            self._queue.put_nowait(self._end(refused))

    def put(self, item: RequestOutput | BaseException) -> None:
        """From the step thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        end = expires_at(self.request, bool(self._last and self._last.token_ids))
        try:
            item = await asyncio.wait_for(self._queue.get(),
                                          None if end is None else max(0.0, end - time.monotonic()))
        except TimeoutError:
            self.close()
            return self._end(FinishReason.DEADLINE)
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self._last, self.finished = item, item.finished
        return item

    def close(self) -> None:
        """Abort the request in the engine unless it has finished; then nothing more is read."""
        if not self.finished:
            self.finished = True
            self.owner.abort(self.request.request_id)

    def _end(self, reason: FinishReason) -> RequestOutput:
        """The last output of a request the engine has not finished (late, or refused unrun)."""
        last = self._last
        if last is not None:
            return replace(last, new_token_ids=[], new_logprobs=None, finished=True,
                           finish_reason=reason)
        r = self.request
        return RequestOutput(r.request_id, r.prompt_token_ids, [], [], None, "", True, reason, 0,
                             RequestMetrics(arrival_time=time.perf_counter()))


@dataclass
class _Add:
    request: EngineRequest
    stream: RequestStream


@dataclass(frozen=True)
class EngineSnapshot:
    """What the event loop and /metrics may read of the engine: published by the step thread at each
    step boundary (after the commands are taken in, and after each step), so nothing outside it
    reads live state."""

    stats: dict  # Engine.stats()
    # prompt tokens still to compute, per waiting or running request (warm-ups not)
    prompt_left: tuple[int, ...]
    latency_chunk: int | None  # Scheduler.latency_chunk
    quick_until: float  # Scheduler.quick_until(), on `clock`
    clock: Callable[[], float]

    @classmethod
    def of(cls, engine: Engine) -> EngineSnapshot:
        sched = engine.scheduler
        return cls(engine.stats(), sched.prompt_left(), sched.latency_chunk, sched.quick_until(),
                   sched.clock)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _WarmUp:
    request: EngineRequest
    keystroke: bool = True  # False: the client's own warm-up (Engine.warm_up)


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker pool (torch's libgomp, which the native kernel
    shares).

    Why: libgomp counts every pool's threads, and once there are more than cores it stops spinning
    at barriers (a few hundred iterations, whatever OMP_WAIT_POLICY / GOMP_SPINCOUNT say) and sleeps
    on a futex instead, at each of a step's parallel regions. Loading the model in the main thread
    leaves a pool there; with the step thread's own pool a 2-core machine has 4 (docs/benchmarks.md,
    "Server vs engine", has the cost). Returns whether the runtime had omp_pause_resource_all
    (OpenMP 5.0)."""
    try:
        pause = ctypes.CDLL(None).omp_pause_resource_all
    except (AttributeError, OSError):
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    # omp_pause_soft: the threads end; a later parallel region in this thread starts anew
    return pause(1) == 0


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        # Prompt tokens of requests submitted but not yet in the scheduler (the command queue): the
        # estimate must count them, or a burst that arrives within one step all passes the check.
        self._queued: dict[str, int] = {}
        self._stop = False
        self.error: BaseException | None = None
        # Called in the step thread after every step with the engine (metrics, tests). Must be
        # quick.
        self.step_listeners: list = []
        self.snapshot = EngineSnapshot.of(engine)  # replaced (never changed) by the step thread
        # From here on the step thread does the computing: the loading thread's pool would only make
        # libgomp stop spinning in the step thread's barriers (release_thread_pool).
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

    # -- event-loop side ---------------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> RequestStream:
        """The engine's door for the event loop, called before any answer starts: ValueError /
        PromptTooLongError for a request that can never run (Engine.check), EngineDeadError with the
        step loop dead. A request that cannot start before its deadline, given the work queued ahead
        of it, is refused unrun: its stream ends at once with OVERLOADED (DEADLINE when already
        past), and its session's prompt computes on at the lowest priority, so the session's next
        keystroke finds it cached (a refused cold file would never warm)."""
        if not self.alive:
            raise EngineDeadError("the engine loop is not running")
        self.engine.check(request)
        refused = refusal(request, time.monotonic(), self.estimate_wait())
        if refused is not None:
            self._send(_WarmUp(request))
            return RequestStream(self, request, refused)
        self._queued[request.request_id] = len(request.prompt_token_ids)
        stream = RequestStream(self, request)
        self._send(_Add(request, stream))
        return stream

    def warm_up(self, request: EngineRequest) -> None:
        """A client's own warm-up (llama.cpp's `n_predict: 0`): the prompt's full blocks computed at
        the lowest priority, in steps with nothing else, for the session's next request, which ends
        it (Scheduler.warm_up); nothing answers it. Raises as submit() does."""
        if not self.alive:
            raise EngineDeadError("the engine loop is not running")
        self.engine.check(request)
        self._send(_WarmUp(request, keystroke=False))

    def abort(self, request_id: str) -> None:
        self._send(_Abort(request_id))

    def _send(self, command: _Add | _Abort | _WarmUp) -> None:
        self._commands.put(command)
        self._wake.set()

    def estimate_wait(self) -> float:
        """Seconds until a new request could be scheduled: the prompt tokens queued ahead of it
        (waiting requests and unfinished prefills, and those not yet taken from the command queue),
        at what a step costs (StepCost). With prompt chunks paced (Scheduler.latency_chunk), what is
        ahead takes at most a chunk each per step: if that leaves room in the budget, the new
        request joins the next step."""
        snap, budget, cost = (self.snapshot, self.engine.config.scheduler.max_num_batched_tokens,
                              self.engine.cost)
        # warm-ups yield to everyone: not counted
        remaining = [*snap.prompt_left, *self._queued.values()]
        cap, quick = snap.latency_chunk, snap.clock() < snap.quick_until
        step = sum(min(n, cap) for n in remaining) if cap is not None and quick else budget
        if step < budget:  # the step that is running, then ours
            return cost.seconds(step, 1)
        ahead = sum(remaining)
        return cost.seconds(ahead, -(-ahead // budget))

    # -- step thread -------------------------------------------------------------------------------
    def _drain_commands(self) -> None:
        """Take in the queued commands, then publish the snapshot: a request leaves _queued only
        once the snapshot that counts it in the scheduler is out, so estimate_wait never misses it
        in between."""
        added = []
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                rid = cmd.request.request_id
                try:
                    self.engine.enqueue(cmd.request)
                    self._streams[rid] = cmd.stream
                except Exception as e:
                    # checked already (a reused id is left): the error goes back to its caller
                    cmd.stream.put(e)
                added.append(rid)  # in the scheduler now (counted there), or refused
            elif isinstance(cmd, _WarmUp):
                self.engine.warm_up(cmd.request, cmd.keystroke)
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
                    self._wake.wait(self.engine.heap.idle())
                    self._wake.clear()
                    continue
                if self.engine.scheduler.only_warm_ups():
                    # warm-ups yield to any keystroke: a trim may take their time (a node
                    # always warming some prompt is never idle)
                    self.engine.heap.idle()
                outputs = self.engine.step()
                self.snapshot = EngineSnapshot.of(self.engine)
                for listener in self.step_listeners:
                    listener(self.engine)
                for out in outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is None:
                        continue
                    if out.finished:
                        del self._streams[out.request_id]
                    stream.put(out)
        except BaseException as e:  # the loop is dead: every waiter hears it, /health turns 503
            log.exception("engine loop died")
            self.error = e
            for stream in self._streams.values():
                stream.put(EngineDeadError(f"engine loop died: {e!r}"))
            self._streams.clear()
