"""Pieces the sampling loops share: the `Collect` source, task picking, rollout statistics, selection.

A loop that trains on the policy's own samples gets them from a `Collect`:

    collect(tasks, n_per_task, generator) -> list[Trajectory]

which runs `n_per_task` episodes of every task with the *current* policy and
returns finished trajectories with `reward`, `group` (one id per task
instance) and `info` set. Experiments build it with `trajtune.rollout.make_collect`
from a sampler (`engine.sample`), an environment factory and a renderer; loops
never see environments.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, Callable, Literal, Sequence

import torch

from ..logprobs import aggregation_share
from ..trajectory import Batch, Owner, Trajectory

Collect = Callable[[Sequence[Any], int, torch.Generator], list[Trajectory]]


def pick_tasks(tasks: Sequence[Any], n: int, generator: torch.Generator) -> list[Any]:
    """`n` tasks: a random permutation's prefix when n <= len(tasks), else whole passes plus a prefix."""
    out: list[Any] = []
    while len(out) < n:
        perm = torch.randperm(len(tasks), generator=generator).tolist()
        out += [tasks[i] for i in perm[: n - len(out)]]
    return out


def rollout_metrics(trajs: Sequence[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    """Mean reward, pass rate (reward >= 1), POLICY tokens and invalid calls per episode."""
    if not trajs:
        return {}
    n = len(trajs)
    out = {
        f"{prefix}/reward": sum(t.reward for t in trajs) / n,
        f"{prefix}/pass_rate": sum(t.reward >= 1.0 for t in trajs) / n,
        f"{prefix}/policy_tokens": sum(t.count(Owner.POLICY) for t in trajs) / n,
    }
    if all("n_invalid" in t.info for t in trajs):
        out[f"{prefix}/invalid_per_episode"] = sum(t.info["n_invalid"] for t in trajs) / n
    return out


Selection = Literal["accepted", "top_per_prompt", "top_overall"]


def check_selection(config, name: str) -> None:
    """Shared checks of the sample-and-select loops' configs (RFT, iw-SFT)."""
    if not math.isfinite(config.threshold):
        raise ValueError(f"{name}: threshold must be a finite number, got {config.threshold}")
    if config.aggregation == "constant":
        raise ValueError(f"{name}: aggregation='constant' needs a constant, which {name} has not (use token or sequence)")


def select_episodes(
    trajs: Sequence[Trajectory],
    mode: Selection = "accepted",
    threshold: float = 1.0,
    top_fraction: float = 0.25,
    random_control: bool = False,
    seed: int = 0,
) -> list[Trajectory]:
    """Which sampled episodes rejection sampling keeps (RLHF book ch.9).

    accepted:        reward >= threshold (a verifier's yes)
    top_per_prompt:  the best-scoring episode of each group (ties: the first)
    top_overall:     the best `top_fraction` of all episodes
    random_control:  keep the same *number* of episodes, chosen uniformly at random --
                     the control that shows how much the selection itself matters
    """
    trajs = list(trajs)
    if mode == "accepted":
        kept = [t for t in trajs if t.reward >= threshold]
    elif mode == "top_per_prompt":
        best: dict[int, Trajectory] = {}
        for t in trajs:
            if t.group not in best or t.reward > best[t.group].reward:
                best[t.group] = t
        kept = list(best.values())
    elif mode == "top_overall":
        k = max(1, round(top_fraction * len(trajs)))
        kept = sorted(trajs, key=lambda t: -t.reward)[:k]
    else:
        raise ValueError(f"unknown selection {mode!r}; choose accepted, top_per_prompt or top_overall")
    if random_control:
        kept = random.Random(seed).sample(trajs, len(kept))
    return kept


def action_key(t: Trajectory) -> tuple:
    """Identity of an episode for deduplication: its task and its sequence of actions."""
    return (t.info.get("task"), tuple(t.info.get("actions", ())) or tuple(t.tokens_of(Owner.POLICY)))


def dedup_and_cap(trajs: Sequence[Trajectory], dedup: bool, per_task_cap: int) -> list[Trajectory]:
    """Drop repeated (task, action sequence) episodes and keep at most `per_task_cap` per task (0: no cap)."""
    seen, per_task, out = set(), Counter(), []
    for t in trajs:
        key = action_key(t)
        if dedup and key in seen:
            continue
        task = t.info.get("task", t.group)
        if per_task_cap and per_task[task] >= per_task_cap:
            continue
        seen.add(key)
        per_task[task] += 1
        out.append(t)
    return out


def shares(trajs: Sequence[Trajectory], key: str) -> dict[str, float]:
    """Share of episodes per value of `info[key]` (e.g. the task family)."""
    counts = Counter(str(t.info.get(key)) for t in trajs)
    n = max(1, len(trajs))
    return {k: v / n for k, v in sorted(counts.items())}


def train_row(loss_metrics: dict, optim_metrics: dict) -> dict:
    """The `train/*` metrics of one optimizer step plus the loss function's own statistics."""
    row = {"train/loss": loss_metrics["loss"], "train/grad_norm": optim_metrics["grad_norm"],
           "train/lr": optim_metrics["lr"], "train/skipped": optim_metrics.get("skipped", 0.0)}
    row.update({k: v for k, v in loss_metrics.items() if k != "loss"})
    return row


def finish_step(step: int, steps: int, row: dict, history: list, logger=None, evaluate=None,
                eval_every: int = 0, stage: str = "") -> None:
    """Evaluate when due (every `eval_every` steps and after the last), log, and append to history.

    `step` is 0-based; rows are logged at the number of completed steps, step + 1.
    """
    if evaluate is not None and (step == steps - 1 or (eval_every and (step + 1) % eval_every == 0)):
        row.update(evaluate(step + 1))
    if logger is not None:
        logger.log(step + 1, row, stage=stage)
    history.append({"step": step + 1, **row})


# --- resume (trajtune.resume) ---------------------------------------------------------------
def start_from(checkpointer, engine, logger=None, stage: str = "") -> tuple[int, list[dict], dict]:
    """Where a loop starts: (completed steps, its history so far, its saved loop state).

    Without a checkpointer, or on a fresh run: (0, [], {}). On a resume the engine is
    restored, the logger forgets the stage's rows after the checkpoint (they are logged
    again), and the history comes back from the checkpoint, so the loop returns the
    same rows as an uninterrupted run.
    """
    if checkpointer is None:
        return 0, [], {}
    start = checkpointer.resume(engine)
    if start and logger is not None:
        logger.drop_after(stage, start)
    state = dict(checkpointer.state)
    return start, list(state.pop("history", [])), state


def save_point(checkpointer, engine, completed: int, history: list[dict], allowed: bool = True,
               tensors: Callable[[], dict] | None = None, **state: Any) -> None:
    """After an optimizer step: checkpoint when due or interrupted (see Checkpointer.step_done).

    The loop's `history` and keyword `state` (a value that is a function is called
    only when saving) are saved with the engine; `tensors` (a function too) adds the
    loop's tensors."""
    if checkpointer is not None:
        checkpointer.step_done(engine, completed,
                               lambda: {"history": history, **{k: v() if callable(v) else v for k, v in state.items()}},
                               tensors, allowed)



# --- length buckets -------------------------------------------------------------------------
def bucketed_forward_backward(engine, batch: Batch, loss_fn, buckets: int, pairs: bool = False,
                              values: bool = False) -> dict:
    """`engine.forward_backward(batch, loss_fn)` in `buckets` groups of similar length, each
    without the padding columns it does not use (`Batch.trim`), weighted like micro-batches.

    The rows are sorted by length and split into `buckets` groups; a group's loss is scaled by
    its share of the batch's normaliser (`logprobs.aggregation_share` with `loss_fn.aggregation`),
    so the accumulated gradient and the share-weighted metrics equal the one-group ones up to
    float rounding. pairs=True: rows [0, P) and [P, 2P) are (chosen, rejected) pairs
    (`dpo.pair_batch`); a pair stays together and sorts by its longer side. A loss that reads
    per-token tensors of the whole batch must cut them to the part's width (the RL loss does;
    SFT, preference and reward-model losses read nothing of the kind).
    """
    if buckets <= 1:
        return engine.forward_backward(batch, loss_fn, values=values)
    lengths = batch.attention_mask.sum(-1)  # [B]
    mode = getattr(loss_fn, "aggregation", "sequence")
    if pairs:
        P = batch.size // 2
        order = torch.argsort(torch.maximum(lengths[:P], lengths[P:]), stable=True)
        groups = [torch.cat([g, g + P]) for g in order.chunk(buckets)]
    else:
        groups = list(torch.argsort(lengths, stable=True).chunk(buckets))
    metrics: dict[str, float] = {}
    for rows in groups:
        part = batch.select(rows).trim()
        share = aggregation_share(part.action_mask, batch.action_mask, mode)
        m = engine.forward_backward(part, loss_fn, scale=share, values=values)
        for k, v in m.items():
            metrics[k] = metrics.get(k, 0.0) + share * v
    return metrics
