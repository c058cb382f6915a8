"""Tinker's built-in losses over trajtune's engine: datums -> a `Batch`, each loss built from `objectives`, and
`forward_backward(engine, data, loss_fn, config, forward_only, vocab) -> (per-datum outputs, metrics)`.

A Tinker datum (N = its token count): model_input x [N]; loss_fn_inputs target_tokens y [N] int64 and the loss's
float32 inputs [N]. Position t's log-prob is lp_t = log p(y_t | x[:t+1]) at temperature 1: the client does no shift,
and y need not be x shifted (the cookbook's RL datums target token 0 on the prompt). In the batch a datum is the row
ids = x + [y_{N-1}] ([N+1]; for a supervised datum ids[1:] == y), `trajectory.TARGETS` = y, action_mask 1.0 on its N
positions: one forward gives every lp_t (`logprobs.TokenHead.targets`).

Every loss is a **sum** over tokens and datums (Tinker's semantics; the client puts any normalisation into the
weights / advantages), with slp = the `logprobs` input (the sampler's), A = `advantages`, r = exp(lp - slp):

| loss_fn               | inputs (+ target_tokens) | loss                                      | loss_fn_config      |
|-----------------------|--------------------------|-------------------------------------------|---------------------|
| `cross_entropy`       | weights                  | -sum lp w  (w < 0 too: the client's       | -                   |
|                       |                          | forward_backward_custom sends -dL/dlp)    |                     |
| `importance_sampling` | logprobs, advantages     | -sum r A                                  | -                   |
| `ppo`                 | logprobs, advantages     | -sum min(r A, clip(r, lo, hi) A)          | clip_low_threshold  |
|                       |                          |                                           | 0.8, ..._high 1.2   |
| `cispo`               | logprobs, advantages     | -sum sg(clip(r, lo, hi)) lp A             | as ppo              |
| `dro`                 | logprobs, advantages     | -sum (lp A - beta/2 (lp - slp)^2)         | beta (required)     |
| `gspo`                | logprobs, advantages,    | ppo's with GSPO-token's ratio: the value  | as ppo              |
|                       | sequence_ratio_mask      | exp(mean over the mask of lp - slp), each |                     |
|                       |                          | token's own gradient                      |                     |

Refused: `stable_reinforce` (it needs stability data the server records while sampling, addressed by provenance
spans) and `custom` (a loss traced and run on the server); `Unsupported` says so. The policy-gradient losses sum over
the positions with A != 0 (the others add exactly 0 to Tinker's sum; skipping them keeps exp(lp - slp) * 0 from
turning a huge ratio into NaN, and their metrics are over the tokens that carry an advantage); dro's penalty is
over every position, as Tinker's formula says (a prompt position's slp of 0 is penalised too).

The sum over trajtune's share-weighted engine: each part's loss is its sum / its rows (`aggregate` "constant" with
C = 1, `Loss` normalizer "constant": share = rows(part) / B) and `forward_backward` runs with scale = B, so the
accumulated gradient is the sum whatever the micro-batches, buckets or the number of calls before `optim_step`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from ..engine.protocol import Engine, ForwardOutput, Loss
from ..objectives.inputs import PGInputs, PGOptions, Surrogate
from ..objectives.policy_gradient import policy_gradient_loss
from ..objectives.sft import weighted_sft_loss
from ..trajectory import TARGETS, Batch, Owner
from .requests import REFUSED_LOSSES
from .wire import Datum, Unsupported, WireError


WEIGHTS = "weights"
"""`Batch.extras` key of cross_entropy's per-token weights [B, T-1] float (0.0 on padding)."""

CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


@dataclass(frozen=True)
class LossSpec:
    """A built-in loss: the float inputs it reads besides target_tokens (each (N,)), its settings (name -> default,
    None: required) and its metrics (objective's metric -> the Tinker name `name:reduction`)."""

    inputs: tuple[str, ...]
    config: Mapping[str, float | None]
    metrics: Mapping[str, str]


_PG_INPUTS = ("logprobs", "advantages")
_RATIO = {"pg/ratio_mean": "ratio:mean", "pg/ratio_max": "ratio:max"}
_CLIPPED = {**_RATIO, "pg/clip_frac": "clip_frac:mean"}
LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec((WEIGHTS,), {}, {}),
    "importance_sampling": LossSpec(_PG_INPUTS, {}, _RATIO),
    "ppo": LossSpec(_PG_INPUTS, CLIP, _CLIPPED),
    "cispo": LossSpec(_PG_INPUTS, CLIP, _CLIPPED),
    "dro": LossSpec(_PG_INPUTS, {"beta": None}, {}),
    "gspo": LossSpec((*_PG_INPUTS, "sequence_ratio_mask"), CLIP, _CLIPPED),
}
"""The losses trajtune computes, by Tinker's name."""

def loss_spec(loss_fn: str) -> LossSpec:
    """The `LossSpec` of a Tinker loss name; `Unsupported` for the refused ones, `WireError` for unknown ones."""
    if loss_fn in REFUSED_LOSSES:
        raise Unsupported(f"loss_fn: {loss_fn!r} is not supported: {REFUSED_LOSSES[loss_fn]}")
    if loss_fn not in LOSSES:
        raise WireError(f"loss_fn: unknown loss {loss_fn!r}; trajtune supports {', '.join(LOSSES)}")
    return LOSSES[loss_fn]


def loss_settings(loss_fn: str, config: Mapping[str, float | str] | None) -> dict[str, float]:
    """The loss's settings from a request's loss_fn_config (None: none given), defaults filled in; every key and
    value checked (`WireError` naming it)."""
    spec, out = loss_spec(loss_fn), {}
    for key, value in (config or {}).items():
        if key not in spec.config:
            takes = f"it takes {', '.join(spec.config)}" if spec.config else "it takes none"
            raise WireError(f"loss_fn_config[{key!r}]: not a setting of {loss_fn} ({takes})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise WireError(f"loss_fn_config[{key!r}]: {value!r} is not a finite number")
        out[key] = float(value)
    for key, default in spec.config.items():
        if key not in out:
            if default is None:
                raise WireError(f"loss_fn_config[{key!r}]: missing: {loss_fn} needs it (Tinker documents no default)")
            out[key] = default
    if "clip_low_threshold" in out and not 0.0 <= out["clip_low_threshold"] <= out["clip_high_threshold"]:
        raise WireError(f"loss_fn_config['clip_low_threshold']: {out['clip_low_threshold']} must be >= 0 and at most "
                        f"clip_high_threshold ({out['clip_high_threshold']})")
    return out


# --- datums -> a batch ----------------------------------------------------------------------------------------
def _check_ids(x: np.ndarray, vocab: int, where: str) -> None:
    """Token ids x [n] in [0, vocab), else a WireError naming the first one outside."""
    bad = (x < 0) | (x >= vocab)
    if bad.any():
        at = int(np.argmax(bad))
        raise WireError(f"{where}: token id {int(x[at])} at position {at} is outside the model's vocabulary "
                        f"[0, {vocab})")


def _checked(d: Datum, i: int, loss_fn: str, vocab: int,
             context: int | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Datum i, checked -> (tokens [N] long, {target_tokens: [N] long, each float input: [N] float32})."""
    where = f"data[{i}]"
    tokens = np.asarray(d.tokens)
    n = tokens.size
    if tokens.ndim != 1 or n == 0:
        raise WireError(f"{where}.model_input: {n} tokens of shape {tuple(tokens.shape)}; a datum needs at least one")
    if tokens.dtype.kind not in "iu":
        raise WireError(f"{where}.model_input: dtype {tokens.dtype}; token ids must be integers")
    _check_ids(tokens, vocab, f"{where}.model_input")
    if context is not None and n + 1 > context:
        raise WireError(f"{where}.model_input: {n} tokens; the model's context is {context} positions and the "
                        f"forward reads N + 1 (the last target appended)")
    names = ("target_tokens", *loss_spec(loss_fn).inputs)
    for name in sorted(d.inputs):
        if name not in names:
            raise WireError(f"{where}.loss_fn_inputs[{name!r}]: not an input of {loss_fn} (it takes "
                            f"{', '.join(names)}; settings such as clip thresholds go in loss_fn_config)")
    out = {}
    for name in names:
        field = f"{where}.loss_fn_inputs[{name!r}]"
        if name not in d.inputs:
            raise WireError(f"{field}: missing ({loss_fn} needs {', '.join(names)})")
        x = np.asarray(d.inputs[name])
        if loss_fn == "cross_entropy" and x.ndim == 2 and x.shape[0] == n:
            raise Unsupported(f"{field}: shape {tuple(x.shape)}: top-K cross_entropy ((N, K) targets and weights) "
                              "is not supported; send (N,)")
        if x.shape != (n,):
            raise WireError(f"{field}: shape {tuple(x.shape)} but the datum has {n} tokens (expected ({n},))")
        if name == "target_tokens":
            if x.dtype.kind not in "iu":
                raise WireError(f"{field}: dtype {x.dtype}; target tokens must be integer ids (int64)")
            _check_ids(x, vocab, field)
            out[name] = torch.from_numpy(x.astype(np.int64))
            continue
        if x.dtype.kind not in "fiub":
            raise WireError(f"{field}: dtype {x.dtype}; must be float32")
        with np.errstate(over="ignore"):
            x = x.astype(np.float32)
        bad = ~np.isfinite(x)
        if bad.any():
            at = int(np.argmax(bad))
            raise WireError(f"{field}: value {x[at]} at position {at} is not finite (as float32)")
        out[name] = torch.from_numpy(x)
    return torch.from_numpy(tokens.astype(np.int64)), out


def datum_batch(data: Sequence[Datum], loss_fn: str, vocab: int, pad_id: int = 0,
                context: int | None = None) -> Batch:
    """Checked datums -> a right-padded `Batch` (B = len(data), T = max N + 1):

    ids [B, T]             model_input + [target_tokens[-1]], `pad_id` after
    attention_mask [B, T]  True on those N + 1 tokens
    action_mask [B, T-1]   1.0 on the N positions of each datum (the log-probs every position needs)
    extras[TARGETS] [B, T-1] long  target_tokens (0 on padding); extras[WEIGHTS] [B, T-1]: cross_entropy's weights
    pg                     the policy-gradient losses' inputs: advantages [B, T-1], old_logp = the `logprobs` input
                           [B, T-1], ratio_mask [B, T-1] = (sequence_ratio_mask != 0) for gspo
    index [B] = arange(B); infos name each row "data[i]" (the engine's warnings name it so)

    vocab: the model's vocabulary (token ids must lie in [0, vocab)); context: its positions (None: unchecked).
    Every problem is a `WireError` naming the datum and field (`Unsupported` for top-K cross_entropy)."""
    spec = loss_spec(loss_fn)
    if not data:
        raise WireError("data: no datums (forward_backward needs at least one)")
    rows = [_checked(d, i, loss_fn, vocab, context) for i, d in enumerate(data)]
    B, T = len(rows), max(len(t) for t, _ in rows) + 1
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros(B, T, dtype=torch.bool)
    owners = torch.full((B, T), int(Owner.TEMPLATE), dtype=torch.long)
    turns = torch.full((B, T), -1, dtype=torch.long)
    action = torch.zeros(B, T - 1)
    cols = {name: torch.zeros(B, T - 1) for name in spec.inputs}
    targets = torch.zeros(B, T - 1, dtype=torch.long)
    for i, (tokens, inputs) in enumerate(rows):
        n = len(tokens)
        ids[i, :n], ids[i, n] = tokens, inputs["target_tokens"][-1]
        attention[i, : n + 1], turns[i, : n + 1], action[i, :n] = True, 0, 1.0
        owners[i, 0], owners[i, 1: n + 1] = int(Owner.PROMPT), int(Owner.POLICY)
        targets[i, :n] = inputs["target_tokens"]
        for name in spec.inputs:
            cols[name][i, :n] = inputs[name]
    extras = {TARGETS: targets, **({WEIGHTS: cols[WEIGHTS]} if WEIGHTS in cols else {})}
    pg = None
    if "advantages" in cols:
        ratio_mask = (cols["sequence_ratio_mask"] != 0).float() if "sequence_ratio_mask" in cols else None
        pg = PGInputs(advantages=cols["advantages"], old_logp=cols["logprobs"], ratio_mask=ratio_mask)
    return Batch(ids=ids, attention_mask=attention, owners=owners, turns=turns, action_mask=action,
                 rewards=torch.zeros(B), groups=torch.full((B,), -1, dtype=torch.long),
                 old_logprobs=torch.zeros(B, T - 1), index=torch.arange(B),
                 infos=[{"source": f"data[{i}]"} for i in range(B)], extras=extras, pg=pg)


# --- the losses ---------------------------------------------------------------------------------------------------
def objective(loss_fn: str, settings: Mapping[str, float], out: ForwardOutput,
              batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Tinker's loss `loss_fn` on a batch of `datum_batch` (or a part of one) -> (its sum over tokens and rows /
    its rows, metrics): out.logprobs [b, T-1] are lp at the batch's targets. `settings`: `loss_settings`'s."""
    lp, real = out.logprobs, batch.action_mask  # [b, T-1] each
    if loss_fn == "cross_entropy":
        return weighted_sft_loss(lp, real, batch.extras[WEIGHTS], "constant", 1.0)
    assert batch.pg is not None, "objective: a policy-gradient loss on a batch without pg inputs"
    if loss_fn == "dro":  # -lp A + beta k2(lp - slp), k2 = (lp - slp)^2 / 2: the KL term of the PG loss
        o = PGOptions(surrogate="reinforce", kl_coef=settings["beta"], kl_estimator="k2", aggregation="constant",
                      constant=1.0)
        inputs = dataclasses.replace(batch.pg, old_logp=None, ref_logp=batch.pg.old_logp)
        return policy_gradient_loss(lp, real, inputs, o)
    surrogate: Surrogate = {"importance_sampling": "reinforce", "cispo": "cispo"}.get(loss_fn, "ppo")  # type: ignore
    lo, hi = settings.get("clip_low_threshold", 1.0), settings.get("clip_high_threshold", 1.0)
    o = PGOptions(surrogate=surrogate, ratio_level="sequence_token" if loss_fn == "gspo" else "token",
                  eps_low=1.0 - lo, eps_high=hi - 1.0, aggregation="constant", constant=1.0)
    return policy_gradient_loss(lp, real * (batch.pg.advantages != 0), batch.pg, o)


def forward_backward(engine: Engine, data: Sequence[Datum], loss_fn: str, config: Mapping[str, float | str] | None,
                     forward_only: bool, vocab: int, *, buckets: int = 1,
                     context: int | None = None) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Tinker's forward_backward (forward_only: its forward) on `engine`'s policy, in one process.

    data: the request's datums; loss_fn, config: its loss and loss_fn_config; vocab: the model's vocabulary;
    buckets: the engine's length buckets; context: the model's positions (checked when given).
    Accumulates the gradient of the summed loss (forward_only: none, the gradients left as they are) and returns
    (outputs, metrics): outputs[i] = {"logprobs": float32 (N_i,)}, the learner's lp_t of target_tokens before
    this call's update (temperature 1), row by row whatever the micro-batches or buckets; metrics "loss:sum" (the
    summed loss) and, per loss, "ratio:mean" / "ratio:max" (the importance ratio over the tokens with A != 0) and
    "clip_frac:mean" (ppo, cispo, gspo: the share of them clipped). Bad input raises `WireError` before any compute.
    """
    settings = loss_settings(loss_fn, config)
    batch = datum_batch(data, loss_fn, vocab, context=context)
    lengths = batch.action_mask.sum(-1).long().tolist()  # [B]: N_i
    lp = torch.zeros_like(batch.action_mask)  # [B, T-1] the learner's log-probs, 0.0 on padding

    def keep(rows: torch.Tensor, logprobs: torch.Tensor) -> None:  # a part's rows of the batch, their lp [b, T'-1]
        for j, r in enumerate(rows.tolist()):
            lp[r, : lengths[r]] = logprobs[j, : lengths[r]].detach().float().cpu()

    if forward_only:
        keep(batch.index, engine.forward(batch, positions="actions").logprobs)
    else:
        def fn(out: ForwardOutput, part: Batch) -> tuple[torch.Tensor, dict]:
            keep(part.index, out.logprobs)
            return objective(loss_fn, settings, out, part)
        engine.forward_backward(batch, Loss(fn, "constant"), scale=float(batch.size), buckets=buckets)
    with torch.no_grad():  # the metrics of the whole batch from the log-probs the passes saw
        value, metrics = objective(loss_fn, settings, ForwardOutput(lp), batch)
    outputs = [{"logprobs": lp[i, :n].numpy().astype(np.float32)} for i, n in enumerate(lengths)]
    named = {name: float(metrics[key]) for key, name in LOSSES[loss_fn].metrics.items()}
    return outputs, {"loss:sum": float(value) * batch.size, **named}
