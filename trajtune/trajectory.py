"""Trajectories, token owners and batches: the data model every method shares.

A `Trajectory` is one episode flattened to a token sequence. Every token carries
an `owner` (who wrote it) and a `turn` (which exchange it belongs to). The loss
of every method is a weighted log-likelihood over the POLICY tokens only
(DESIGN.md, "The one idea"); the action mask is `owner == POLICY`, shifted by
one for next-token prediction. A single-turn prompt/completion pair is the
one-turn case of the same structure. Batches are split by one row splitter (length buckets, micro-batches,
rank shards); `tool_call_mask` marks the policy's tool calls in a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, Sequence

import torch

from .objectives.inputs import PGInputs, PreferenceInputs

TARGETS = "targets"
"""`Batch.extras` key of the tokens the log-probs are of, [B, T-1] long: position t's log-prob is of
extras[TARGETS][:, t] instead of ids[:, t+1] (`logprobs.TokenHead.targets`; a Tinker datum's target_tokens)."""


class Owner(IntEnum):
    """Who produced a token. Only POLICY tokens are trained on."""

    TEMPLATE = 0  # chat-template / turn-wrapper tokens added by the renderer
    PROMPT = 1  # the task or user message
    POLICY = 2  # tokens the policy generated (or a demonstration of them)
    TOOL = 3  # environment / tool output


class Outcome(StrEnum):
    """How an episode ended, as far as training is concerned. Only OK episodes are trained on: the others
    measure the infrastructure, not the policy, so they never enter a loss or a group baseline (a failed
    environment is not a reward of 0). The loops drop them and count them (`rollout/infra_failures`,
    `reward/unscored`)."""

    OK = "ok"  # the environment ran and a reward was given (0 included: a real failure of the policy)
    ENV_ERROR = "env_error"  # env.reset / env.step raised, overran its time limit or returned a bad step
    REWARD_ERROR = "reward_error"  # a reward function's call on it ran past its time limit
    UNSCORED = "unscored"  # no reward source applies to it (every one returned None: TRL's "unscorable")
    STALE = "stale"  # sampled too far behind the policy to train on (`sampling.stale` discard: sources.staleness)


@dataclass
class Trajectory:
    """One episode as a flat token sequence.

    Per token: `ids`, `owners` (an `Owner` each), `turns` (0-based turn index).
    `logprobs` optionally holds, per token, the sampler's log-probability of that
    token (0.0 for tokens the policy did not sample); RL uses them as
    pi_old / behaviour log-probs.
    Per episode: `reward`, `group` (episodes sampled for the same task share a
    group id, used by group baselines), `info` (task name, actions, counters) and
    `outcome` (`Outcome`: OK, or why the episode cannot be trained on) and
    `temperature`, the temperature its POLICY tokens were sampled at (1.0 for greedy or
    unsampled tokens): the trainer's policy for the episode is softmax(logits / temperature),
    and `logprobs` are those of the distribution the tokens were drawn from (that policy,
    truncated by top-k / top-p when asked: `trajtune.engine.decoding.Samples`).
    `unterminated`: how many of its actions the rollout cut at the token budget before their stop token
    (`trajtune.sources.rollout`; > 0: the episode is truncated), None where no rollout counted them
    (demonstrations, pairs from data).
    `versions` optionally holds, per token, the policy version that sampled it: how many loop updates the
    sampling weights had had (-1 for tokens no policy sampled); None where the sampler was the trained policy
    itself (on-policy, version = the step). An overlapped source stamps them (`stamp`); a partial rollout's
    episode carries several (`trajtune.sources.overlap`).
    """

    ids: list[int] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    reward: float = 0.0
    group: int = -1
    info: dict[str, Any] = field(default_factory=dict)
    outcome: Outcome = Outcome.OK
    temperature: float = 1.0
    unterminated: int | None = None
    versions: list[int] | None = None

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)  # a str from JSON or a pickle: checked
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"Trajectory: temperature must be a finite number > 0, got {self.temperature!r}")
        n = len(self.ids)
        if len(self.owners) != n or len(self.turns) != n:
            raise ValueError(
                f"Trajectory: ids ({n}), owners ({len(self.owners)}) and turns "
                f"({len(self.turns)}) must have the same length"
            )
        if self.logprobs is not None and len(self.logprobs) != n:
            raise ValueError(f"Trajectory: logprobs has {len(self.logprobs)} entries for {n} tokens")
        if self.versions is not None and len(self.versions) != n:
            raise ValueError(f"Trajectory: versions has {len(self.versions)} entries for {n} tokens")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def truncated(self) -> bool:
        """An action of the episode was cut at the token budget before its stop token (`unterminated` > 0)."""
        return bool(self.unterminated)

    @property
    def trainable(self) -> bool:
        """False for an episode whose environment or reward failed (`outcome` not OK): kept out of losses."""
        return self.outcome is Outcome.OK

    def append(
        self,
        ids: Sequence[int],
        owner: Owner | int,
        turn: int,
        logprobs: Sequence[float] | None = None,
    ) -> None:
        """Append tokens written by one owner in one turn (logprobs only for sampled tokens)."""
        ids = list(ids)
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"append: {len(logprobs)} logprobs for {len(ids)} ids")
        if logprobs is not None and self.logprobs is None:
            self.logprobs = [0.0] * len(self.ids)
        self.ids += ids
        self.owners += [int(owner)] * len(ids)
        self.turns += [turn] * len(ids)
        if self.logprobs is not None:
            self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        if self.versions is not None:
            self.versions += [-1] * len(ids)

    def stamp(self, version: int, since: int = 0) -> None:
        """Record that policy version `version` sampled the POLICY tokens from token `since` on (`versions`; the
        tokens before keep theirs, -1 if none)."""
        if self.versions is None:
            self.versions = [-1] * len(self.ids)
        for i in range(since, len(self.ids)):
            if self.owners[i] == Owner.POLICY:
                self.versions[i] = version

    @property
    def n_turns(self) -> int:
        return max(self.turns) + 1 if self.turns else 0

    def count(self, owner: Owner) -> int:
        """Number of tokens of one owner."""
        return sum(1 for o in self.owners if o == owner)

    def tokens_of(self, owner: Owner) -> list[int]:
        """Token ids of one owner, in order."""
        return [t for t, o in zip(self.ids, self.owners, strict=True) if o == owner]


@dataclass
class Batch:
    """A right-padded batch of trajectories (B episodes, T = longest length).

    ids            [B, T]    long   token ids, `pad_id` after the end
    attention_mask [B, T]    bool   True on real tokens
    owners         [B, T]    long   `Owner` of each token (TEMPLATE on padding)
    turns          [B, T]    long   turn index (-1 on padding)
    action_mask    [B, T-1]  float  1.0 where the *predicted* token ids[:, 1:] is a POLICY token
    rewards        [B]       float  episode rewards
    groups         [B]       long   group id of each episode (-1: none)
    old_logprobs   [B, T-1]  float  sampler log-probs of ids[:, 1:] (zeros where unknown)
    index          [B]       long   row of each episode in the batch it was selected from (names rows in warnings)
    together       [B]       long   rows with the same key are never split apart (a DPO pair: chosen and
                                    rejected share a key); see `row_units` and the splitters below
    temperature    float    the temperature the episodes' POLICY tokens were sampled at (`Trajectory.temperature`):
                                    the engine's log-probs, entropy and logits are of logits / temperature
    truncated      [B]       bool   the episode's last action was cut at the token budget before its stop token
                                    (`Trajectory.unterminated` > 0; DAPO's overlong filter)
    versions       [B, T-1]  long   the policy version that sampled each predicted token ids[:, 1:]
                                    (`Trajectory.versions`; -1 where unknown: on-policy, or not sampled)
    pg             the policy-gradient loss's step tensors (`objectives.inputs.PGInputs`: advantages, old and
                                    reference log-probs, GAE returns and old values) or None
    pref           the preference losses' step tensors (`objectives.inputs.PreferenceInputs`: DPO's and KTO's
                                    reference sums, ODPO's / REBEL's score differences, KTO's labels and
                                    reference point) or None
    extras         name -> [B] or [B, T-1, ...]  the other methods' per-row step tensors, an open set named by the
                                    loop that computes them and the loss that reads them (reward models: margin,
                                    group, rank, weight, token_labels; distillation: teacher_logits, top_ids,
                                    teacher_top; iw-SFT: q_logp, ref_logp); `TARGETS` [B, T-1] long: the tokens
                                    the engine's log-probs are of, in place of ids[:, 1:] (Tinker's target_tokens)
    `pg`, `pref` and `extras` are sliced with the rows by `select` and cut with the columns by `trim`, so a loss is
    a pure function of (output, batch).
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor
    owners: torch.Tensor
    turns: torch.Tensor
    action_mask: torch.Tensor
    rewards: torch.Tensor
    groups: torch.Tensor
    old_logprobs: torch.Tensor
    index: torch.Tensor
    infos: list[dict[str, Any]] = field(default_factory=list)
    together: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    temperature: float = 1.0
    truncated: torch.Tensor | None = None
    pg: PGInputs | None = None
    pref: PreferenceInputs | None = None
    versions: torch.Tensor | None = None

    INPUTS = ("pg", "pref")
    """the typed loss inputs (`objectives.inputs.RowTensors`): sliced, cut and moved with the batch"""

    def __post_init__(self) -> None:
        if self.together is None:
            self.together = torch.arange(self.ids.shape[0])
        if self.truncated is None:
            self.truncated = torch.zeros(self.ids.shape[0], dtype=torch.bool)
        if self.versions is None:
            self.versions = torch.full_like(self.old_logprobs, -1, dtype=torch.long)
        for name in self.INPUTS:
            if (inputs := getattr(self, name)) is not None:
                inputs.check(self.ids.shape[0], self.ids.shape[1])
        for name, x in self.extras.items():
            if x.shape[0] != self.ids.shape[0] or (x.dim() >= 2 and x.shape[1] != self.ids.shape[1] - 1):
                raise ValueError(f"Batch.extras[{name!r}]: shape {tuple(x.shape)} is neither [B] nor [B, T-1, ...] "
                                 f"for B={self.ids.shape[0]}, T={self.ids.shape[1]}")

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def staleness(self, step: int) -> torch.Tensor:
        """[B, T-1] long: per predicted token, how many updates its sampler was behind the policy loop step `step`
        trains (`step - versions`; -1 where the version is unknown)."""
        assert self.versions is not None
        return torch.where(self.versions >= 0, step - self.versions, -1)

    def with_extras(self, **tensors: torch.Tensor) -> "Batch":
        """The same batch with more per-row step tensors ([B] or [B, T-1, ...]) in `extras`."""
        return Batch(**{**self.__dict__, "extras": {**self.extras, **tensors}})

    def to(self, device: torch.device | str) -> "Batch":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        moved["extras"] = {k: v.to(device) for k, v in self.extras.items()}
        for name in self.INPUTS:
            moved[name] = x.to(device) if (x := getattr(self, name)) is not None else None
        return Batch(**moved)

    def select(self, index: torch.Tensor | Sequence[int]) -> "Batch":
        """Sub-batch of rows `index` (keeps T; use for minibatches); pg, pref and extras are sliced with the rows."""
        index = torch.as_tensor(index, dtype=torch.long)
        out = {k: (v[index] if isinstance(v, torch.Tensor) else [v[i] for i in index.tolist()])
               for k, v in self.__dict__.items() if k not in ("extras", "temperature", *self.INPUTS)}
        out["temperature"] = self.temperature
        out["extras"] = {k: v[index.to(v.device)] for k, v in self.extras.items()}
        for name in self.INPUTS:
            out[name] = x.select(index) if (x := getattr(self, name)) is not None else None
        return Batch(**out)

    def trim(self) -> "Batch":
        """The same rows without the padding columns no row uses: T -> the longest row's length
        (per-token pg, pref and extras tensors [B, T-1, ...] are cut with them)."""
        T = int(self.attention_mask.sum(-1).max())
        if T == self.ids.shape[1]:
            return self
        out = dict(self.__dict__)
        for k in ("ids", "attention_mask", "owners", "turns"):
            out[k] = out[k][:, :T]
        for k in ("action_mask", "old_logprobs", "versions"):
            out[k] = out[k][:, : T - 1]
        out["extras"] = {k: (v[:, : T - 1] if v.dim() >= 2 else v) for k, v in self.extras.items()}
        for name in self.INPUTS:
            out[name] = x.trim(T) if (x := getattr(self, name)) is not None else None
        return Batch(**out)


# --- the one row splitter: length buckets, micro-batches and rank shards ---------------------
def row_units(batch: Batch) -> list[list[int]]:
    """Rows grouped by `batch.together` (a unit is never split), units in order of first appearance."""
    keys = batch.together.tolist()
    if len(set(keys)) == len(keys):
        return [[i] for i in range(len(keys))]
    units: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        units.setdefault(k, []).append(i)
    return list(units.values())


def unit_rows(units: Sequence[Sequence[int]]) -> torch.Tensor:
    """The rows of some units, position-major: every unit's first row, then every unit's second row...
    so a part of a pair batch (chosen rows, then rejected rows) keeps the pair batch's layout. -> [rows]"""
    width = max((len(u) for u in units), default=0)
    return torch.tensor([u[p] for p in range(width) for u in units if p < len(u)], dtype=torch.long)


def split_units(units: Sequence[Sequence[int]], parts: int) -> list[torch.Tensor]:
    """Consecutive units in exactly `parts` parts whose unit counts differ by at most 1 (some may be
    empty: rank shards) -> the rows of each part (`unit_rows`)."""
    return [unit_rows([units[i] for i in g.tolist()]) for g in torch.arange(len(units)).tensor_split(parts)]


def micro_batches(batch: Batch, size: int) -> list[torch.Tensor]:
    """Rows of the micro-batches of `batch`: consecutive units, at most `size` rows each (0: one chunk;
    a unit bigger than `size` is one chunk of its own)."""
    units = row_units(batch)
    if size <= 0 or batch.size <= size:
        return [unit_rows(units)]
    out, part, n = [], [], 0
    for u in units:
        if part and n + len(u) > size:
            out.append(unit_rows(part))
            part, n = [], 0
        part.append(u)
        n += len(u)
    return out + [unit_rows(part)]


def length_buckets(batch: Batch, buckets: int) -> list[torch.Tensor]:
    """Rows of at most `buckets` groups of similar length, shortest first, that pad the fewest tokens:
    units sorted (stably) by their longest row, then cut where the groups' padded size, the sum of
    (rows x the group's longest row), is smallest (`_padding_cuts`).

    Equal-count groups waste more when lengths have a long tail: the agent gym's DPO pairs (76 rows of
    32-263 tokens, 4,612 real) pad to 8,168 tokens in 4 equal groups and to 6,768 in these."""
    units = row_units(batch)
    lengths = batch.attention_mask.sum(-1)  # [B]
    longest = torch.stack([lengths[u].max() for u in units]) if len(units) != batch.size else lengths
    order = torch.argsort(longest, stable=True)
    units = [units[i] for i in order.tolist()]
    widths, count = torch.unique_consecutive(longest[order], return_counts=True)  # distinct lengths, units of each
    rows = torch.tensor([len(u) for u in units]).split(count.tolist())
    ends = _padding_cuts(torch.stack([r.sum() for r in rows]), widths, buckets)  # in distinct lengths
    unit_ends = count.cumsum(0)[ends - 1].tolist()
    return [unit_rows(units[s:e]) for s, e in zip([0, *unit_ends[:-1]], unit_ends, strict=True)]


def _padding_cuts(rows: torch.Tensor, widths: torch.Tensor, parts: int) -> torch.Tensor:
    """Consecutive groups of n distinct lengths (`widths` [n] ascending, `rows` [n] of each), at most
    `parts` of them, with the least sum of (rows in the group x its widest) -> the groups' ends [g]
    (exclusive indices into the n lengths, ascending, the last = n). The fewest groups among equal
    costs. Exact dynamic program: best[e] over the first e lengths, one group more per pass."""
    n = len(rows)
    before = torch.cat([rows.new_zeros(1), rows.cumsum(0)])  # [n+1] rows of the first e lengths
    s, e = torch.arange(n + 1)[:, None], torch.arange(n + 1)[None, :]
    # added[s, e]: the group of lengths s..e-1 (padded to width e-1); impossible where s >= e
    big = torch.iinfo(torch.long).max // 4  # "impossible"; two of them still add without overflow
    added = torch.where(s < e, (before[e] - before[s]) * widths[(e - 1).clamp(min=0)], big)  # [n+1, n+1]
    best = torch.full((n + 1,), big)
    best[0] = 0
    cuts, totals = [], []
    for _ in range(min(parts, n)):
        best, cut = (best[:, None] + added).min(0)  # [n+1]: one group more
        best = best.clamp(max=big)
        cuts.append(cut)
        totals.append(int(best[n]))
    groups = totals.index(min(totals)) + 1
    ends, end = [], n
    for cut in reversed(cuts[:groups]):
        ends.append(end)
        end = int(cut[end])
    return torch.tensor(ends[::-1], dtype=torch.long)


def collate(trajectories: Sequence[Trajectory], pad_id: int, max_len: int | None = None,
            temperature: float | None = None) -> Batch:
    """Right-pad trajectories into a `Batch` (shapes documented on `Batch`).

    `max_len`, if given, is an upper bound: a longer trajectory is an error (never
    silently truncated, which would drop the reward-carrying end of an episode).
    `temperature`: the batch's (`Batch.temperature`); default the trajectories' own, which must agree.
    Imitation (SFT, RFT's rounds) passes 1.0: it fits the model itself to the tokens, whatever they were
    sampled at.
    """
    if not trajectories:
        raise ValueError("collate: no trajectories")
    lengths = [len(t) for t in trajectories]
    if min(lengths) < 2:
        raise ValueError("collate: every trajectory needs at least 2 tokens to predict one")
    T = max(lengths)
    if max_len is not None and T > max_len:
        i = lengths.index(T)
        raise ValueError(f"collate: trajectory {i} has {T} tokens, more than max_len={max_len}")
    B = len(trajectories)
    temps = sorted({float(t.temperature) for t in trajectories}) if temperature is None else [float(temperature)]
    if len(temps) > 1:
        raise ValueError(f"collate: the trajectories were sampled at different temperatures ({temps[0]:g} and "
                         f"{temps[-1]:g}); the trainer reads one temperature per batch: collate them apart")

    def padded(field: str, fill, dtype) -> torch.Tensor:  # one tensor per field, not one per row
        rows = [getattr(t, field) for t in trajectories]
        return torch.tensor([(list(r) if r is not None else [fill] * n) + [fill] * (T - n)
                             for r, n in zip(rows, lengths, strict=True)], dtype=dtype)

    ids, owners = padded("ids", pad_id, torch.long), padded("owners", int(Owner.TEMPLATE), torch.long)
    turns, old_lp = padded("turns", -1, torch.long), padded("logprobs", 0.0, torch.float32)
    versions = padded("versions", -1, torch.long)
    attn = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # [B, T]
    action_mask = ((owners[:, 1:] == Owner.POLICY) & attn[:, 1:]).float()  # [B, T-1]
    return Batch(
        ids=ids,
        attention_mask=attn,
        owners=owners,
        turns=turns,
        action_mask=action_mask,
        rewards=torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32),
        groups=torch.tensor([t.group for t in trajectories], dtype=torch.long),
        old_logprobs=old_lp[:, 1:].contiguous(),
        index=torch.arange(B),
        infos=[t.info for t in trajectories],
        temperature=temps[0],
        truncated=torch.tensor([t.truncated for t in trajectories], dtype=torch.bool),
        versions=versions[:, 1:].contiguous(),
    )


def pair_batch(pairs: Sequence[tuple[Trajectory, Trajectory]], pad_id: int) -> Batch:
    """Preference pairs as one batch: chosen episodes in rows [0, P), their rejected partners in rows
    [P, 2P); row i and row i + P share a `together` key, so no splitter separates a pair."""
    batch = collate([c for c, _ in pairs] + [r for _, r in pairs], pad_id)
    P = len(pairs)
    return Batch(**{**batch.__dict__, "together": torch.arange(P).repeat(2)})


def tool_call_mask(batch: Batch) -> torch.Tensor:
    """1.0 on the predicted tokens ids[:, 1:] that are the policy's tool calls: POLICY tokens of a turn that also
    holds TOOL tokens (turn k is action k and the observation answering it: trajtune.text.render), i.e. actions the
    environment executed and answered; an answer (a turn without a tool result) is not a call.

    batch.owners, batch.turns [B, T] -> [B, T-1] float (the action mask's positions)."""
    owners, turns = batch.owners, batch.turns.clamp(min=0)  # padding has turn -1
    n_turns = int(turns.max()) + 1 if turns.numel() else 1
    is_tool = (owners == int(Owner.TOOL)).float()  # [B, T]
    tool_turn = torch.zeros(owners.shape[0], n_turns).scatter_add_(1, turns, is_tool) > 0  # [B, K]
    answered = tool_turn.gather(1, turns)  # [B, T]: the token's turn got a tool result
    return ((owners == int(Owner.POLICY)) & answered)[:, 1:].to(batch.action_mask.dtype)
