"""A few of a run's episodes, token by token, saved while it trains (what `trajtune view` shows).

At step 1 and every `every` steps, a loop hands its step's trajectories (and the batch it scored)
to `Run.record_episodes`, which hands them to its hooks; this one (a `runs.hooks.Hook`) keeps `k` of them
(`per_group` from each of the first groups, so a group's contrast is visible) and appends one JSON line per episode to
RUN_DIR/<stage>/episodes.jsonl:

    stage, step, index (its row in the step), group, task, reward, outcome, kept (RFT: selected or not),
    info           the episode's info as the rollout left it (trajtune/sources/rollout.py): stop_reason
                   ("length" when the reply that ended it was cut at the token budget), n_unterminated
                   (`Trajectory.unterminated`),
                   expected (the answer the task's data gives, where it has one), the environment's checks
    ids, owners, turns                      one entry per token
    sampler_logp   log-prob of the token under the policy that sampled it (0 where none)
    trainer_logp   log-prob under the trainer's weights at this step, before the update (0 on
                   non-POLICY tokens); with a lagged sampler (overlapped RL) the two differ
    advantage      the weight the loss gives the token (its episode's advantage on POLICY
                   tokens, per token for GAE; RFT: 1 on kept episodes, 0 otherwise)
    versions       only where the episode carries them (`Trajectory.versions`: a source that samples behind the
                   trainer stamped them): the policy version that sampled the token, i.e. how many updates its
                   weights had had (-1 for tokens no policy sampled); the row of step n was trained by the weights
                   after n - 1 updates, so a POLICY token of version v was sampled n - 1 - v updates behind.
                   Rows of episodes without versions have no such key (as before versions existed).

The importance ratio is exp(trainer_logp - sampler_logp), computed by the viewer. The size is
bounded: `k` episodes per recorded step, and nothing more once the file holds `max_bytes`.
A resumed stage forgets the rows after the step it resumes from (they are recorded again).
Under torchrun every rank runs the forward (FSDP needs all of them) and rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from ..trajectory import Batch, Owner, Trajectory, collate
from .hooks import Hook

log = logging.getLogger("trajtune.runs.recorder")

FILE = "episodes.jsonl"


class EpisodeRecorder(Hook):
    """Appends a few episodes of the due steps of stage `stage` to `path` (see the module docstring).

    every:     record at step 1 and at every multiple of `every`
    k:         episodes per recorded step
    per_group: episodes taken from each group (the first groups of the step)
    max_bytes: stop recording once the file is this big
    write:     False on the ranks that only take part in the forward (torchrun, rank > 0)
    """

    def __init__(self, path: str | os.PathLike, every: int = 10, k: int = 8, per_group: int = 2,
                 max_bytes: int = 32 * 2**20, write: bool = True, stage: str = "train"):
        if every < 1 or k < 1 or per_group < 1:
            raise ValueError(f"EpisodeRecorder: every, k and per_group must be >= 1, got {every}, {k}, {per_group}")
        self.path, self.every, self.k, self.per_group = Path(path), every, k, per_group
        self.max_bytes, self.write, self.stage = max_bytes, write, stage
        self._full = False

    # --- the run's hook
    def on_start(self, engine, start: int) -> None:
        if start:
            self.drop_after(start)

    def on_episodes(self, engine, step: int, trajs: Sequence[Trajectory], batch: Batch | None = None,
                    kept: Sequence[Trajectory] | None = None, every: int | None = None) -> None:
        self.record(engine, self.stage, step, trajs, batch, kept=kept, every=every)

    def due(self, step: int, every: int | None = None) -> bool:
        every = every or self.every
        return not self._full and (step == 1 or step % every == 0)

    def rows(self, trajs: Sequence[Trajectory]) -> list[int]:
        """Which episodes of a step are kept: `per_group` of each group, groups in order, at most `k`."""
        taken: dict[int, int] = {}
        out = []
        for i, t in enumerate(trajs):
            if taken.get(t.group, 0) < self.per_group:
                taken[t.group] = taken.get(t.group, 0) + 1
                out.append(i)
            if len(out) == self.k:
                break
        return out

    def record(self, engine, stage: str, step: int, trajs: Sequence[Trajectory], batch: Batch | None = None,
               pad_id: int | None = None, kept: Sequence[Trajectory] | None = None, every: int | None = None) -> None:
        """Record the chosen episodes of `step` if it is due. `batch`: the step's scored batch (rows in
        `trajs` order; its pg.advantages [B] or [B, T-1], and pg.old_logp [B, T-1] when the loop computed it:
        `objectives.inputs.PGInputs`); without one the episodes are collated here (`pad_id`, default 0). `kept`:
        RFT's selection (advantage = 1 on kept episodes)."""
        if not trajs or not self.due(step, every):
            return
        if self.write and self.path.exists() and self.path.stat().st_size >= self.max_bytes:
            log.warning("%s holds %d bytes: no more episodes recorded", self.path, self.path.stat().st_size)
            self._full = True
            return
        rows = self.rows(trajs)
        if batch is None or batch.size != len(trajs):
            batch = collate(list(trajs), pad_id or 0)
        part = batch.select(rows)
        old = part.pg.old_logp if part.pg is not None else None
        with torch.no_grad():
            trainer = old if old is not None else engine.forward(part).logprobs  # [k, T-1]
        kept_ids = {id(t) for t in kept} if kept is not None else None
        adv = part.pg.advantages if part.pg is not None else None
        if adv is None:  # no advantages: the weight of SFT on the episode (RFT: 1 if kept)
            adv = torch.tensor([float(kept_ids is None or id(trajs[r]) in kept_ids) for r in rows])
        if not self.write:
            return
        lines = []
        for j, r in enumerate(rows):
            t = trajs[r]
            lines.append(json.dumps(episode_row(stage, step, r, t, trainer[j], adv[j],
                                                None if kept_ids is None else id(t) in kept_ids), default=str))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")

    def drop_after(self, step: int) -> None:
        """Forget the rows of steps after `step` (a resumed stage records them again)."""
        if not self.write or not self.path.exists():
            return
        keep = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


def episode_row(stage: str, step: int, index: int, t: Trajectory, trainer_logp: torch.Tensor,
                advantage: torch.Tensor, kept: bool | None) -> dict[str, Any]:
    """One episode's JSON row (keys: the module docstring). trainer_logp [T'-1] and advantage [] or [T'-1] are the
    batch row's (T' >= len(t): padding is cut); token t's values sit at position t - 1 (token 0 is predicted by
    none). `versions` is added only where `t.versions` is set."""
    n = len(t)
    policy = [o == Owner.POLICY for o in t.owners]
    lp = trainer_logp[: n - 1].tolist()
    adv = advantage[: n - 1].tolist() if advantage.dim() else [float(advantage)] * (n - 1)
    trainer = [0.0] + [round(v, 4) if policy[i + 1] else 0.0 for i, v in enumerate(lp)]
    weight = [0.0] + [round(v, 4) if policy[i + 1] else 0.0 for i, v in enumerate(adv)]
    sampler = [round(v, 4) for v in t.logprobs] if t.logprobs is not None else [0.0] * n
    row = {"stage": stage, "step": step, "index": index, "group": t.group, "task": str(t.info.get("task", "")),
           "reward": t.reward if math.isfinite(t.reward) else str(t.reward), "outcome": str(t.outcome),
           "info": recorded_info(t),
           "kept": kept, "ids": t.ids, "owners": t.owners, "turns": t.turns,
           "sampler_logp": sampler, "trainer_logp": trainer, "advantage": weight}
    if t.versions is not None:  # only then: the rows of episodes without versions stay as they were
        row["versions"] = list(t.versions)
    return row


def recorded_info(t: Trajectory) -> dict[str, Any]:
    """The episode's info as a row records it: the rollout's count of actions cut at the token budget
    (`Trajectory.unterminated`) as info's n_unterminated, right after n_turns (what `trajtune view` reads)."""
    if t.unterminated is None or "n_turns" not in t.info:
        return t.info
    out: dict[str, Any] = {}
    for key, value in t.info.items():
        out[key] = value
        if key == "n_turns":
            out["n_unterminated"] = t.unterminated
    return out


def read_episodes(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of one episodes.jsonl; a row recorded twice (a resumed stage) counts once, the last."""
    rows: dict[tuple, dict] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
        rows[(row.get("stage"), row.get("step"), row.get("index"))] = row
    return list(rows.values())
