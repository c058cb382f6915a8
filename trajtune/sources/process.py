"""A sampler in its own process, holding its own copy of the policy: the rollout side of overlapped RL.

With `RLConfig.max_staleness = 1` the RL loop (algorithms/rl.py) trains step s in a thread
while its main thread collects step s+1's episodes; those episodes run here, in a separate
process, with a copy of the policy one update behind (the PipelineRL / prime-rl / verl-async
scheme). The whole episode loop moves (`rollout.rollout_batch`: render the prompts, sample,
decode, run the environments -- their rewards, time limits and faults -- and build the
Trajectories), so the trainer's interpreter only trains. What stays in the trainer is what a
collect does around its episodes (`collect.make_collect`: tasks, groups, seeds, the run-level
fault limit; an experiment's counters and batch reward functions):

    trainer process                                       sampler process (`threads` torch threads)
      collect(tasks, n, g)
        make_collect: envs, groups, seeds
        rollout_batch(engine.sample, ...)  -- envs, tasks, generator state -->  rollout_batch(own policy, ...)
                                           <-- Trajectories, generator state, log records
        check_faults, counters ...
      optimizer step, probe(rows): its fingerprints and log-probs of a few rows (in the training thread)
      sync(probe)  -- weights (shared memory) + probe rows -->  copy into own model,
                   (no wait: the answer is read, and checked,    log-probs of the probe
                    before the next rollout's episodes)  <-- did they change, their fingerprints, probe log-probs

Routing: while the loop collects (`SamplerProcess.routing()`, in its own thread only), the
episodes `make_collect` runs with `engine.sample` as the sampler go to this process
(`routed(policy)`); any other sampler (HF generate, another model) stays in the trainer, and the
loop refuses a collect that sampled without coming here. The renderer crosses once (then by
reference); environments and tasks are pickled with every call (a few kB).

Seeding: a call sends the state of its generator and sets the state the sampler leaves, so the
trainer's generator advances exactly as if it had run the episodes itself (per-episode seeds
are drawn in the trainer): the episodes are the ones `rollout_batch` gives on the same weights
in the trainer, bit for bit with the trainer's thread count.

Faults and logs: an environment that raises or overruns fails its episode here, as in one
process (`trajtune.sources.faults`, the time limit armed in this process's main thread); the warning
naming the task and the user's traceback is logged here and re-emitted in the trainer by its
logger. Any other exception of the episode loop (a token budget that does not fit, a bad task)
is raised again in the trainer, as the same exception, with the sampler's traceback as a note.

Start: on a CPU with one sampler thread the process is a fork of the trainer (a few ms: it
has every module imported and the weights in memory already, shared copy-on-write). Otherwise
it is forked from a fork server that has imported this module (Python's "forkserver" start
method, booting while the trainer samples the first batch itself; seconds: a fresh interpreter
imports torch, and transformers to unpickle a Hugging Face model): a fork would break CUDA,
and GNU OpenMP hangs in a fork that runs more than one thread after the trainer used its pool.
The fork is taken from the trainer's main thread (a loop run from another thread gets the fork
server) before the loop starts its update thread;
the child drops the trainer's log handlers, signal handlers and its copy of the trainer's end
of the pipe.

Lifetime: the process ignores SIGINT and SIGTERM (a terminal's Ctrl-C, or a scheduler's stop
signal, reaches the whole process group: the trainer finishes its step, checkpoints, then closes
it), exits when the trainer's end of the pipe closes, and within a second of the trainer's death
even in the middle of a call (it watches its parent).
The trainer never waits on it blindly: it polls, and a sampler that died raises `SamplerDied`
naming the exit code or signal at once; one that does not answer within `timeout_s` is killed
and raises the same. `close()` stops it (killed if it was in the middle of a call); the loop
closes it however the run ends.

Weights travel through one shared-memory copy of the state dict, allocated once (the
trainer writes it after an optimizer step, the sampler copies it into its own model
before it answers). The trainer does not wait for a sync: its answer is read when the
next rollout is asked for (the pipe keeps the order: sync, then those episodes), so the
sampler loads and checks the weights while the trainer logs and starts its next update
(the probe's own forward ran in the training thread), and no episode sampled on weights
that failed the check reaches the trainer. Every sync is checked, since a sync that silently
does nothing is the classic failure of asynchronous RL:

  * the sampler's weights must change when the trainer's did (the fingerprints it held / after the copy);
  * the sampler's weights must then equal the trainer's, tensor by tensor (fingerprints);
  * the sampler's and the trainer's log-probs of the same tokens (a few rows of the
    step's batch) must agree to `tolerance` (max abs difference over POLICY tokens, nats),
    returned as `sync/logprob_diff`.

A failed check raises `SyncError` naming what differs; the run stops.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.multiprocessing as mp
from concurrent.futures import Future
from multiprocessing import connection as mp_connection

from ..config import ConfigError
from ..engine import AUTOCAST_DTYPES
from ..logprobs import token_log_probs
from ..processes import exit_with_parent
from .rollout import rollout_batch
from ..engine.decoding import sample
from ..trajectory import Batch, Trajectory


class SyncError(RuntimeError):
    """The trainer and its sampler process out of step: a weight sync that did not take (the message
    says how), or a sampler process that died or stopped answering (`SamplerDied`)."""


class SamplerDied(SyncError):
    """The sampler process exited, was killed, or did not answer within its time limit."""


_local = threading.local()


def routed(policy: Any) -> "SamplerProcess | None":
    """The sampler process that runs the episodes of `policy` (an engine's `sample`) in this thread
    now -- an overlapped RL loop collecting (`SamplerProcess.routing`) -- else None."""
    return getattr(_local, "routes", {}).get(policy)


@dataclass
class SyncProbe:
    """The trainer's side of one weight sync check (`SamplerProcess.probe`): the probe rows, the trainer's
    log-probs of them and its weights' fingerprints after optimizer step `step`."""

    ids: torch.Tensor  # [b, T]
    mask: torch.Tensor  # [b, T] attention mask
    action_mask: torch.Tensor  # [b, T-1] bool: the POLICY tokens compared
    logprobs: torch.Tensor  # [b, T-1] the trainer's log-probs
    fingerprints: dict[str, tuple[int, int, int]]  # weight_fingerprints, per tensor
    step: int


class SamplerProcess:
    """A process that runs episodes with its own copy of `engine.model`, synced by `sync()`.

    engine:     the trainer's engine (its model is copied once at start; one process, no torchrun)
    threads:    torch threads in the sampler process
    tolerance:  largest allowed |sampler - trainer| log-prob of a probe token after a sync (nats)
    timeout_s:  longest wait for one answer (a call's episodes, a sync) before the process is killed
                and `SamplerDied` raised (0: no limit; a process that dies is reported at once)

    Use as a context manager, or call `close()`.
    """

    def __init__(self, engine, threads: int = 1, tolerance: float = 1e-3, timeout_s: float = 600.0):
        self.engine, self.tolerance, self.timeout_s = engine, tolerance, timeout_s
        model = engine.model
        self._shared = {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in model.state_dict().items()}
        self._synced = weight_fingerprints(model)  # what the sampler holds (it starts from these weights)
        self._renderers: dict[int, Any] = {}  # sent once, by id (kept alive here, so the id stays theirs)
        self.calls = 0
        """rollout() calls answered so far (the loop checks that a collect ran its episodes here)"""
        self._busy, self._closed, self._start_error, self._sent_at = False, False, None, 0.0
        self._pending: SyncProbe | None = None  # the sync in flight (sent, its answer not yet checked)
        self._early: tuple[Future, Callable[[], None]] | None = None  # `sync_when_done`'s job and what to run
        self._wake, self._wake_end = mp.Pipe(duplex=False)  # the job's thread wakes a wait on the sampler
        self._diffs: list[float] = []  # log-prob differences of the syncs checked since `checked()`
        levels = {name: logging.getLogger(name).getEffectiveLevel() for name in ("", "trajtune")}
        fork = start_method(engine, threads) == "fork"
        ctx = mp.get_context("fork") if fork else _forkserver()
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve, args=(child, self._conn, model if fork else pickle.dumps(model), self._shared, threads,
                                 getattr(engine, "autocast", None), str(engine.device), levels),
            daemon=True, name="trajtune-sampler")
        # a fork: now, from this thread (module docstring); a fork server: from a thread, so the trainer goes on
        # while it and the process boot; messages wait in the pipe until the process reads them
        self._starter = threading.Thread(target=self._start, args=(child,), daemon=True)
        if fork:
            self._start(child)
        else:
            self._starter.start()

    @property
    def pid(self) -> int | None:
        self._started()
        return self._process.pid

    # --- what the loop and collect.make_collect call -------------------------------------------
    @contextlib.contextmanager
    def routing(self) -> Iterator[None]:
        """While inside, `make_collect`'s episodes sampled by `engine.sample` run here (this thread only)."""
        routes = _local.__dict__.setdefault("routes", {})
        key = self.engine.sample
        routes[key] = self
        try:
            yield
        finally:
            routes.pop(key, None)

    def rollout(self, policy: Any, envs: Sequence, tasks: Sequence, renderer: Any,
                generator: torch.Generator | None, **kw: Any) -> list[Trajectory]:
        """`rollout.rollout_batch(policy, envs, tasks, renderer, generator, **kw)` in the sampler process,
        with its copy of the policy for `policy`; `generator` advances as if the episodes ran here."""
        rid = id(renderer)
        fresh = rid not in self._renderers
        try:
            payload = pickle.dumps((list(envs), list(tasks), rid, renderer if fresh else None,
                                    _state_bytes(generator) if generator is not None else None, kw))
        except Exception as e:  # noqa: BLE001 - named below
            raise ConfigError(f"RLConfig.max_staleness 1 / sampler_process: the episodes run in the sampler process, "
                              f"but {_unpicklable(envs, tasks, renderer)} cannot be sent there ({type(e).__name__}: "
                              f"{e}); define environments, tasks and the renderer with module-level classes and "
                              "functions (picklable), or set max_staleness 0 and sampler_process false") from None
        if fresh:
            self._renderers[rid] = renderer
        self._finish_sync()  # the sampler loaded the last weights before these episodes: checked first
        trajs, state, records = self._call("rollout", payload)
        _emit(records)
        if generator is not None:
            generator.set_state(_state_tensor(state))
        self.calls += 1
        return trajs

    def probe(self, batch: Batch) -> "SyncProbe":
        """What the trainer knows after an optimizer step (call it in the thread that trained): its weights'
        fingerprints and its log-probs of `batch`'s rows (ids [b, T]), for `sync` to check the sampler against."""
        logp = self.engine.forward(batch).logprobs.detach().float().cpu()  # [b, T-1]
        return SyncProbe(batch.ids.cpu(), batch.attention_mask.cpu(), batch.action_mask.bool().cpu(), logp,
                         weight_fingerprints(self.engine.model), self.engine.step)

    def sync(self, probe: "SyncProbe") -> None:
        """Send the trainer's current weights (those `probe` was taken on) and ask the sampler to load them.
        Does not wait: the sampler loads them before its next episodes, and the check (module docstring)
        completes when that answer arrives (`checked`), before any of those episodes reach the trainer."""
        self._finish_sync()  # at most one sync in flight
        self._publish()
        self._send("sync", probe.ids.numpy(), probe.mask.numpy())
        self._pending = probe

    def checked(self) -> dict[str, float]:
        """{"sync/logprob_diff": max |sampler - trainer| log-prob on the probe's POLICY tokens} of the syncs
        checked since the last call (the largest; {} if none)."""
        out, self._diffs = ({"sync/logprob_diff": max(self._diffs)} if self._diffs else {}), []
        return out

    def sync_when_done(self, job: Future, sync: Callable[[], None]) -> None:
        """Run `sync` (which calls `sync()`) in this thread as soon as `job` (an update in another thread) has
        finished without an error, even while waiting for the sampler's episodes: the sampler loads the weights
        as soon as it has sampled (with the weights it holds), while the trainer handles those episodes.
        Returns at once; `sync_if_not_done()` after the job runs it if no wait did."""
        self._early = (job, sync)
        job.add_done_callback(lambda _: self._wake_end.send_bytes(b"1"))

    def sync_if_not_done(self) -> bool:
        """After `sync_when_done`'s job: run its `sync` if no wait has -> whether it ran here."""
        early, self._early = self._early, None
        while self._wake.poll():
            self._wake.recv_bytes()
        if early is None:
            return False
        early[1]()
        return True

    def _run_early_sync(self) -> None:
        """`sync_when_done`'s sync, if its job finished well (in the thread waiting on the sampler)."""
        while self._wake.poll():
            self._wake.recv_bytes()
        if self._early is not None and self._early[0].done() and self._early[0].exception() is None:
            sync, self._early = self._early[1], None
            sync()

    def _finish_sync(self) -> None:
        """Wait for the answer to the sync in flight, if any, and check it; a failed check raises `SyncError`."""
        probe, self._pending = self._pending, None
        if probe is None:
            return
        changed, theirs, their_logp = self._receive("sync")
        diff = float((probe.logprobs - torch.from_numpy(their_logp)).abs()[probe.action_mask].max()) \
            if probe.action_mask.any() else 0.0
        if probe.fingerprints != self._synced and not changed:
            raise SyncError("weight sync failed: the trainer's weights changed at optimizer step "
                            f"{probe.step} but the sampler process's did not (it would sample with stale "
                            f"weights from now on); sampler-trainer log-prob difference {diff:.3g}")
        wrong = [k for k in probe.fingerprints if theirs.get(k) != probe.fingerprints[k]]
        if wrong or not diff <= self.tolerance:
            why = (f"the sampler's weights differ from the trainer's in {len(wrong)} tensor(s) ({', '.join(wrong[:3])})"
                   if wrong else "the weights are equal, but the two copies do not compute the same policy")
            raise SyncError(f"weight sync check failed after optimizer step {probe.step}: the sampler's and the "
                            f"trainer's log-probs of the same tokens differ by {diff:.3g} nats (tolerance "
                            f"{self.tolerance:g}, RLConfig.sync_tolerance); {why}")
        self._synced = probe.fingerprints
        self._diffs.append(diff)

    def close(self) -> None:
        """Stop the sampler process (idempotent): asked to exit, or killed if it is in the middle of a call
        (an interrupted or failed step) or does not exit within a few seconds."""
        if self._closed:
            return
        self._closed = True
        self._started()
        if self._process.pid is not None:
            if not self._busy and self._process.is_alive():
                try:
                    self._conn.send_bytes(pickle.dumps(("close",)))
                except OSError:
                    pass
                self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._conn.close()
        self._wake.close()
        self._wake_end.close()

    def __enter__(self) -> "SamplerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------
    def _started(self) -> None:
        if self._starter.is_alive():
            self._starter.join()

    def _start(self, child) -> None:
        try:
            self._process.start()
        except BaseException as e:  # noqa: BLE001 - reported by the first call
            self._start_error = e
        finally:
            child.close()

    def _publish(self) -> None:
        """Write the trainer's weights into the shared copy the sampler reads from."""
        with torch.no_grad():
            for k, v in self.engine.model.state_dict().items():
                self._shared[k].copy_(v.detach())

    def _call(self, kind: str, *args):
        """Send one message and wait for its answer (`_send`, `_receive`)."""
        self._send(kind, *args)
        return self._receive(kind)

    def _send(self, kind: str, *args) -> None:
        self._started()
        if self._start_error is not None:
            raise SamplerDied(f"the sampler process could not start: {type(self._start_error).__name__}: "
                              f"{self._start_error}")
        self._busy = True
        try:
            self._conn.send_bytes(pickle.dumps((kind, *args)))
        except OSError:
            raise self._died(kind) from None
        self._sent_at = time.monotonic()

    def _receive(self, kind: str):
        """Wait for the answer to `kind`, polling the process: a dead process or a timeout raises `SamplerDied`
        instead of a hang; an exception in the process is raised here."""
        started = self._sent_at
        # `sync_when_done`'s sync goes out only while episodes are awaited: the sampler has then answered the last
        # sync (`rollout` checks it first), so the shared weights are free to overwrite, and the new sync comes
        # after these episodes in the pipe (while the answer to a sync is awaited, it would come before them)
        early = kind == "rollout"
        while True:
            ready = mp_connection.wait([self._conn, self._wake] if early and self._early is not None else [self._conn],
                                       1.0)
            if self._conn in ready:
                break
            if self._wake in ready:
                try:
                    self._run_early_sync()  # sends a sync: its answer comes after the one awaited here
                except SamplerDied:  # it died on the call awaited here, before the sync could reach it
                    raise self._died(kind) from None
            if not self._process.is_alive():
                raise self._died(kind)
            if self.timeout_s and time.monotonic() - started > self.timeout_s:
                self._process.kill()
                raise SamplerDied(f"the sampler process (pid {self._process.pid}) did not answer {kind!r} within "
                                  f"{self.timeout_s:g} s (RLConfig.sampler_timeout) and was stopped; the run stops "
                                  "(rerun it to resume from its last checkpoint; raise the limit for long episodes)")
        try:
            status, *reply = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            raise self._died(kind) from None
        self._busy = False
        if status == "error":
            exc_bytes, tb, records = reply
            _emit(records)
            raise _reraised(exc_bytes, tb, kind)
        return reply[0] if len(reply) == 1 else reply

    def _died(self, kind: str) -> SamplerDied:
        self._process.join(timeout=5)
        code = self._process.exitcode
        if code is None:
            cause = "its pipe closed while it still runs"
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            cause = f"killed by {name}" + (" (e.g. the kernel's out-of-memory killer)" if -code == signal.SIGKILL else "")
        else:
            cause = f"it exited with code {code} (its error, if any, is printed above)"
        return SamplerDied(f"the sampler process (pid {self._process.pid}) died while answering {kind!r}: {cause}; "
                           "the run stops (rerun it to resume from its last checkpoint)")


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


_FINGERPRINT_WIDTH = 512
"""the words of a tensor are laid out [rows, 512] for the fingerprint's column and row sums"""


def weight_fingerprints(model: torch.nn.Module) -> dict[str, tuple[int, int, int]]:
    """A fingerprint of every tensor of `model.state_dict()`: equal weights, equal fingerprints; changed bytes,
    a changed fingerprint.

    Computed where the tensor lives (a GPU's weights never cross to the host) from its raw bytes read as
    little-endian 64-bit words W (the last < 8 bytes as one more word), laid out [rows, 512] (the last row
    partial): (sum of W, sum over columns j of (2j + 1) x column j's sum, sum over rows r of (2r + 1) x row
    r's sum), all modulo 2^64. A change of one word always changes the first; two words swapped change the
    second (other columns) or the third (one column, other rows) unless their difference times the distance
    of their columns (rows) is a multiple of 2^63.
    Not a cryptographic digest (nobody forges the weights; the log-prob check behind it compares
    behaviour). On one CPU core: 2.3-4.0 ms for the small Llama's 3.1M fp32 weights in 39 tensors (blake2b of
    their bytes: 11.5-14 ms), 0.5-0.7 ms for the tiny one's 21 small tensors (blake2b 0.6).
    -> {name: (three int64 sums)}"""
    state = model.state_dict()
    sums = [_fingerprint(v.detach()) for v in state.values()]
    if not sums:
        return {}
    one_device = len({s.device for s in sums}) == 1
    values = (torch.stack(sums).cpu() if one_device else torch.stack([s.cpu() for s in sums])).tolist()  # [n, 3]
    return {k: tuple(v) for k, v in zip(state, values)}


def _fingerprint(v: torch.Tensor) -> torch.Tensor:
    """`weight_fingerprints`' three sums of one tensor -> [3] int64 on its device."""
    raw = v.contiguous().reshape(-1).view(torch.uint8)  # [bytes]
    if raw.storage_offset() % 8:  # a view into a larger tensor: 64-bit words need an aligned start
        raw = raw.clone()
    whole = raw.numel() // 8 * 8
    words = raw[:whole].view(torch.int64)  # [n]
    if whole < raw.numel():  # the last bytes, little-endian
        tail = raw[whole:].to(torch.int64) << (8 * torch.arange(raw.numel() - whole, device=raw.device))
        words = torch.cat([words, tail.sum().reshape(1)])
    k, dev = _FINGERPRINT_WIDTH, words.device
    m, total = words.numel() // k, words.sum()
    if m == 0:  # one partial row: its column sums are the words, its row sum is the total
        return torch.stack([total, (words * _odd(dev, words.numel())).sum(), total])
    grid, rest = words[: m * k].view(m, k), words[m * k :]  # [m, k], [< k]
    cols, rows = grid.sum(0), grid.sum(1)  # [k], [m]
    if rest.numel():  # the partial last row
        cols[: rest.numel()] += rest
        rows = torch.cat([rows, rest.sum().reshape(1)])
    return torch.stack([total, (cols * _odd(dev, k)).sum(), (rows * _odd(dev, rows.numel())).sum()])


@functools.lru_cache(maxsize=256)
def _odd(device: torch.device, n: int) -> torch.Tensor:
    """[n] int64: 1, 3, 5, ... on `device` (the fingerprint's weights, made once per length)."""
    return torch.arange(n, device=device, dtype=torch.int64) * 2 + 1


def _unpicklable(envs: Sequence, tasks: Sequence, renderer: Any) -> str:
    """Which part of a rollout call pickle refuses (for the error message)."""
    parts = [(f"the environment {type(e).__name__}", e) for e in envs[:1]]
    parts += [(f"task {getattr(t, 'name', repr(t))!r}", t) for t in tasks] + [(f"the renderer {type(renderer).__name__}", renderer)]
    for what, obj in parts:
        try:
            pickle.dumps(obj)
        except Exception:  # noqa: BLE001 - this is the one
            return what
    return "the call"


# --- the sampler process ------------------------------------------------------------------------
def _serve(conn, trainer_end, model: Any, shared: dict[str, torch.Tensor], threads: int, autocast: str | None,
           device: str, levels: dict[str, int]) -> None:
    """The sampler process: answer rollout / sync / close messages until close or EOF. Ctrl-C in a terminal
    (or a scheduler's SIGTERM) signals the whole process group: the trainer saves and stops the run (closing
    this process), so the
    signals are ignored here (it is killed if need be). `model`: the trainer's (a fork's copy) or its pickle
    (a fork server's child)."""
    trainer_end.close()  # a fork's copy of it: held here, the trainer's death would never close the pipe
    for sig in (signal.SIGINT, signal.SIGTERM):  # (a fork inherits the trainer's checkpointing handlers)
        signal.signal(sig, signal.SIG_IGN)
    exit_with_parent()
    torch.set_num_threads(threads)
    records = _log_to_trainer(levels)
    model = (pickle.loads(model) if isinstance(model, bytes) else model).to(device).eval()
    own = model.state_dict()  # views of the model's tensors: copying into them updates the model
    held = weight_fingerprints(model)  # what this process holds (a sync that changes nothing is an error in the trainer)
    policy = functools.partial(sample, model)  # what `engine.sample` is in the trainer, on this copy
    renderers: dict[int, Any] = {}
    while True:
        try:
            kind, *args = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        records.records = []
        try:
            if kind == "close":
                return
            if kind == "rollout":
                envs, tasks, rid, renderer, state, kw = pickle.loads(args[0])
                if renderer is not None:
                    renderers[rid] = renderer
                g = _generator(state)
                trajs = rollout_batch(policy, envs, tasks, renderers[rid], g, **kw)
                reply = (trajs, _state_bytes(g) if g is not None else None, records.records)
            elif kind == "sync":
                ids, mask = args
                with torch.no_grad():
                    for k, v in own.items():
                        v.copy_(shared[k])
                after = weight_fingerprints(model)
                logp = _logprobs(model, torch.from_numpy(ids), torch.from_numpy(mask), autocast)
                reply, held = (held != after, after, logp.numpy()), after
            else:
                raise ValueError(f"unknown message {kind!r}")
            message = ("ok", reply)
        except Exception as e:  # noqa: BLE001 - sent back to the trainer, which raises it there
            message = ("error", _picklable(e), traceback.format_exc(), records.records)
        try:
            conn.send_bytes(pickle.dumps(message))
        except (BrokenPipeError, OSError):  # the trainer is gone
            return


def _log_to_trainer(levels: dict[str, int]) -> "_Records":
    """Every record of this process goes to one `_Records` handler (the trainer re-emits them): a fork's
    copies of the trainer's handlers are removed, and its loggers' levels are the trainer's."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        lg.handlers, lg.propagate = [], True
    records = _Records()
    logging.getLogger().addHandler(records)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    return records


class _Records(logging.Handler):
    """This process's log records of the current call, made picklable (message and traceback as text),
    for the trainer to re-emit with its own handlers."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


def _emit(records: Sequence[logging.LogRecord]) -> None:
    """Log the sampler process's records here, by their loggers (the trainer's handlers and levels)."""
    for r in records:
        logger = logging.getLogger(r.name)
        if logger.isEnabledFor(r.levelno):
            logger.handle(r)


def _picklable(exc: BaseException) -> bytes | None:
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - the traceback text still travels
        return None


def _reraised(exc_bytes: bytes | None, tb: str, kind: str) -> BaseException:
    """The sampler's exception, to raise in the trainer: the same type and message (a user error stays a
    one-line error), its traceback in the sampler process as a note."""
    exc = pickle.loads(exc_bytes) if exc_bytes is not None else None
    if exc is None:
        return RuntimeError(f"the sampler process failed on {kind!r}:\n{tb}")
    exc.add_note(f"raised in the sampler process ({kind!r}):\n{tb}")
    return exc


def _generator(state: bytes | None) -> torch.Generator | None:
    if state is None:
        return None
    g = torch.Generator()
    g.set_state(_state_tensor(state))
    return g


# Messages are pickled with the standard pickler and sent as bytes, never through torch's pickler,
# which would move each tensor into a new shared-memory segment and pass its file descriptor.
def _state_bytes(g: torch.Generator) -> bytes:
    return g.get_state().numpy().tobytes()


def _state_tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


@torch.no_grad()
def _logprobs(model, ids: torch.Tensor, mask: torch.Tensor, autocast: str | None) -> torch.Tensor:
    """log pi(ids[:, t+1] | ids[:, :t+1]) [b, T-1] of ids [b, T] (the engine's forward, on CPU floats)."""
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    amp = AUTOCAST_DTYPES[autocast]
    if amp is not None:
        with torch.autocast(device.type, dtype=amp):
            logits = model(ids, attention_mask=mask)
    else:
        logits = model(ids, attention_mask=mask)
    return token_log_probs(logits, ids).float().cpu()
