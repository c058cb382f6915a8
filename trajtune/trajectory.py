"""Trajectories, token owners and batches: the data model every method shares.

A `Trajectory` is one episode flattened to a token sequence. Every token carries
an `owner` (who wrote it) and a `turn` (which exchange it belongs to). The loss
of every method is a weighted log-likelihood over the POLICY tokens only
(DESIGN.md, "The one idea"); the action mask is `owner == POLICY`, shifted by
one for next-token prediction. A single-turn prompt/completion pair is the
one-turn case of the same structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Sequence

import torch


class Owner(IntEnum):
    """Who produced a token. Only POLICY tokens are trained on."""

    TEMPLATE = 0  # chat-template / turn-wrapper tokens added by the renderer
    PROMPT = 1  # the task or user message
    POLICY = 2  # tokens the policy generated (or a demonstration of them)
    TOOL = 3  # environment / tool output


@dataclass
class Trajectory:
    """One episode as a flat token sequence.

    Per token: `ids`, `owners` (an `Owner` each), `turns` (0-based turn index).
    `logprobs` optionally holds, per token, the sampler's log-probability of that
    token (0.0 for tokens the policy did not sample); RL uses them as
    pi_old / behaviour log-probs.
    Per episode: `reward`, `group` (episodes sampled for the same task share a
    group id, used by group baselines), and `info` (task name, actions, counters).
    """

    ids: list[int] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    reward: float = 0.0
    group: int = -1
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.ids)
        if len(self.owners) != n or len(self.turns) != n:
            raise ValueError(
                f"Trajectory: ids ({n}), owners ({len(self.owners)}) and turns "
                f"({len(self.turns)}) must have the same length"
            )
        if self.logprobs is not None and len(self.logprobs) != n:
            raise ValueError(f"Trajectory: logprobs has {len(self.logprobs)} entries for {n} tokens")

    def __len__(self) -> int:
        return len(self.ids)

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

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def to(self, device: torch.device | str) -> "Batch":
        moved = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()
        }
        return Batch(**moved)

    def select(self, index: torch.Tensor | Sequence[int]) -> "Batch":
        """Sub-batch of rows `index` (keeps T; use for minibatches)."""
        index = torch.as_tensor(index, dtype=torch.long)
        out = {
            k: (v[index] if isinstance(v, torch.Tensor) else [v[i] for i in index.tolist()])
            for k, v in self.__dict__.items()
        }
        return Batch(**out)

    def trim(self) -> "Batch":
        """The same rows without the padding columns no row uses: T -> the longest row's length.

        Only for losses that read nothing of width T-1 from outside the batch (a loss indexing
        full-width per-token tensors by `index` would see other widths)."""
        T = int(self.attention_mask.sum(-1).max())
        if T == self.ids.shape[1]:
            return self
        out = dict(self.__dict__)
        for k in ("ids", "attention_mask", "owners", "turns"):
            out[k] = out[k][:, :T]
        for k in ("action_mask", "old_logprobs"):
            out[k] = out[k][:, : T - 1]
        return Batch(**out)


def collate(trajectories: Sequence[Trajectory], pad_id: int, max_len: int | None = None) -> Batch:
    """Right-pad trajectories into a `Batch` (shapes documented on `Batch`).

    `max_len`, if given, is an upper bound: a longer trajectory is an error (never
    silently truncated, which would drop the reward-carrying end of an episode).
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
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    owners = torch.full((B, T), int(Owner.TEMPLATE), dtype=torch.long)
    turns = torch.full((B, T), -1, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.bool)
    old_lp = torch.zeros((B, T), dtype=torch.float32)
    for b, t in enumerate(trajectories):
        n = len(t)
        ids[b, :n] = torch.tensor(t.ids, dtype=torch.long)
        owners[b, :n] = torch.tensor(t.owners, dtype=torch.long)
        turns[b, :n] = torch.tensor(t.turns, dtype=torch.long)
        attn[b, :n] = True
        if t.logprobs is not None:
            old_lp[b, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
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
    )
