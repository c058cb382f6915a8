"""KTO: preference optimisation from unpaired thumbs-up / thumbs-down episodes (RLHF book ch.8.2, ch.11.5;
Ethayarajh et al. 2024; the loss is `objectives.preference.kto_loss`).

Source: labelled episodes (prompt, completion, label: desirable or not) -- TRL's unpaired preference format,
`{"prompt", "completion", "label": true / false}` (trajtune.sources.data.kto_examples). No pairs are needed.
Weight: desirable episodes are pushed up by lambda_D (1 - sigma(beta (r - z0))), undesirable ones down by
lambda_U (1 - sigma(beta (z0 - r))), r = log pi(y|x) - log ref(y|x), against a reference point z0: the policy's
KL from the reference, estimated on *mismatched* pairs (x_i, y_j) -- prompt i with the completion of another row
-- and clamped at 0 (checklist 8.2 [EXT/CC]).

    0. reference   summed log ref of every episode and of its mismatched pair, once (`KTOState` keeps them)
    1. point       the step's mismatched pairs under the policy, no gradient: z0 = mean(log pi - log ref)
    2. step        kto_loss on the step's episodes (forward/backward, optimizer step)
    3. log         loss, z0, desirable / undesirable implicit rewards; evaluate; checkpoint

How this departs from TRL's KTOTrainer: (1) the mismatched completion of row i is row (i + 1) mod N's, fixed once
over the data set (TRL rotates completions within each batch), so their reference sums are taken once, like DPO's;
(2) a mismatched pair is spliced from tokens (row i up to its first POLICY token, row j from its first POLICY
token), not re-rendered from text: the same tokens whenever the chat template renders a completion the same
after any prompt; (3) z0 is not all-reduced separately: the engine's forward covers the whole step on every rank.
The config is `DPOConfig` with loss='kto' (steps, batch_size, beta, desirable_weight, undesirable_weight, seed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from ..engine import Engine, ForwardOutput, Loss
from ..metrics import register
from ..objectives.inputs import PreferenceInputs
from ..objectives.preference import kto_loss
from ..runs.loop import Run, eval_due
from ..trajectory import Batch, Owner, Trajectory, collate
from .common import train_row
from .dpo import DPOConfig, summed_logps
from .sft import batch_indices

Example = tuple[Trajectory, bool]  # (episode, desirable)

register("kto/kl", "KTO: mean log pi - log ref of the step's mismatched (prompt, other completion) pairs, before "
                   "kto_loss clamps it at 0 into the reference point kto/z0")
register("eval/kto_loss", "the KTO loss on held-out labelled rows (--eval-data with --loss kto)")
register("eval/kto_accuracy", "share of held-out labelled rows whose implicit reward beta (log pi - log ref) - z0 has "
                              "the label's sign")


def mismatched(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """Row i's prompt with row (i + 1) mod N's completion, spliced at each row's first POLICY token: the
    mismatched pairs (x_i, y_j) whose policy / reference log-ratio estimates KL(pi || ref) for z0."""
    firsts = []
    for i, t in enumerate(trajs):
        first = next((k for k, o in enumerate(t.owners) if o == Owner.POLICY), None)
        if first is None:
            raise ValueError(f"kto: episode {i} ({t.info.get('source', 'no source')}) has no POLICY token to score")
        firsts.append(first)
    out = []
    for i, t in enumerate(trajs):
        j = (i + 1) % len(trajs)
        u, a, b = trajs[j], firsts[i], firsts[j]
        out.append(Trajectory(t.ids[:a] + u.ids[b:], t.owners[:a] + u.owners[b:], t.turns[:a] + u.turns[b:],
                              info={"source": t.info.get("source", ""), "completion_of": j}))
    return out


def kto_loss_fn(config: DPOConfig) -> Loss:
    """The KTO loss of a batch whose `pref` (`PreferenceInputs`) holds ref_sums [B], desirable [B] (bool) and z0 [B]
    (the step's reference point, the same number on every row, so a split of the batch keeps it). With the step's
    totals in pref.n_rows [B] and pref.n_desirable [B] (the same number on every row), the implicit-reward metrics
    are scaled
    so that the engine's share-weighted sum over a step's parts (micro-batches, length buckets) is the step's mean
    over its desirable / undesirable rows -- a part holding only one kind adds 0 to the other, not NaN."""

    def kto(out: ForwardOutput, batch: Batch):
        sums_B = summed_logps(out.logprobs, batch.action_mask)  # [B]
        x = batch.pref
        if x is None or x.ref_sums is None or x.desirable is None or x.z0 is None:
            raise KeyError("kto_loss_fn reads batch.pref's ref_sums, desirable and z0 (`kto_batches`, `train_kto`)")
        loss, metrics = kto_loss(sums_B, x.ref_sums, x.desirable, x.z0, config.beta,
                                 config.desirable_weight, config.undesirable_weight)
        if x.n_rows is not None and x.n_desirable is not None:
            reward_B = config.beta * (sums_B - x.ref_sums).detach()  # [B]
            good_B, scale = x.desirable.bool(), x.n_rows[0] / batch.size  # share of this part: size / n_rows
            for name, rows_B, n in (("desirable", good_B, x.n_desirable[0]),
                                    ("undesirable", ~good_B, x.n_rows[0] - x.n_desirable[0])):
                metrics[f"kto/{name}_reward"] = scale * reward_B[rows_B].sum() / n if n > 0 else reward_B.new_tensor(
                    float("nan"))
        return loss, metrics

    return Loss(kto, normalizer="sequence")  # a mean over episodes


@dataclass
class KTOState:
    """What KTO carries across steps besides the engine (saved with it): the reference sums."""

    ref_sums: torch.Tensor | None = None
    """[N] summed reference log-probs of each episode"""
    ref_kl_sums: torch.Tensor | None = None
    """[N] summed reference log-probs of each episode's mismatched pair"""


def kto_batches(engine: Engine, examples: Sequence[Example], pad_id: int,
                state: KTOState | None = None) -> tuple[Batch, Batch, KTOState]:
    """(the episodes' batch with pref.ref_sums [N] and pref.desirable [N], the mismatched pairs' batch with
    pref.ref_sums [N], the state holding both reference sums): the reference is the engine's policy now, unless
    `state` already holds its sums (a resume)."""
    trajs = [t for t, _ in examples]
    full, kl = collate(trajs, pad_id, temperature=1.0), collate(mismatched(trajs), pad_id, temperature=1.0)
    if state is None or state.ref_sums is None:
        reference = engine.reference_engine()
        state = KTOState(_sums(reference, full), _sums(reference, kl))
    desirable_N = torch.tensor([bool(y) for _, y in examples])
    return (replace(full, pref=PreferenceInputs(ref_sums=state.ref_sums, desirable=desirable_N)),
            replace(kl, pref=PreferenceInputs(ref_sums=state.ref_kl_sums)), state)


def _sums(engine: Engine, batch: Batch) -> torch.Tensor:
    """[B] summed log-probs of the POLICY tokens of `batch` under `engine` (no gradient), on the CPU."""
    logp_B_T = engine.forward(batch).logprobs  # [B, T-1]
    return summed_logps(logp_B_T, batch.action_mask.to(logp_B_T.device)).cpu()


def _pref(batch: Batch) -> PreferenceInputs:
    """The batch's preference inputs (`kto_batches` sets them)."""
    if batch.pref is None:
        raise KeyError("batch.pref (kto_batches)")
    return batch.pref


def reference_point(engine: Engine, kl: Batch, rows: torch.Tensor) -> torch.Tensor:
    """[] the mean policy / reference log-ratio of mismatched pairs `rows` [B] (no gradient; kto_loss clamps it
    at 0 and detaches it)."""
    return (_sums(engine, kl.select(rows)) - _pref(kl).ref_sums[rows]).mean()


def train_kto(engine: Engine, examples: Sequence[Example], config: DPOConfig, pad_id: int,
              run: Run | None = None) -> list[dict]:
    """Train on labelled episodes [(episode, desirable)] with config.loss == 'kto'. Resumes exactly with a
    checkpointer on `run` (the reference sums are saved: `KTOState`; step s's batch is a function of (seed, s))."""
    if config.loss != "kto":
        raise ValueError(f"train_kto: config.loss must be 'kto', got {config.loss!r} (pairs train with train_dpo)")
    if not examples:
        raise ValueError("train_kto: no labelled episodes")
    run = run or Run("kto")
    start, state = run.start(engine, KTOState())
    loss = kto_loss_fn(config)
    # 0. the reference sums of the episodes and their mismatched pairs (from the checkpoint on a resume)
    full, kl, state = kto_batches(engine, examples, pad_id, state if start else None)
    N = full.size
    for step in run.steps(start, config.steps):
        rows = torch.arange(N) if not config.batch_size else batch_indices(N, config.batch_size, config.seed, step)
        # 1. the reference point z0 from the step's mismatched pairs
        z0 = reference_point(engine, kl, rows)
        # 2. one step on the step's episodes
        B = len(rows)
        n_desirable = float(_pref(full).desirable[rows].sum())
        part = full.select(rows)
        batch = replace(part, pref=replace(_pref(part), z0=z0.expand(B).clone(), n_rows=torch.full((B,), float(B)),
                                           n_desirable=torch.full((B,), n_desirable)))
        m = engine.forward_backward(batch, loss, buckets=config.length_buckets)
        o = engine.optim_step()
        # 3. log, evaluate, checkpoint
        row = {**train_row(m, o), "kto/kl": float(z0)}
        run.end_step(engine, step + 1, row, eval_now=eval_due(step + 1, config.steps, config.eval_every), state=state)
    return run.history


def eval_kto(engine: Engine, examples: Sequence[Example], ref: KTOState, config: DPOConfig, pad_id: int) -> dict:
    """eval/kto_loss and eval/kto_accuracy on held-out labelled episodes against reference sums `ref` (taken
    before training: `kto_batches`): the loss with z0 from their own mismatched pairs, and the share of episodes
    whose implicit reward r - z0 has the label's sign (> 0 desirable, < 0 undesirable)."""
    full, kl, _ = kto_batches(engine, examples, pad_id, ref)
    rows = torch.arange(full.size)
    z0 = reference_point(engine, kl, rows)
    batch = replace(full, pref=replace(_pref(full), z0=z0.expand(full.size).clone()))
    out = engine.forward(batch)
    loss, _ = kto_loss_fn(config)(out, batch.to(out.logprobs.device))
    r_N = _sums(engine, full) - _pref(full).ref_sums
    margin_N = r_N - z0.clamp(min=0)
    right = torch.where(_pref(full).desirable, margin_N > 0, margin_N < 0)
    return {"eval/kto_loss": float(loss), "eval/kto_accuracy": float(right.float().mean())}
