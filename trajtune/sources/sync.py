"""Weight syncs and their checks: the trainer's weights copied into a sampler that holds its own.

A sampler with its own copy of the policy (a `SamplerProcess`, vLLM) samples with the
weights it was last sent. A sync that silently does nothing is the classic failure of
asynchronous RL, so every sync is checked:

  * the sampler's weights must change when the trainer's did (their fingerprints before / after);
  * the sampler's weights must then equal the trainer's, tensor by tensor (`weight_fingerprints`);
  * the sampler's and the trainer's log-probs of the same tokens (a few rows the source sampled
    last: `SyncProbe`) must agree to a tolerance (max abs difference over POLICY tokens, nats),
    logged as `sync/logprob_diff`.

`check_sync` makes the three checks for every sampler that holds its own weights (the sampler process,
vLLM colocated or served) and raises `SyncError` naming what differs; a sampler that dies or stops
answering raises its subclass `SamplerDied`.
"""

from __future__ import annotations

import dataclasses
import functools
import collections
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..engine import AUTOCAST_DTYPES, Engine
from ..logprobs import token_log_probs
from ..trajectory import Batch
from .sampler import Fingerprints


class SyncError(RuntimeError):
    """The trainer and its sampler out of step: a weight sync that did not take (the message says how), or a
    sampler process that died or stopped answering (`SamplerDied`)."""


class SamplerDied(SyncError):
    """The sampler process exited, was killed, or did not answer within its time limit."""


class HeldSyncs:
    """How a sampler that holds its own weights (`SamplerProcess`, `VLLMRunner`) serves an overlapped source
    (`trajtune.sources.overlap`): it counts its rollouts (`rollouts_sent`: the source checks its episodes went
    through it) and, told to (`hold_syncs`), holds each update's sync -- prepared as the update ends -- until the
    rollouts it must precede (`send_held`), or until a partial rollout asks for its version (`send_version`).
    The class that mixes it in sets `_cv` (a `threading.Condition`) and `_rollouts_sent`, calls `_init_holding()`,
    and sends one held sync in `_send_held(due, item)`; `_failed()` names why no sync can be sent any more."""

    _cv: threading.Condition
    _rollouts_sent: int

    def _init_holding(self) -> None:
        self._hold_until: int | None = None  # holding: the step the next held sync's rollouts wait for
        self._taken = -1  # holding: the last step the loop took (the checks of syncs due by then are reported)
        self._held_syncs: collections.deque[tuple[int, int, Any]] = collections.deque()  # (due step, version, item)
        self._version: int | None = None  # holding: the version of the weights last sent (or started with)

    @property
    def rollouts_sent(self) -> int:
        """Rollouts sent so far."""
        return self._rollouts_sent

    @property
    def holding(self) -> bool:
        return self._hold_until is not None

    def hold_syncs(self, until_step: int, taken: int) -> None:
        """From now on hold each update's sync until a rollout of the loop's step `until_step` or later is about to
        start (`send_held`): how an overlapped source keeps its episodes exactly K updates behind. `taken`: the last
        step the loop took (`after_update` reports the checks of the syncs due by then, so a step's row does not
        depend on the threads' timing). Call it before each `after_update` (and `start`)."""
        with self._cv:
            self._hold_until, self._taken = until_step, taken
            if self._version is None:  # the first call: the sampler starts with the weights after `taken`
                self._version = taken

    def _hold(self, item: Any) -> None:
        """Hold `item` (a prepared sync of the weights after update taken + 1) until its due step."""
        with self._cv:
            assert self._hold_until is not None
            self._held_syncs.append((self._hold_until, self._taken + 1, item))
            self._cv.notify_all()

    def send_held(self, step: int) -> None:
        """Send, in order, the held syncs that must precede the rollouts of the loop's step `step` (from the thread
        about to start them)."""
        while True:
            with self._cv:
                if not self._held_syncs or self._held_syncs[0][0] > step:
                    return
                due, self._version, item = self._held_syncs.popleft()
            self._send_held(due, item)

    def send_version(self, version: int) -> None:
        """Send, in order, the held syncs up to the weights after update `version`, waiting for the update that makes
        them (a partial rollout continuing under newer weights: `trajtune.sources.partial`; from the thread that
        samples, while the trainer trains). Before any `hold_syncs` the sampler holds the trainer's current weights:
        nothing to send."""
        while True:
            with self._cv:
                if self._version is None:
                    return
                self._cv.wait_for(lambda: self._failed() is not None or self._sent(version)
                                  or any(v >= version for _, v, _ in self._held_syncs))
                if (error := self._failed()) is not None:
                    raise error
                if self._sent(version):
                    return
                due, self._version, item = self._held_syncs.popleft()
            self._send_held(due, item)

    def _sent(self, version: int) -> bool:
        """The weights after update `version` (or newer) were sent (or started with)."""
        return self._version is not None and self._version >= version

    def _send_held(self, due: int, item: Any) -> None:
        raise NotImplementedError

    def _failed(self) -> BaseException | None:
        return None


@dataclass
class SyncProbe:
    """The trainer's side of one weight sync check (`probe`): the probe rows, the trainer's log-probs of them and
    its weights' fingerprints after optimizer step `step`."""

    ids: torch.Tensor  # [b, T]
    mask: torch.Tensor  # [b, T] attention mask
    action_mask: torch.Tensor  # [b, T-1] bool: the POLICY tokens compared
    logprobs: torch.Tensor  # [b, T-1] the trainer's log-probs
    fingerprints: Fingerprints  # weight_fingerprints, per tensor
    step: int


def probe(engine: Engine, batch: Batch) -> SyncProbe:
    """What the trainer knows after an optimizer step (call it in the thread that trains): its weights'
    fingerprints and its log-probs of `batch`'s rows (ids [b, T]), to check a sampler's copy against. Both sides
    read the model's own distribution, temperature 1 (`sampler_logprobs`), whatever the rows were sampled at."""
    logp = engine.forward(dataclasses.replace(batch, temperature=1.0)).logprobs.detach().float().cpu()  # [b, T-1]
    with engine.policy_weights() as model:
        prints = weight_fingerprints(model)
    return SyncProbe(batch.ids.cpu(), batch.attention_mask.cpu(), batch.action_mask.bool().cpu(), logp, prints,
                     engine.step)


def check_sync(step: int, trainer: Fingerprints, loaded: Sequence[Fingerprints], mine: torch.Tensor,
               theirs: torch.Tensor, action_mask: torch.Tensor, tolerance: float, *, held: Fingerprints | None = None,
               changed: bool = True, sampler: str = "the sampler process",
               option: str = "sync_tolerance") -> tuple[float, float]:
    """THE check of a weight sync, for every sampler that holds its own weights (module docstring).

    step:        the trainer's optimizer step the weights are from
    trainer:     the fingerprints of the weights sent ({} when none were: a LoRA adapter alone)
    loaded:      per engine of the sampler, the fingerprints of what it loaded (values as tuples or lists)
    mine:        [b, T-1] the trainer's log-probs of the probe rows; theirs: [b, T-1] the sampler's
    action_mask: [b, T-1] bool, the POLICY tokens compared
    held, changed: the fingerprints the sampler held before, and whether its weights changed (a sync that changed
                 nothing while the trainer's did is named as such); None: not known
    sampler, option: how the messages name the sampler and the tolerance's option
    -> (max, mean) |sampler - trainer| log-prob over the POLICY tokens; raises `SyncError` naming what differs."""
    diff = (mine - theirs).abs()[action_mask]  # [n]
    worst, mean = (float(diff.max()), float(diff.mean())) if diff.numel() else (0.0, 0.0)
    if held is not None and trainer != held and not changed:
        raise SyncError("weight sync failed: the trainer's weights changed at optimizer step "
                        f"{step} but {sampler}'s did not (it would sample with stale "
                        f"weights from now on); sampler-trainer log-prob difference {worst:.3g}")
    why = ""
    for i, got in enumerate(loaded):
        missing = [k for k in trainer if k not in got]
        wrong = [k for k in trainer if k in got and tuple(got[k]) != tuple(trainer[k])]
        if missing:
            why = (f"{sampler} (engine {i}) did not load {len(missing)} of the trainer's tensors "
                   f"({', '.join(missing[:3])}) and loaded {len(wrong)} that differ ({', '.join(wrong[:3])})")
        elif wrong:
            why = (f"the sampler's weights differ from the trainer's in {len(wrong)} tensor(s) "
                   f"({', '.join(wrong[:3])})")
        if why:
            break
    if why or not worst <= tolerance:
        why = why or (f"{sampler} was sent the trainer's weights, but it does not compute the trainer's policy with "
                      "them (a load that did not take)")
        raise SyncError(f"weight sync check failed after optimizer step {step}: the sampler's and the "
                        f"trainer's log-probs of the same tokens differ by {worst:.3g} nats (mean {mean:.3g}; "
                        f"tolerance {tolerance:g}, {option}); {why}")
    return worst, mean


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
    return tensor_fingerprints(model.state_dict())


def tensor_fingerprints(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, int, int]]:
    """`weight_fingerprints` of a state dict (name -> tensor): what a sync sends, what a sampler loaded."""
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



@torch.no_grad()
def sampler_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, autocast: str | None) -> torch.Tensor:
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
