"""The episode loop in a process of its own, holding its own copy of the policy: `SamplerProcess`.

An `EpisodeSource(SamplerProcess(engine), ...)` runs its episodes here instead of in the trainer:
the whole episode loop (`rollout.rollout_batch`: render the prompts, sample, decode, run the
environments -- their rewards, time limits and faults -- build the Trajectories) moves, so the
trainer's interpreter only trains. With an `Overlapped` source around it, step s+1's episodes
run here while step s trains (the PipelineRL / prime-rl / verl-async scheme); alone, it samples
on-policy (the same episodes as the one-process run, bit for bit with the trainer's thread count).

    trainer process                                         sampler process (`threads` torch threads)
      EpisodeSource.take(draw)
        envs, groups, seeds
        SamplerProcess.rollout  -- envs, tasks, generator state -->  rollout_batch(own policy, ...)
                                <-- Trajectories, generator state, log records
        fault limit, the source's wrappers (rewards ...)
      optimizer step
      source.after_update(engine) -> probe: fingerprints and log-probs of a few rows (in the training thread)
        sync(probe)  -- weights (shared memory) + probe rows -->  copy into own model,
                        (no wait: checked when answered)      <-- did they change, fingerprints, log-probs

The trainer's side is a small RPC client: any thread sends a request (under a lock, so the pipe's
order is the order of sending), and one reader thread reads every answer, in that order, into the
request's future. Requests: `rollout` (episodes, from whichever thread takes the source's episodes:
an overlapped source's background thread) and `sync`. Alone, a sync is sent from the training thread
as soon as the update ends. Under an overlapped source (max_staleness K) the syncs are held
(`hold_syncs`): the update's probe and a copy of its weights wait until the rollouts of the step K
updates later are about to be sent, and the thread sending them sends the sync first (`send_held`),
so every episode of step s is sampled with the weights after update s - K, whatever the threads'
timing. The shared copy of the weights is written only once the last sync was loaded (its answer
arrived). Every sync is checked (`trajtune.sources.sync`) before any episode sampled after it
reaches the trainer; held, its check is logged in the row of the step whose episodes it preceded
(`sync/logprob_diff` from row K + 2 on), whatever the timing. A resumed run's process starts from the
checkpoint's weights, checked as the sync they stand for (due with the first rollout sent); the checks
of the syncs before the restored episodes were made by the process that sampled them.

Seeding: a call sends the state of its generator and sets the state the sampler leaves, so the
trainer's generator advances exactly as if it had run the episodes itself.

Faults and logs: an environment that raises or overruns fails its episode here, as in one
process (`trajtune.sources.faults`, the time limit armed in this process's main thread); the
warning naming the task and the user's traceback is logged here and re-emitted in the trainer by
its logger. Any other exception of the episode loop (a token budget that does not fit, a bad
task) is raised again in the trainer, as the same exception, with the sampler's traceback as a note.

Start: at the first rollout, with the weights the trainer holds then (a resumed run's, restored);
that first batch runs in the trainer while the process starts. On a CPU with one sampler thread
the process is a fork of the trainer (a few ms: every module imported, the weights shared
copy-on-write), taken from the main thread before any background thread of the source exists.
Otherwise it is forked from a fork server that has imported this module (Python's "forkserver",
booting while the trainer samples the first batch; seconds: a fresh interpreter imports torch, and
transformers to unpickle a Hugging Face model): a fork would break CUDA, and GNU OpenMP hangs in a
fork that runs more than one thread after the trainer used its pool.

Lifetime: the process ignores SIGINT and SIGTERM (a terminal's Ctrl-C, or a scheduler's stop
signal, reaches the whole process group: the trainer finishes its step, checkpoints, then closes
it), exits when the trainer's end of the pipe closes, and within a second of the trainer's death
even in the middle of a call (it watches its parent). The reader never blocks blindly: it polls,
and a process that died fails every waiting request with `SamplerDied` naming the exit code or
signal; one that does not answer within `timeout_s` is killed and named the same way. `close()`
stops it (killed if it is in the middle of a rollout); the source closes it however the run ends.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import pickle
import signal
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import Any, Sequence, cast

import torch
import torch.multiprocessing as mp
from multiprocessing.connection import Connection

from ..config import ConfigError
from ..engine import Engine
from ..trajectory import Owner, Trajectory, collate
from .episodes import Limits, run_episodes
from ..engine.decoding import Samples
from .sampler import Decoder, SamplerSettings, Seeds
from .serve import emit, reraised, serve, state_bytes, state_tensor
from .sync import HeldSyncs, SamplerDied, SyncError, SyncProbe, check_sync, probe, weight_fingerprints

__all__ = ["SamplerProcess", "SamplerDied", "SyncError", "start_method"]


class SamplerProcess(HeldSyncs):
    """An `EpisodeRunner` whose episode loop runs in a process holding its own copy of the policy
    (`engine.policy_weights()`), brought up to date (and checked) by `after_update` (module docstring).

    engine:     the trainer's engine (one process: no torchrun)
    settings:   how its sampler draws (`trajtune.sources.sampler.Decoder` on the process's copy of the weights)
    threads:    torch threads in the sampler process
    tolerance:  largest allowed |sampler - trainer| log-prob of a probe token after a sync (nats)
    timeout_s:  longest wait for one answer (a rollout, a sync) before the process is killed and `SamplerDied`
                raised (0: no limit; a process that dies is reported at once)
    """

    PROBE_ROWS = 2
    """rows of the last episodes on which the sampler's and the trainer's log-probs are compared after a sync"""

    def __init__(self, engine: Engine, settings: SamplerSettings = SamplerSettings(), threads: int = 1,
                 tolerance: float = 1e-3, timeout_s: float = 600.0):
        self.engine, self.threads, self.tolerance, self.timeout_s = engine, threads, tolerance, timeout_s
        self.sampler = Decoder(engine.sample, settings)  # the first rollout's, here (the process runs its own)
        self.calls = 0
        """rollouts answered by the process so far (an overlapped source checks that its episodes came here)"""
        self._process: Any = None  # started by the first rollout
        self._cv = threading.Condition()  # guards the pipe's sends, the queue of requests and the state below
        self._waiting: collections.deque[_Request] = collections.deque()  # sent, not answered, in pipe order
        self._syncs: list[tuple[_Request, SyncProbe, int]] = []  # sent, not yet checked, in order; with its due step
        self._held: dict = {}  # fingerprints of the weights the sampler holds (as last checked)
        self._diffs: list[tuple[int, float]] = []  # (due step, log-prob difference) of the syncs checked, not reported
        self._probe_rows: list[Trajectory] = []
        self._renderers: dict[int, Any] = {}  # sent once, by id (kept alive here, so the id stays theirs)
        self._dead: BaseException | None = None
        self._closed = False
        self._rollouts_sent = 0
        self._unchecked_start = False  # started on trained weights, not yet checked (`_check_start`)
        self._init_holding()

    # --- what an EpisodeSource calls -------------------------------------------------------------
    def rollout(self, envs: Sequence, tasks: Sequence, renderer: Any, generator: torch.Generator | None,
                limits: Limits, groups: Sequence[int] | None = None,
                row_seeds: Sequence[int] | None = None) -> list[Trajectory]:
        """`episodes.run_episodes(sampler, envs, tasks, renderer, generator, limits, ...)` with the process's copy
        of the policy; `generator` advances as if the episodes ran here. The first call runs here, while the
        process starts (unless the process rounds its weights, `SamplerSettings.weights_dtype`: then there)."""
        if self._process is None and self.settings.weights_dtype == "fp32":
            self.start()
            trajs = run_episodes(self.sampler, envs, tasks, renderer, generator, limits, groups, row_seeds)
        else:  # (a process drawing from rounded weights draws every step, the first too)
            self.start()
            trajs = self._remote(envs, tasks, renderer, generator, (limits, groups, row_seeds))
        self.keep_probe_rows(trajs)
        self._check_start()
        return trajs

    @property
    def settings(self) -> SamplerSettings:
        return self.sampler.settings

    def sample(self, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int], seeds: Seeds, *,
               max_new_tokens: int | None = None) -> Samples:
        """The `Sampler` seam on the process's copy of the weights (started with the trainer's current ones if it
        is not running yet): the same samples as `Decoder(engine.sample, settings)` here would draw with those
        weights, and `seeds` (one generator, or one per row) advance as if they had. `max_new_tokens`: this call's
        budget instead of the settings' (a partial rollout's chunk: `trajtune.sources.partial`)."""
        self.start()
        settings = self.sampler.settings
        if max_new_tokens is not None:
            settings = dataclasses.replace(settings, max_new_tokens=max_new_tokens)
        many = seeds is not None and not isinstance(seeds, torch.Generator)
        gens: list[torch.Generator | None] = list(cast(Sequence[torch.Generator], seeds)) if many else [
            cast(torch.Generator | None, seeds)]
        states: Any = [state_bytes(g) if g is not None else None for g in gens]
        payload = pickle.dumps(([list(p) for p in prompts], list(stop_ids), states if many else tuple(states),
                                settings))
        samples, after, records = self._wait(self._send("sample", payload))
        emit(records)
        self._check_syncs()  # every sync sent before these samples was loaded before them
        for g, state in zip(gens, after, strict=True):
            if g is not None:
                g.set_state(state_tensor(state))
        return samples

    def keep_probe_rows(self, trajs: Sequence[Trajectory]) -> None:
        """Take the next syncs' probe rows from `trajs` (the first with POLICY tokens): every rollout does, and an
        overlapped source with the episodes it hands the loop (after a resume, before any rollout came back)."""
        rows = [t for t in trajs if t.count(Owner.POLICY)][: self.PROBE_ROWS]
        if rows or not self._probe_rows:
            self._probe_rows = rows or list(trajs[: self.PROBE_ROWS])

    def after_update(self, engine) -> dict[str, float]:
        """The trainer's weights changed: send them (shared memory) and the probe rows, without waiting for the
        process to load them -- or, holding (`hold_syncs`), keep a copy to send before a later rollout. -> {"sync/
        logprob_diff": the largest difference of the syncs checked since the last call} ({} if none)."""
        if self._process is None or not self._probe_rows:  # nothing sampled yet: it starts from the current weights
            return {}
        p = probe(engine, collate(self._probe_rows, 0))  # in the training thread, on the weights just written
        if not self.holding:
            self._send_sync(p, None, engine, -1)
        else:
            with torch.no_grad(), engine.policy_weights() as model:
                self._hold((p, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}))
        if self.holding:  # the checks of the syncs due by the last step taken (sent before its
            futures_wait([r.future for r, _, due in list(self._syncs) if due <= self._taken])  # rollouts: answered)
            self._check_syncs()
        with self._cv:
            diffs = [d for due, d in self._diffs if due <= self._taken]
            self._diffs = [(due, d) for due, d in self._diffs if due > self._taken]
        return {"sync/logprob_diff": max(diffs)} if diffs else {}

    def _send_held(self, due: int, item: tuple[SyncProbe, dict[str, torch.Tensor]]) -> None:
        self._send_sync(item[0], item[1], None, due)

    def _failed(self) -> BaseException | None:
        return self._dead or (SamplerDied("the sampler process is closed") if self._closed else None)

    def _send_sync(self, p: SyncProbe, weights: dict[str, torch.Tensor] | None, engine, due: int) -> None:
        """Publish `weights` (or the engine's current ones) into the shared copy once the process loaded the last
        sync, and send the sync with probe `p`."""
        if self._syncs:  # the shared copy is free once the last sync was loaded (answers come in order)
            futures_wait([self._syncs[-1][0].future])
        self._check_syncs()
        if weights is None:
            with torch.no_grad(), engine.policy_weights() as model:
                self._publish(model.state_dict())
        else:
            self._publish(weights)
        request = self._send("sync", p.ids.numpy(), p.mask.numpy())
        with self._cv:
            self._syncs.append((request, p, due))

    def start(self) -> None:
        """Start the process now, with the trainer's current weights (idempotent; otherwise the first `rollout`
        starts it and runs its own episodes here meanwhile). Call it from the main thread: the process may be a
        fork of this one."""
        if self._process is None:
            self._start()
            self._check_start()

    def _check_start(self) -> None:
        """A process started on trained weights (a resumed run's: optimizer step > 0) has its first copy checked
        like a sync -- the same fingerprints and log-probs, on the first probe rows there are (the restored episodes
        drawn ahead, or the first rollout's, sampled here) -- so the first step after a resume logs
        sync/logprob_diff as every later one does. Call it in the thread that trains."""
        if not self._unchecked_start or not self._probe_rows:
            return
        self._unchecked_start = False
        p = probe(self.engine, collate(self._probe_rows, 0))
        request = self._send("sync", p.ids.numpy(), p.mask.numpy())  # the shared copy holds the starting weights
        with self._cv:  # holding: due with the first rollout sent, as the sync it stands for (module docstring)
            self._syncs.append((request, p, -1 if self._hold_until is None else self._hold_until))

    def close(self) -> None:
        """Stop the process (idempotent): asked to exit when only syncs are outstanding, killed in the middle of a
        rollout (an interrupted or failed step) or when it does not exit within a few seconds."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            busy = any(r.kind in ("rollout", "sample") for r in self._waiting)
            self._cv.notify_all()
        if self._process is None:
            return
        self._booted.wait()
        if self._process.pid is not None:  # started
            if not busy and self._process.is_alive():
                try:
                    self._conn.send_bytes(pickle.dumps(("close",)))
                except OSError:
                    pass
                self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
        self._reader.join()
        self._conn.close()
        self._fail(SamplerDied("the sampler process was closed"))

    def __enter__(self) -> "SamplerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        if self._process is None:
            return None
        self._booted.wait()
        return self._process.pid

    def _publish(self, weights: dict[str, torch.Tensor]) -> None:
        """Write the trainer's weights (a state dict) into the shared copy the process loads from (only once it
        loaded the last)."""
        with torch.no_grad():
            for k, v in weights.items():
                self._shared[k].copy_(v.detach())

    # --- requests -------------------------------------------------------------------------------
    def _remote(self, envs, tasks, renderer, generator, loop) -> list[Trajectory]:
        rid = id(renderer)
        fresh = rid not in self._renderers
        try:
            payload = pickle.dumps((list(envs), list(tasks), rid, renderer if fresh else None,
                                    state_bytes(generator) if generator is not None else None,
                                    self.sampler.settings, loop))
        except Exception as e:  # noqa: BLE001 - named below
            raise ConfigError(f"sampling.max_staleness 1 / sampling.sampler_process: the episodes run in the sampler "
                              f"process, but {_unpicklable(envs, tasks, renderer)} cannot be sent there "
                              f"({type(e).__name__}: {e}); define environments, tasks and the renderer with "
                              "module-level classes and functions (picklable), or sample in the trainer "
                              "(max_staleness 0, sampler_process false)") from None
        if fresh:
            self._renderers[rid] = renderer
        trajs, state, records = self._wait(self._send("rollout", payload))
        emit(records)
        self._check_syncs()  # every sync sent before these episodes was loaded before them: checked first
        if generator is not None:
            generator.set_state(state_tensor(state))
        self.calls += 1
        return trajs

    def _send(self, kind: str, *args) -> "_Request":
        """Send one request; its answer arrives in order (the reader thread). Sends are serialised with the queue,
        so the pipe's order is the queue's."""
        self._booted.wait()
        message = pickle.dumps((kind, *args))
        with self._cv:
            if self._dead is not None:
                raise self._dead
            if self._closed:
                raise SamplerDied("the sampler process is closed")
            try:
                self._conn.send_bytes(message)
            except OSError:
                self._process.join(timeout=5)
                raise self._died(kind) from None
            request = _Request(kind)
            self._waiting.append(request)
            self._rollouts_sent += kind in ("rollout", "sample")
            self._cv.notify_all()
        return request

    def _wait(self, request: "_Request"):
        """The answer to `request` (its log records re-emitted and its error raised here)."""
        status, *reply = request.future.result()
        if status == "error":
            exc_bytes, tb, records = reply
            emit(records)
            raise reraised(exc_bytes, tb, request.kind)
        return reply[0]

    def _check_syncs(self) -> None:
        """Check the answered syncs, in order (a failed check raises `SyncError`); stop at the first unanswered."""
        with self._cv:
            while self._syncs and self._syncs[0][0].future.done():
                request, p, due = self._syncs.pop(0)
                changed, theirs, their_logp = self._wait(request)
                worst, _ = check_sync(p.step, p.fingerprints, [theirs], p.logprobs, torch.from_numpy(their_logp),
                                      p.action_mask, self.tolerance, held=self._held, changed=changed)
                self._diffs.append((due, worst))
                self._held = p.fingerprints

    # --- the reader thread --------------------------------------------------------------------------
    def _read(self) -> None:
        """Read every answer, in order, into its request's future; fail them all if the process dies or a request
        waits past `timeout_s` (the process is then killed)."""
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if not self._waiting:
                    return
                head = self._waiting[0]
            try:
                ready = self._conn.poll(1.0)
                message = pickle.loads(self._conn.recv_bytes()) if ready else None
            except (EOFError, OSError, ValueError):
                self._fail(self._died(head.kind))
                return
            if message is not None:
                with self._cv:
                    self._waiting.popleft()
                    if self._waiting:
                        self._waiting[0].since = time.monotonic()
                head.future.set_result(message)
            elif not self._process.is_alive():
                self._fail(self._died(head.kind))
                return
            elif self.timeout_s and time.monotonic() - head.since > self.timeout_s:
                self._process.kill()
                self._fail(SamplerDied(
                    f"the sampler process (pid {self._process.pid}) did not answer {head.kind!r} within "
                    f"{self.timeout_s:g} s (sampling.sampler_timeout) and was stopped; the run stops (rerun it to "
                    "resume from its last checkpoint; raise the limit for long episodes)"))
                return

    def _fail(self, error: BaseException) -> None:
        """Every waiting request fails with `error`, and so does every later one."""
        with self._cv:
            self._dead = self._dead or error
            waiting, self._waiting = list(self._waiting), collections.deque()
            self._cv.notify_all()
        for request in waiting:
            if not request.future.done():
                request.future.set_exception(error)

    def _died(self, kind: str) -> SamplerDied:
        self._process.join(timeout=5)
        code = self._process.exitcode
        if code is None:
            cause = "its pipe closed while it still runs"
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            oom = " (e.g. the kernel's out-of-memory killer)" if -code == signal.SIGKILL else ""
            cause = f"killed by {name}{oom}"
        else:
            cause = f"it exited with code {code} (its error, if any, is printed above)"
        return SamplerDied(f"the sampler process (pid {self._process.pid}) died while answering {kind!r}: {cause}; "
                           "the run stops (rerun it to resume from its last checkpoint)")

    # --- start ------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the process with the trainer's current weights (a fork now, from this thread; a fork server's
        child from a thread, so the trainer samples its first batch meanwhile) and the reader thread."""
        engine = self.engine
        with engine.policy_weights() as model:
            self._start_with(engine, model)

    def _start_with(self, engine: Engine, model: torch.nn.Module) -> None:
        self._shared = {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in model.state_dict().items()}
        self._held = weight_fingerprints(model)  # what the sampler holds: it starts from these weights
        self._unchecked_start = engine.step > 0
        levels = {name: logging.getLogger(name).getEffectiveLevel() for name in ("", "trajtune")}
        fork = start_method(engine, self.threads) == "fork"
        ctx = mp.get_context("fork") if fork else _forkserver()
        self._conn: Connection
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=serve, args=(child, self._conn, model if fork else pickle.dumps(model), self._shared,
                                 self.threads, engine.autocast, str(engine.device), levels,
                                 self.sampler.settings.weights_dtype),
            daemon=True, name="trajtune-sampler")
        self._booted = threading.Event()
        if fork:
            self._boot(child)
        else:
            threading.Thread(target=self._boot, args=(child,), daemon=True, name="trajtune-sampler-start").start()
        self._reader = threading.Thread(target=self._read, daemon=True, name="trajtune-sampler-reader")
        self._reader.start()

    def _boot(self, child) -> None:
        try:
            self._process.start()
        except BaseException as e:  # noqa: BLE001 - every request reports it
            self._fail(SamplerDied(f"the sampler process could not start: {type(e).__name__}: {e}"))
        finally:
            child.close()
            self._booted.set()


class _Request:
    """One message sent to the process, and the future its answer goes into."""

    def __init__(self, kind: str):
        self.kind, self.since = kind, time.monotonic()
        self.future: Future = Future()


def start_method(engine, threads: int) -> str:
    """"fork" where a fork of the trainer is safe (a CPU engine, no CUDA initialised, one sampler thread,
    Linux, asked from the main thread), else "forkserver" (module docstring)."""
    cpu = engine.device.type == "cpu" and not torch.cuda.is_initialized()
    main = threading.current_thread() is threading.main_thread()
    return "fork" if cpu and main and threads == 1 and sys.platform == "linux" else "forkserver"


def _forkserver():
    """A fork server that has imported this module: a clean process, started in a fraction of spawn's time
    after the first (no torch import each)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx



def _unpicklable(envs: Sequence, tasks: Sequence, renderer: Any) -> str:
    """Which part of a rollout call pickle refuses (for the error message)."""
    parts = [(f"the environment {type(e).__name__}", e) for e in envs[:1]]
    parts += [(f"task {getattr(t, 'name', repr(t))!r}", t) for t in tasks]
    parts += [(f"the renderer {type(renderer).__name__}", renderer)]
    for what, obj in parts:
        try:
            pickle.dumps(obj)
        except Exception:  # noqa: BLE001 - this is the one
            return what
    return "the call"
