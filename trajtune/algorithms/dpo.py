"""Direct preference optimisation and its relatives (RLHF book ch.8; seed agent-rl ch.15 §15.4).

Source: a fixed set of (chosen, rejected) trajectory pairs -- or, with
`regenerate_every`, pairs re-made from the current policy every K steps: online DPO (`OnlinePairs` samples two
completions per prompt from a source that scores them -- a reward function, reward model or judge -- and
pairs the better with the worse, skipping ties).
Weight: +-beta * sigmoid(-margin) on the chosen / rejected log-likelihood (DPO);
IPO, conservative DPO, DPO + NLL (RPO), SimPO and ORPO change the link. ODPO and REBEL also read how much better
each pair's chosen side is (its score difference: the row's 'score_chosen' - 'score_rejected', or 'margin';
`score_difference`; online, the reward difference): ODPO demands a log-ratio margin above an
offset that grows with it, REBEL regresses beta times the log-ratio margin onto it.

    1. reference   summed log pi_ref of every pair, once per pair set (engine.reference_engine())
    2. step        a batch of pairs: forward chosen and rejected together (on Hugging Face models their
                   shared prompt runs once: the engine's `share_prefix`), preference loss
    3. log         loss, implicit rewards, chosen/rejected log-prob drift (A7's d_chosen, d_rejected)

The reference sums travel on the pair batch (`Batch.pref.ref_sums`: `PreferenceInputs`); a pair is one
unit of `Batch.together`, so no split (buckets, micro-batches, ranks) separates it.

What is scored: the POLICY tokens of each side, i.e. the completion only -- assistant turns
inside a conversational prompt are context (trajtune.sources.data), as in TRL's DPOTrainer.

Log-prob SUMS, and what that means for IPO. DPO and IPO get the summed log-probs of each
completion: h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)) over whole
sequences. For DPO this is TRL's loss exactly. For IPO, (h - 1/(2 beta))^2 regresses the
*sequence-level* log-ratio margin to 1/(2 beta); TRL's "ipo" divides each side's log-ratio by
its completion length first (a per-token average), so its margin target is per token. At the
same beta the targets differ by the completion length: for TRL's target on completions of
~L tokens, use beta / L here (the loss, not its minimiser, is then L^2 times TRL's; AdamW
hardly cares). SimPO and ORPO use per-token averages in both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Literal, Sequence

import torch

from ..config import check_choices, check_ranges
from ..engine import Engine, ForwardOutput, Loss
from ..metrics import register
from ..sources.base import Draw, Source, pick_tasks
from ..runs.loop import Run, eval_due
from ..objectives.inputs import PreferenceInputs
from ..objectives.preference import apo_loss, dpo_loss, odpo_offset, orpo_loss, rebel_loss, simpo_loss, slic_hinge_loss
from ..trajectory import Batch, Trajectory, pair_batch
from .common import train_row
from .sft import batch_indices
from ..seeding import generator

Pair = tuple[Trajectory, Trajectory]  # (chosen, rejected)

register("online/pairs", "online DPO: pairs made in the step's round (sampled from the current policy, labelled by "
                         "reward; ties skipped)")
register("online/ties", "online DPO: prompts of the round whose two completions got the same reward (no pair)")
register("online/chosen_reward", "online DPO: mean reward of the round's chosen completions")
register("online/rejected_reward", "online DPO: mean reward of the round's rejected completions")


@dataclass
class DPOConfig:
    steps: int = 100
    """optimizer steps"""
    batch_size: int = 0
    """pairs per step (0: all pairs, full-batch as in the seed)"""
    loss: Literal["dpo", "dpo_norm", "ipo", "simpo", "orpo", "kto", "odpo", "rebel", "slic", "apo_zero",
                  "apo_down"] = "dpo"
    """which preference loss (dpo_norm: DPO on per-token average log-probs, Tülu 3's length-normalised DPO; the
    book's companion code uses beta 2.0 with it; kto: unpaired thumbs-up / down rows, trajtune.algorithms.kto;
    odpo: DPO with an offset, -log sigma(beta h - odpo_alpha f(d)); rebel: (beta h - d)^2 -- both need each pair's
    score difference d: 'score_chosen'/'score_rejected' or 'margin' columns, or online DPO's rewards; slic: SLiC-HF's
    hinge max(0, slic_delta - log-likelihood margin), reference-free, + nll_weight x the chosen NLL; apo_zero /
    apo_down: Anchored Preference Optimization, chosen up and rejected down / both down, the rejected more)"""
    beta: float = 0.1
    """KL strength (DPO/IPO/ODPO), reward scale (SimPO), or REBEL's 1/eta (the log-ratio margin's scale)"""
    label_smoothing: float = 0.0
    """conservative DPO: assumed probability that a label is flipped"""
    nll_weight: float = 0.0
    """weight of the NLL on chosen tokens (DPO + NLL, RPO)"""
    simpo_gamma_ratio: float = 0.5
    """SimPO target margin gamma / beta"""
    orpo_lambda: float = 0.1
    """ORPO odds-ratio weight"""
    slic_delta: float = 1.0
    """SLiC-HF: the hinge's margin on log pi(chosen) - log pi(rejected) (nats)"""
    odpo_alpha: float = 1.0
    """ODPO: the offset's scale alpha in Delta = alpha f(score difference)"""
    odpo_scale: Literal["log", "identity"] = "log"
    """ODPO: f, log (Amini et al.'s default; a difference <= 0 gives offset 0) or identity"""
    desirable_weight: float = 1.0
    """KTO: weight lambda_D of the desirable (thumbs-up) rows' loss"""
    undesirable_weight: float = 1.0
    """KTO: weight lambda_U of the undesirable rows' loss (the KTO paper keeps lambda_D n_D / (lambda_U n_U) in
    [1, 4/3]; the book's companion code suggests 1.33 with balanced data)"""
    regenerate_every: int = 0
    """re-make pairs from the current policy (and reset the reference) every this many steps (0: offline)"""
    length_buckets: int = 1
    """forward each step's pairs in this many groups of similar length, each without the padding it does not
    need, and accumulate (the same gradient up to float rounding; faster when lengths vary)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """batch of step s is a function of (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if not self.beta > 0:  # also rejects NaN
            raise ValueError(f"DPOConfig: beta must be > 0, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"DPOConfig: label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        check_ranges(self, "DPOConfig", non_negative=("nll_weight", "simpo_gamma_ratio", "orpo_lambda", "slic_delta",
                                                      "desirable_weight", "undesirable_weight", "odpo_alpha"))
        if self.loss == "rebel" and (self.label_smoothing or self.nll_weight):
            raise ValueError("DPOConfig: loss='rebel' is a regression; label_smoothing and nll_weight must be 0")
        if self.loss in ("slic", "apo_zero", "apo_down") and self.label_smoothing:
            raise ValueError(f"DPOConfig: loss={self.loss!r} has no label smoothing; label_smoothing must be 0")
        if self.loss in ("apo_zero", "apo_down") and self.nll_weight:
            raise ValueError(f"DPOConfig: loss={self.loss!r} anchors each reply to the reference; nll_weight must be 0")
        if self.loss == "kto" and self.regenerate_every:
            raise ValueError("DPOConfig: loss='kto' trains on fixed labelled rows; regenerate_every must be 0")
        if self.steps < 0 or self.batch_size < 0 or self.regenerate_every < 0 or self.eval_every < 0:
            raise ValueError("DPOConfig: steps, batch_size, regenerate_every and eval_every must be >= 0")
        if self.length_buckets < 1:
            raise ValueError(f"DPOConfig: length_buckets must be >= 1, got {self.length_buckets}")


def pair_step(engine: Engine, full: Batch, rows: torch.Tensor, loss: Loss, buckets: int = 1) -> dict:
    """forward_backward on pairs `rows` [p] of a `pair_batch` `full` -> the loss's metrics
    (buckets > 1: in groups of similar length, each pair kept whole). Not trimmed to the step's longest row:
    at the first step the policy is the reference, whose sums come from the whole pair set's padded rows, and the
    same shapes keep every margin exactly 0 there (trimmed, float rounding gives it a sign and dpo/accuracy
    counts noise). Length buckets trim each group to its own longest row, so with buckets > 1 the first step's
    margins are rounding noise around 0 (~1e-7) and its dpo/accuracy is the share of noise that came out > 0."""
    P = full.size // 2
    return engine.forward_backward(full.select(torch.cat([rows, rows + P])), loss, buckets=buckets)


def summed_logps(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T-1] per-token log-probs -> [B] sum over POLICY tokens."""
    return (logprobs * mask).sum(-1)


SCORED_LOSSES = ("odpo", "rebel")
"""the losses that read each pair's score difference (`batch.pref.score_diff`)"""


class MissingScores(ValueError):
    """A pair without the score difference its loss (ODPO, REBEL) needs; the message names its row."""


def score_difference(info: dict) -> float | None:
    """How much better a pair's chosen side is, from its chosen episode's `info` (the preference row's columns,
    `trajtune.sources.data.pair_columns`; online DPO's rewards, `labelled_pairs`): score_chosen - score_rejected,
    else margin; None when it has neither."""
    if "score_chosen" in info and "score_rejected" in info:
        return float(info["score_chosen"]) - float(info["score_rejected"])
    return float(info["margin"]) if "margin" in info else None


def pair_score_diffs(pairs: Sequence[Pair], needs: str) -> torch.Tensor:
    """[P] each pair's `score_difference`; a pair without one is `MissingScores` naming its row (info['source']) and
    what needs it (`needs`: "loss 'odpo'", "--loss odpo")."""
    diffs = []
    for i, (chosen, _) in enumerate(pairs):
        d = score_difference(chosen.info)
        if d is None:
            where = chosen.info.get("source", f"pair {i}")
            raise MissingScores(f"{where}: {needs} needs each pair's score difference: 'score_chosen' and "
                                "'score_rejected' columns, or a 'margin' column (how much better 'chosen' is); this "
                                "row has none of them")
        diffs.append(d)
    return torch.tensor(diffs, dtype=torch.float32)


def pair_set(pairs: Sequence[Pair], pad_id: int, config: DPOConfig) -> Batch:
    """The `pair_batch` of `pairs` [2P rows: chosen, then rejected] with the per-pair tensors `config.loss` reads
    besides the reference: pref.score_diff [2P] (each pair's difference on both its rows) for odpo / rebel."""
    full = pair_batch(pairs, pad_id)
    if config.loss not in SCORED_LOSSES:
        return full
    return replace(full, pref=PreferenceInputs(score_diff=pair_score_diffs(pairs, f"loss {config.loss!r}").repeat(2)))


def with_ref_sums(batch: Batch, ref_sums: torch.Tensor | None) -> Batch:
    """`batch` with the reference sums [B] in `batch.pref` (beside the score differences it may hold)."""
    return replace(batch, pref=replace(batch.pref or PreferenceInputs(), ref_sums=ref_sums))


def preference_loss_fn(config: DPOConfig) -> Loss:
    """The preference loss of a `pair_batch` part (chosen rows, then rejected rows); DPO, dpo_norm, IPO, ODPO and
    REBEL read the reference sums [2p] from `batch.pref.ref_sums`, ODPO and REBEL the pairs' score
    differences [2p] from `batch.pref.score_diff` (`pair_set`)."""

    def preference(out: ForwardOutput, batch: Batch):
        P, x = batch.size // 2, batch.pref or PreferenceInputs()
        mask = batch.action_mask
        sums, counts = summed_logps(out.logprobs, mask), mask.sum(-1)  # [2P]
        if config.loss in ("dpo", "ipo", "odpo"):
            ref = _needs(x.ref_sums, "ref_sums")
            offset = None
            if config.loss == "odpo":  # Delta = alpha f(d); odpo_offset takes two scores, d is their difference
                diff_P = _needs(x.score_diff, "score_diff")[:P]
                offset = odpo_offset(diff_P, torch.zeros_like(diff_P), config.odpo_alpha, config.odpo_scale)
            return dpo_loss(sums[:P], sums[P:], ref[:P], ref[P:], config.beta,
                            loss_type="ipo" if config.loss == "ipo" else "sigmoid",
                            label_smoothing=config.label_smoothing, nll_weight=config.nll_weight,
                            chosen_lengths=counts[:P] if config.nll_weight else None, offset=offset)
        if config.loss == "rebel":
            ref = _needs(x.ref_sums, "ref_sums")
            return rebel_loss(sums[:P], sums[P:], ref[:P], ref[P:], _needs(x.score_diff, "score_diff")[:P],
                              eta=1.0 / config.beta)
        if config.loss == "slic":
            return slic_hinge_loss(sums[:P], sums[P:], config.slic_delta, nll_weight=config.nll_weight)
        if config.loss in ("apo_zero", "apo_down"):
            ref = _needs(x.ref_sums, "ref_sums")
            return apo_loss(sums[:P], sums[P:], ref[:P], ref[P:], config.beta, variant=config.loss.removeprefix("apo_"))
        avg = sums / counts.clamp(min=1)
        if config.loss == "dpo_norm":
            ref_avg = _needs(x.ref_sums, "ref_sums") / counts.clamp(min=1)
            return dpo_loss(avg[:P], avg[P:], ref_avg[:P], ref_avg[P:], config.beta,
                            label_smoothing=config.label_smoothing, nll_weight=config.nll_weight,
                            chosen_lengths=counts[:P] if config.nll_weight else None)
        if config.loss == "simpo":
            return simpo_loss(avg[:P], avg[P:], config.beta, config.simpo_gamma_ratio)
        return orpo_loss(avg[:P], avg[P:], config.orpo_lambda)

    return Loss(preference, normalizer="sequence")  # a mean over pairs


def _needs(x: torch.Tensor | None, name: str) -> torch.Tensor:
    """A preference input the loss reads (a KeyError naming it where the batch lacks it, as a missing extras key
    raised)."""
    if x is None:
        raise KeyError(f"batch.pref.{name}")
    return x


@dataclass
class DPOState:
    """What DPO carries across steps besides the engine (saved with it)."""

    ref_sums: torch.Tensor | None = None
    """[2P] reference log-prob sums of the current pair set"""
    pairs: list[Pair] | None = None
    """the current pair set, when it is regenerated from the policy (regenerate_every > 0)"""


def with_reference(engine: Engine, pairs: Sequence[Pair], pad_id: int, config: DPOConfig | None = None) -> Batch:
    """The pair batch (`pair_set`: with the score differences `config.loss` reads) with the reference sums (the
    current policy, frozen) in `pref.ref_sums` [2P]."""
    full = pair_set(pairs, pad_id, config) if config is not None else pair_batch(pairs, pad_id)
    reference = engine.reference_engine()
    return with_ref_sums(full, summed_logps(reference.forward(full).logprobs, full.action_mask))


def labelled_pairs(trajs: Sequence[Trajectory], n: int) -> tuple[list[Pair], dict[str, float]]:
    """Episodes in groups of `n` (task-major, as a source returns them) -> per group (its highest-reward episode,
    its lowest) as (chosen, rejected), the chosen one's info carrying both rewards as 'score_chosen' /
    'score_rejected' (what ODPO and REBEL read), and the round's metrics (online/*). A group is skipped when its best
    and worst rewards tie or fewer than 2 of its episodes are trainable (an environment or reward failure)."""
    if n < 2 or len(trajs) % n:
        raise ValueError(f"labelled_pairs: {len(trajs)} episodes do not make groups of n = {n} >= 2")
    pairs, ties = [], 0
    for g in range(0, len(trajs), n):
        group = sorted((t for t in trajs[g : g + n] if t.trainable), key=lambda t: -t.reward)  # stable: first wins
        if len(group) < 2 or group[0].reward == group[-1].reward:
            ties += len(group) >= 2
            continue
        chosen, rejected = group[0], group[-1]  # the rewards are the pair's scores (ODPO, REBEL: score_difference)
        scores = {"score_chosen": float(chosen.reward), "score_rejected": float(rejected.reward)}
        pairs.append((replace(chosen, info={**chosen.info, **scores}), rejected))
    metrics = {"online/pairs": float(len(pairs)), "online/ties": float(ties)}
    if pairs:
        metrics["online/chosen_reward"] = sum(c.reward for c, _ in pairs) / len(pairs)
        metrics["online/rejected_reward"] = sum(r.reward for _, r in pairs) / len(pairs)
    return pairs, metrics


class NoPairs(ValueError):
    """Online DPO's first round gave no pair: every prompt's completions tied (or failed)."""


class OnlinePairs:
    """Online DPO's pair maker (RLHF book ch.8.2: pairs sampled from the *current* model and labelled during
    training): each call draws `prompts` tasks (seeded by the generator train_dpo passes: a function of
    (seed, step)), samples `samples` completions of each from `source` -- which scores them: a reward function,
    a reward model or a judge (`trajtune.sources.scoring.Scored`; a pairwise judge compares the two) -- and pairs
    the best with the worst (`labelled_pairs`; ties skipped). Pass it as train_dpo's `make_pairs`.

    A round whose every prompt ties keeps the previous round's pairs (their reference is re-taken); the first
    round must give at least one pair. `Draw.step` (a reward function's trainer_state.global_step) counts this
    maker's rounds."""

    def __init__(self, source: Source, tasks: Sequence, prompts: int, samples: int = 2):
        if prompts < 1 or samples < 2:
            raise ValueError(f"OnlinePairs: prompts must be >= 1 and samples >= 2, got {prompts}, {samples}")
        self.source, self.tasks, self.prompts, self.samples = source, list(tasks), prompts, samples
        self.last: list[Pair] = []
        self.rounds = 0

    def __call__(self, engine: Engine, generator: torch.Generator) -> tuple[list[Pair], dict[str, float]]:
        metrics = self.source.after_update(engine)  # a sampler holding its own weights: bring it up to date
        draw = Draw(pick_tasks(self.tasks, self.prompts, generator), self.samples, generator, self.rounds)
        episodes = self.source.take(draw)
        self.rounds += 1
        pairs, round_metrics = labelled_pairs(episodes.trajs, self.samples)
        if not pairs and not self.last:
            raise NoPairs(f"online DPO: every one of the {len(draw.tasks)} prompts' {self.samples} completions got "
                             "the same reward (or failed), so there is no pair to train on; a reward that tells the "
                             "completions apart, more prompts per round or a higher temperature would give some")
        # DPO scores the model itself (temperature 1), whatever temperature the completions were sampled at
        self.last = [(replace(c, temperature=1.0), replace(r, temperature=1.0)) for c, r in pairs] or self.last
        return self.last, {**metrics, **episodes.metrics, **round_metrics}


def train_dpo(engine: Engine, pairs: Sequence[Pair], config: DPOConfig, pad_id: int, run: Run | None = None,
              make_pairs: Callable[[Engine, torch.Generator], list[Pair] | tuple[list[Pair], dict]] | None = None
              ) -> list[dict]:
    """Train on preference pairs; `make_pairs(engine, generator)` is needed for regenerate_every > 0 (online DPO:
    `OnlinePairs`); it returns the new pairs, or (pairs, metrics) whose metrics join that step's row.

    Resumes exactly with a checkpointer on `run`: the reference sums (and, with `regenerate_every`,
    the current pair set) are saved with each checkpoint (`DPOState`)."""
    if config.loss == "kto":
        raise ValueError("train_dpo: loss='kto' trains on labelled rows, not pairs: "
                         "use trajtune.algorithms.kto.train_kto")
    if config.regenerate_every and make_pairs is None:
        raise ValueError("train_dpo: regenerate_every > 0 needs make_pairs")
    if not pairs and make_pairs is None:
        raise ValueError("train_dpo: no pairs")
    if config.loss in SCORED_LOSSES and pairs:
        pair_score_diffs(pairs, f"loss {config.loss!r}")  # a pair without its score difference fails before any step
    run = run or Run("dpo")
    start, state = run.start(engine, DPOState())
    loss, full = preference_loss_fn(config), None
    if start:  # the pair set and reference of the interrupted run
        pairs = state.pairs or pairs
        full = with_ref_sums(pair_set(pairs, pad_id, config), state.ref_sums)
    for step in run.steps(start, config.steps):
        # 1. (re)build the pair set and its reference log-probs
        made: dict = {}
        if full is None or (config.regenerate_every and step % config.regenerate_every == 0):
            if config.regenerate_every and make_pairs is not None:
                pairs = make_pairs(engine, generator(config.seed, step))
                if isinstance(pairs, tuple):
                    pairs, made = pairs
            full = with_reference(engine, pairs, pad_id, config)
        # 2. one step on a batch of pairs
        P = full.size // 2
        rows = torch.arange(P) if not config.batch_size else batch_indices(P, config.batch_size, config.seed, step)
        m = pair_step(engine, full, rows, loss, config.length_buckets)
        o = engine.optim_step()
        # 3. log, evaluate, checkpoint
        assert full.pref is not None
        state = DPOState(full.pref.ref_sums, list(pairs) if config.regenerate_every else None)
        run.end_step(engine, step + 1, {**train_row(m, o), **made},
                     eval_now=eval_due(step + 1, config.steps, config.eval_every), state=state)
    return run.history
