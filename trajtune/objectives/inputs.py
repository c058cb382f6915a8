"""The named inputs of the policy-gradient loss (`policy_gradient.policy_gradient_loss`) and the preference losses.

`PGInputs`: the per-row tensors a step's scoring computes once (advantages; pi_old's, the sampler's and the
reference's log-probs; the value loss's returns and old values), carried on the batch (`trajectory.Batch.pg`) so the
engine's splitters slice them with the rows (`select`) and cut them with the columns (`trim`): the loss stays a pure
function of (forward output, batch).

`PreferenceInputs`: the same for the preference losses (the reference sums of DPO and its relatives, ODPO's and
REBEL's score differences, KTO's labels and reference point); both are `RowTensors`.

`PGOptions`: the loss's settings (the surrogate and its clip range, the mismatch correction and its bounds, the KL
and entropy terms, the aggregation): fixed for a run, except the KL coefficient an adaptive controller moves per step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Literal, Self

import torch

from ..config import check_choices
from ..logprobs import Aggregation
from .corrections import Correction, active_correction, check_correction
from .kl import KLEstimator

Surrogate = Literal["reinforce", "ppo", "cispo", "topr", "sapo"]
RatioLevel = Literal["token", "sequence", "sequence_token"]


class RowTensors:
    """What `trajectory.Batch` does with a typed set of loss inputs (`PGInputs`, `PreferenceInputs`): tensors of
    one row per batch row ([B] or [B, T-1, ...]), sliced with the rows and cut with the columns. The fields are
    the subclass's (frozen dataclasses whose fields are tensors or None)."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """name -> tensor, for the fields that are set."""
        return {f.name: x for f in dataclasses.fields(self) if (x := getattr(self, f.name)) is not None}

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Self:
        """The same inputs with `fn` applied to every tensor that is set."""
        return dataclasses.replace(self, **{k: fn(x) for k, x in self.tensors().items()})

    def select(self, index: torch.Tensor) -> Self:
        """Rows `index` [b] of every tensor ([B, ...] -> [b, ...])."""
        return self.apply(lambda x: x[index.to(x.device)])

    def trim(self, tokens: int) -> Self:
        """Per-token tensors [B, T-1] cut to [B, tokens - 1] (per-row ones [B] kept)."""
        return self.apply(lambda x: x[:, : tokens - 1] if x.dim() >= 2 else x)

    def to(self, device: torch.device | str) -> Self:
        return self.apply(lambda x: x.to(device))

    def check(self, rows: int, tokens: int) -> None:
        """Every tensor is [rows] or [rows, tokens - 1] (a ValueError naming the field otherwise)."""
        for name, x in self.tensors().items():
            if x.shape[0] != rows or (x.dim() >= 2 and x.shape[1] != tokens - 1):
                raise ValueError(f"{type(self).__name__}.{name}: shape {tuple(x.shape)} is neither [B] nor [B, T-1] "
                                 f"for B={rows}, T={tokens}")


@dataclass(frozen=True)
class PGInputs(RowTensors):
    """The policy-gradient loss's per-row step tensors (B rows, T tokens per row; all detached data).

    advantages    [B] (broadcast to every POLICY token) or [B, T-1] (GAE, distillation, a teacher's log-ratio)
    old_logp      [B, T-1] or None  log pi_old of the sampled tokens at scoring time (the ratio's denominator);
                  None = on-policy, one step
    sampler_logp  [B, T-1] or None  the sampler's log-probs of the sampled tokens (the mismatch correction:
                  PGOptions.correction; the RL loop passes the batch's own, `Batch.old_logprobs`)
    ref_logp      [B, T-1] or None  the reference policy's log-probs (the KL term, and its log)
    returns       [B, T-1] or None  the value loss's targets (GAE); with `old_values`
    old_values    [B, T-1] or None  the critic's predictions at scoring time (value clipping)
    staleness     [B, T-1] long or None  per token, how many updates its sampler was behind the trained policy (< 0:
                  unknown); given, the correction's metrics split its cut shares into fresh and stale tokens
    ratio_mask    [B, T-1] or None  the tokens a sequence-level ratio averages over (PGOptions.ratio_level
                  "sequence" / "sequence_token"; Tinker's sequence_ratio_mask); None: the loss's mask
    """

    advantages: torch.Tensor
    old_logp: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    staleness: torch.Tensor | None = None
    ratio_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class PreferenceInputs(RowTensors):
    """The preference losses' per-row step tensors: the DPO family on a pair batch (`trajectory.pair_batch`: B = 2P
    rows, chosen rows then rejected rows), KTO on labelled rows (`algorithms.kto`).

    ref_sums     [B] or None  the reference policy's summed log-probs of each row's POLICY tokens (None: a loss
                 without a reference: SimPO, ORPO, SLiC)
    score_diff   [B] or None  each pair's score difference, on both its rows (ODPO, REBEL)
    desirable    [B] bool or None  KTO's labels
    z0           [B] or None  KTO's reference point (the same number on every row, so any split keeps it)
    n_rows, n_desirable  [B] or None  KTO: the step's row and desirable-row counts on every row (its metrics are
                 scaled by them so the engine's sum over a step's parts is the step's mean)
    """

    ref_sums: torch.Tensor | None = None
    score_diff: torch.Tensor | None = None
    desirable: torch.Tensor | None = None
    z0: torch.Tensor | None = None
    n_rows: torch.Tensor | None = None
    n_desirable: torch.Tensor | None = None


@dataclass(frozen=True)
class PGOptions:
    """The policy-gradient loss's settings (what each does: `policy_gradient.policy_gradient_loss`).

    surrogate     "reinforce", "ppo", "cispo", "topr" or "sapo"
    ratio_level   "token", "sequence" (GSPO) or "sequence_token" (GSPO-token)
    eps_low, eps_high  the clip range of PPO / CISPO ratios; dual_clip: c > 1 caps the loss of A < 0 tokens at -c A
    correction    the train-inference mismatch correction against PGInputs.sampler_logp (`corrections`: "tis",
                  "tis_seq", "mis_token", "mis_seq", "mis_geo", "mis_veto", "icepop", "decoupled"; "none": off)
    tis_cap       C of tis / tis_seq / decoupled; with correction "none" a tis_cap alone selects "tis" (the spelling
                  from before the choice existed: the same numbers)
    correction_band  [lo, hi] of mis_* / icepop (None: `corrections.DEFAULT_BOUNDS`)
    kl_coef, kl_estimator  the KL(pi || ref) loss term against PGInputs.ref_logp (logged whenever ref_logp is given)
    entropy_coef  weight of the entropy bonus (the loss's `entropy` argument)
    aggregation, constant  how per-token losses become a scalar (logprobs.aggregate)
    sapo_tau      SAPO's gate temperatures (where A > 0, where A <= 0)
    """

    surrogate: Surrogate = "reinforce"
    ratio_level: RatioLevel = "token"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    correction: Correction = "none"
    tis_cap: float | None = None
    correction_band: tuple[float, float] | None = None
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    aggregation: Aggregation = "token"
    constant: float | None = None
    sapo_tau: tuple[float, float] = (1.0, 1.05)

    def __post_init__(self) -> None:
        check_choices(self)  # PGOptions(surrogate="grop") fails here, not deep in the loss
        check_correction(self.active_correction, self.tis_cap, self.correction_band, "PGOptions",
                         ("tis_cap", "correction_band"))

    @property
    def active_correction(self) -> Correction:
        """The correction the loss applies: `correction`, or "tis" where only tis_cap is set."""
        return active_correction(self.correction, self.tis_cap)
