"""A sampler in its own process, holding its own copy of the policy: the rollout side of overlapped RL.

With `RLConfig.max_staleness = 1` the RL loop (algorithms/rl.py) trains step s in a thread
while its main thread collects step s+1's episodes; the tokens of those episodes are
sampled here, in a separate process, by a copy of the policy one update behind (the
PipelineRL / prime-rl / verl-async scheme). Environments, renderers and reward functions
stay in the trainer process (the collect runs there, with its time limits and counters);
only `engine.sample` calls cross the pipe:

    trainer process                                     sampler process (`threads` torch threads)
      collect(tasks, n, g)  -- engine.sample(...) -->   sampling.sample(own model, ...)
                            <-- Samples, generator state
      optimizer step
      sync(probe)           -- weights (shared memory) + probe rows -->  copy into own model,
                            <-- did they change, their hashes, probe log-probs      log-probs of the probe

Seeding: a call sends the state of its generator (and of the per-row generators of
`episode_seeds` rollouts) and sets the state the sampler leaves, so the trainer's
generators advance exactly as if it had sampled itself: the sampler process gives the
same samples as `engine.sample` on the same weights (bit for bit with the trainer's thread count).

The process is forked from a fork server that has imported this module (Python's
"forkserver" start method): clean like spawn -- a fork of the trainer would copy its
threads and their locks -- and it boots while the trainer samples the first batch itself.
It ignores SIGINT (a terminal's Ctrl-C reaches the whole process group: the trainer
checkpoints, then closes it) and exits when the trainer's end of the pipe closes.

Weights travel through one shared-memory copy of the state dict, allocated once (the
trainer writes it after an optimizer step, the sampler copies it into its own model
before it answers). Every sync is checked, since a sync that silently does nothing is
the classic failure of asynchronous RL:

  * the sampler's weights must change when the trainer's did (hashes before / after);
  * the sampler's weights must then equal the trainer's, tensor by tensor (hashes);
  * the sampler's and the trainer's log-probs of the same tokens (a few rows of the
    step's batch) must agree to `tolerance` (max abs difference over POLICY tokens, nats),
    returned as `sync/logprob_diff`.

A failed check raises `SyncError` naming what differs; the run stops.
"""

from __future__ import annotations

import hashlib
import pickle
import signal
import threading
import traceback
from typing import Any, Sequence

import torch
import torch.multiprocessing as mp

from .engine import AUTOCAST_DTYPES
from .logprobs import token_log_probs
from .sampling import Samples, sample
from .trajectory import Batch


class SyncError(RuntimeError):
    """A weight sync between trainer and sampler process that did not take (the message says how)."""


class SamplerProcess:
    """A process that samples with its own copy of `engine.model`, synced by `sync()`.

    engine:     the trainer's engine (its model is copied once at start; one process, no torchrun)
    threads:    torch threads in the sampler process
    tolerance:  largest allowed |sampler - trainer| log-prob of a probe token after a sync (nats)

    `sample` has `engine.sample`'s signature (it is what the loop routes `engine.sample` to while it
    collects, `engine.sample_via`). Use as a context manager, or call `close()`.
    """

    def __init__(self, engine, threads: int = 1, tolerance: float = 1e-3):
        self.engine, self.tolerance = engine, tolerance
        model = engine.model
        self._shared = {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in model.state_dict().items()}
        self._synced = weight_hashes(model)  # what the sampler holds (it starts from these weights)
        self.calls = 0
        """sample() calls answered so far (the loop checks that a collect sampled through this process)"""
        ctx = _context()
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve, args=(child, pickle.dumps(model), self._shared, threads,
                                 getattr(engine, "autocast", None), str(engine.device)),
            daemon=True, name="trajtune-sampler")
        # started from a thread, so the trainer goes on while the fork server and the process boot (imports,
        # the model); messages wait in the pipe until the process reads them
        self._starter = threading.Thread(target=self._start, args=(child,), daemon=True)
        self._starter.start()

    # --- what the loop calls -------------------------------------------------------------------
    def sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               generator: torch.Generator | None = None, *, generators: Sequence[torch.Generator] | None = None,
               **kw: Any) -> Samples:
        """`sampling.sample` in the sampler process; `generator` / `generators` advance as if run here."""
        state = _state_bytes(generator) if generator is not None else None
        states = [_state_bytes(g) for g in generators] if generators is not None else None
        samples, state, states = self._call("sample", [list(p) for p in prompts], max_new_tokens, state, states, kw)
        if generator is not None:
            generator.set_state(_state_tensor(state))
        for g, s in zip(generators or (), states or (), strict=True):
            g.set_state(_state_tensor(s))
        self.calls += 1
        return samples

    def sync(self, probe: Batch) -> dict[str, float]:
        """Send the trainer's current weights; check they arrived (module docstring) on `probe`'s rows
        (ids [b, T]); returns {"sync/logprob_diff": max |sampler - trainer| log-prob on POLICY tokens}."""
        truth = weight_hashes(self.engine.model)
        self._publish()
        changed, theirs, their_logp = self._call("sync", probe.ids.cpu().numpy(), probe.attention_mask.cpu().numpy())
        their_logp = torch.from_numpy(their_logp)
        mine = self.engine.forward(probe).logprobs.detach().float().cpu()  # [b, T-1]
        mask = probe.action_mask.bool()
        diff = float((mine - their_logp).abs()[mask].max()) if mask.any() else 0.0
        if truth != self._synced and not changed:
            raise SyncError("weight sync failed: the trainer's weights changed at optimizer step "
                            f"{self.engine.step} but the sampler process's did not (it would sample with stale "
                            f"weights from now on); sampler-trainer log-prob difference {diff:.3g}")
        wrong = [k for k in truth if theirs.get(k) != truth[k]]
        if wrong or not diff <= self.tolerance:
            why = (f"the sampler's weights differ from the trainer's in {len(wrong)} tensor(s) ({', '.join(wrong[:3])})"
                   if wrong else "the weights are equal, but the two copies do not compute the same policy")
            raise SyncError(f"weight sync check failed after optimizer step {self.engine.step}: the sampler's and the "
                            f"trainer's log-probs of the same tokens differ by {diff:.3g} nats (tolerance "
                            f"{self.tolerance:g}, RLConfig.sync_tolerance); {why}")
        self._synced = truth
        return {"sync/logprob_diff": diff}

    def close(self) -> None:
        """Stop the sampler process (idempotent)."""
        self._starter.join()
        if self._process.is_alive():
            try:
                self._conn.send(("close",))
            except OSError:
                pass
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join()
        self._conn.close()

    def __enter__(self) -> "SamplerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------
    def _start(self, child) -> None:
        self._process.start()
        child.close()

    def _publish(self) -> None:
        """Write the trainer's weights into the shared copy the sampler reads from."""
        with torch.no_grad():
            for k, v in self.engine.model.state_dict().items():
                self._shared[k].copy_(v.detach())

    def _call(self, *message):
        try:
            self._conn.send(message)
            status, *reply = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self._starter.join()
            self._process.join(timeout=5)
            raise RuntimeError(f"the sampler process died (exit code {self._process.exitcode}) while answering "
                               f"{message[0]!r}") from None
        if status == "error":
            raise RuntimeError(f"the sampler process failed on {message[0]!r}:\n{reply[0]}")
        return reply[0] if len(reply) == 1 else reply


def _context():
    """A fork server that has imported this module: a clean process (fork from the trainer would copy its
    threads and locks), started in a fraction of spawn's time after the first (no torch import each)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def weight_hashes(model: torch.nn.Module) -> dict[str, str]:
    """A digest of every tensor of `model.state_dict()` (its bytes): equal digests, equal weights."""
    out = {}
    for k, v in model.state_dict().items():
        raw = v.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        out[k] = hashlib.blake2b(raw.tobytes(), digest_size=16).hexdigest()
    return out


def _serve(conn, model_bytes: bytes, shared: dict[str, torch.Tensor], threads: int, autocast: str | None,
           device: str) -> None:
    """The sampler process: answer sample / sync / close messages until close or EOF. Ctrl-C in a terminal
    signals the whole process group: the trainer saves and stops the run (closing this process), so the
    signal is ignored here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    model = pickle.loads(model_bytes).to(device).eval()
    own = model.state_dict()  # views of the model's tensors: copying into them updates the model
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        kind, args = message[0], message[1:]
        try:
            if kind == "close":
                return
            if kind == "sample":
                prompts, max_new_tokens, state, states, kw = args
                g = _generator(state)
                gens = [_generator(s) for s in states] if states is not None else None
                samples = sample(model, prompts, max_new_tokens, g, generators=gens, **kw)
                reply = (samples, _state_bytes(g) if g is not None else None,
                         [_state_bytes(x) for x in gens] if gens is not None else None)
            elif kind == "sync":
                ids, mask = args
                before = weight_hashes(model)
                with torch.no_grad():
                    for k, v in own.items():
                        v.copy_(shared[k])
                after = weight_hashes(model)
                logp = _logprobs(model, torch.from_numpy(ids), torch.from_numpy(mask), autocast)
                reply = (before != after, after, logp.numpy())
            else:
                raise ValueError(f"unknown message {kind!r}")
            conn.send(("ok", reply))
        except Exception:  # noqa: BLE001 - sent back to the trainer, which raises it there
            conn.send(("error", traceback.format_exc()))


def _generator(state: bytes | None) -> torch.Generator | None:
    if state is None:
        return None
    g = torch.Generator()
    g.set_state(_state_tensor(state))
    return g


# Messages carry plain bytes and numpy arrays, never torch tensors: torch's pickler would move each
# tensor into a new shared-memory segment and pass its file descriptor (64 generator states per call).
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
