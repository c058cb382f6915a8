"""Persona tools on the residual stream (RLHF book ch.17 "Character", checklist 17.2-17.5): read it, steer it,
cap it, and mask weights by a persona's activations.

The residual stream after block l is what each tool reads or changes: the output of `residual_layers(model)[l]`
(a TinyTransformer's `blocks[l]`; a Hugging Face decoder layer `model.layers[l]` of a Llama / Qwen2 /
Mistral-style model, also inside an `HFPolicy`, LoRA included). Forward hooks do it, so sampling, scoring and
training run unchanged while a tool is on (`with steering(...)`).

    residuals(model, layers)             with-block: captured[l] [B, T, D] of every forward inside it
    mean_activation(acts, mask)          [B, T, D], [B, T] -> [D]: the mean over the masked (response) tokens
    persona_vector(pos, neg)             v_l = mean a(S+) - mean a(S-)  (Chen et al.: elicit vs suppress prompts)
    compose(vectors, alphas)             v = sum_i alpha_i v_i          (Feng et al.)
    steering(model, layer, v, alpha)     with-block: h_l <- h_l + alpha v at every position and generation step
    projection(h, v)                     <h, v/|v|>: monitoring (the last prompt token predicts the trait)
    cap(h, v, tau)                       h' = h - v_hat min(<h, v_hat> - tau, 0)   (Lu et al.'s activation capping)
    capping(model, layer, v, tau)        with-block: the cap applied to block l's output
    calibrate_tau(projections, q=0.25)   the cap's threshold: the 25th percentile of projections over rollouts
    persona_mask(weight, act_magnitude, keep)
                                         S_ij = |w_ij| A_p[j], row-wise top-K -> a {0,1} mask (Ye et al.)
    preventative_steering(model, layer, v, alpha)
                                         with-block: the steering in training forwards only (fine-tune without
                                         learning the trait; the loop's sampling and evaluation run unsteered)
    response_activations(model, ids, response_mask, layer)   [B, T] -> [B, D] mean over each row's response
    projection_difference(data, base, v) [N, D], [N, D] -> [N]: projection on the training response minus on the
                                         base model's own (data screening, Chen et al.)
    screen_by_projection(diff, threshold) [N] -> [N] bool: keep the samples at or below the threshold

Nothing here trains (`preventative_steering` is a hook a training loop runs under); every function is
deterministic.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn


def residual_layers(model: nn.Module) -> list[nn.Module]:
    """The blocks whose outputs are the residual stream: a TinyTransformer's `blocks`, or a Hugging Face decoder's
    `layers` (found under an `HFPolicy`, a peft model or a causal LM). A clear error for anything else."""
    if hasattr(model, "blocks") and isinstance(model.blocks, nn.ModuleList):
        return list(model.blocks)
    inner = model
    for _ in range(6):  # HFPolicy.model -> (peft) base_model.model -> CausalLM.model -> Model.layers
        if isinstance(getattr(inner, "layers", None), nn.ModuleList):
            return list(inner.layers)
        nxt = getattr(inner, "model", None) or getattr(inner, "base_model", None)
        if not isinstance(nxt, nn.Module) or nxt is inner:
            break
        inner = nxt
    raise TypeError(f"residual_layers: {type(model).__name__} has no transformer blocks I know "
                    "(TinyTransformer.blocks, or a Hugging Face decoder's model.layers)")


def _layer(model: nn.Module, layer: int) -> nn.Module:
    layers = residual_layers(model)
    if not -len(layers) <= layer < len(layers):
        raise IndexError(f"layer {layer}: the model has {len(layers)} blocks (0..{len(layers) - 1})")
    return layers[layer]


def _edit_output(output, fn):
    """A block's output with fn applied to its hidden states (a tensor, or the first item of a tuple)."""
    if isinstance(output, tuple):
        return (fn(output[0]), *output[1:])
    return fn(output)


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


@contextlib.contextmanager
def residuals(model: nn.Module, layers: Sequence[int]) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Capture the residual stream after each of `layers`: captured[l] gets one detached [B, t, D] tensor per
    forward inside the block (a cached generation: one per step)."""
    captured: dict[int, list[torch.Tensor]] = {int(l_): [] for l_ in layers}
    handles = [_layer(model, l_).register_forward_hook(
        lambda mod, inp, out, l_=l_: captured[l_].append(_hidden(out).detach())) for l_ in captured]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


def mean_activation(acts: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """acts [B, T, D], mask [B, T] (1 on the tokens to average, e.g. the response) or None (all) -> [D]."""
    if acts.dim() != 3:
        raise ValueError(f"mean_activation: acts must be [B, T, D], got shape {tuple(acts.shape)}")
    if mask is None:
        return acts.reshape(-1, acts.shape[-1]).mean(0)
    if mask.shape != acts.shape[:2]:
        raise ValueError(f"mean_activation: mask {tuple(mask.shape)} does not match acts {tuple(acts.shape[:2])}")
    m = mask.to(acts.dtype)[..., None]  # [B, T, 1]
    n = m.sum()
    if n == 0:
        raise ValueError("mean_activation: the mask selects no token")
    return (acts * m).sum((0, 1)) / n


def persona_vector(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """The mean-difference persona vector (Chen et al.): positive [N, D], negative [M, D] activations (one row per
    response, e.g. `mean_activation` of each) -> [D] = mean(positive) - mean(negative)."""
    if positive.dim() != 2 or negative.dim() != 2 or positive.shape[1] != negative.shape[1]:
        raise ValueError(f"persona_vector: need [N, D] and [M, D], got {tuple(positive.shape)} and "
                         f"{tuple(negative.shape)}")
    return positive.mean(0) - negative.mean(0)


def compose(vectors: Sequence[torch.Tensor], alphas: Sequence[float]) -> torch.Tensor:
    """v = sum_i alpha_i v_i over [D] vectors (ch.17.3)."""
    if len(vectors) != len(alphas) or not vectors:
        raise ValueError(f"compose: {len(vectors)} vectors for {len(alphas)} coefficients")
    return sum((a * v for a, v in zip(alphas, vectors)), torch.zeros_like(vectors[0]))


def _unit(v: torch.Tensor) -> torch.Tensor:
    norm = v.norm()
    if not norm > 0:
        raise ValueError("the direction vector is zero")
    return v / norm


def projection(h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """h [..., D], v [D] -> [...]: <h, v / |v|> (monitoring: the trait's expression before generation)."""
    return h @ _unit(v).to(h.dtype)


def cap(h: torch.Tensor, v: torch.Tensor, tau: float) -> torch.Tensor:
    """Activation capping (Lu et al., ch.17.4): h [..., D], v [D] -> [..., D],
    h' = h - v_hat * min(<h, v_hat> - tau, 0): a projection >= tau passes unchanged, one below is lifted to
    exactly tau; the part of h orthogonal to v is untouched."""
    u = _unit(v).to(h.dtype)
    p = h @ u  # [...]
    return h - u * torch.clamp(p - tau, max=0.0)[..., None]


def calibrate_tau(projections: torch.Tensor, q: float = 0.25) -> float:
    """The cap's threshold: the q-quantile of projections over rollouts (the book: the 25th percentile)."""
    if not 0 <= q <= 1:
        raise ValueError(f"calibrate_tau: q must be in [0, 1], got {q}")
    return float(torch.quantile(projections.flatten().float(), q))


@contextlib.contextmanager
def steering(model: nn.Module, layer: int, vector: torch.Tensor, alpha: float,
             training_only: bool = False) -> Iterator[None]:
    """Inside the block, block `layer`'s output is h + alpha * vector at every position and generation step
    (alpha > 0 amplifies the trait, < 0 suppresses it); `training_only`: in train-mode forwards only
    (`preventative_steering`)."""
    add = alpha * vector

    def hook(mod, inp, out):
        if training_only and not mod.training:
            return None  # the output as it is
        return _edit_output(out, lambda h: h + add.to(h.dtype).to(h.device))

    handle = _layer(model, layer).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def capping(model: nn.Module, layer: int, vector: torch.Tensor, tau: float) -> Iterator[None]:
    """Inside the block, block `layer`'s output is `cap(h, vector, tau)` (the Assistant-axis cap)."""
    handle = _layer(model, layer).register_forward_hook(lambda mod, inp, out: _edit_output(out, lambda h: cap(h, vector,
                                                                                                              tau)))
    try:
        yield
    finally:
        handle.remove()


def persona_mask(weight: torch.Tensor, act_magnitude: torch.Tensor, keep: float) -> torch.Tensor:
    """A persona subnetwork's mask (Ye et al., ch.17.5): weight [out, in], act_magnitude [in] = A_p[j] =
    E|h_j(x)| over the persona's calibration set; S_ij = |w_ij| * A_p[j]; each row keeps its top
    round(keep * in) connections -> {0, 1} mask [out, in] (the persona model is f(theta * mask); the book prunes
    up to 60% per layer, keep >= 0.4). Ties go to the lower column index."""
    if weight.dim() != 2 or act_magnitude.shape != (weight.shape[1],):
        raise ValueError(f"persona_mask: need weight [out, in] and act_magnitude [in], got {tuple(weight.shape)} "
                         f"and {tuple(act_magnitude.shape)}")
    if not 0 < keep <= 1:
        raise ValueError(f"persona_mask: keep must be in (0, 1], got {keep}")
    k = max(1, round(keep * weight.shape[1]))
    score = weight.abs() * act_magnitude[None, :]  # [out, in]
    top = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :k]  # [out, k]
    return torch.zeros_like(weight).scatter_(1, top, 1.0)


# --- preventative steering during fine-tuning, data screening by projection difference (checklist 17.2d, 17.2e) ---


@contextlib.contextmanager
def preventative_steering(model: nn.Module, layer: int, vector: torch.Tensor, alpha: float) -> Iterator[None]:
    """Preventative steering (Chen et al. 2025 §5.2; book ch.17.2): while fine-tuning, add alpha * vector to block
    `layer`'s output in the *training* forwards only (the module in train mode: an engine's forward_backward), so
    the data's push along the trait direction is met by the steering and not learned into the weights (alpha > 0
    steers toward the trait the data would instil). Forwards in eval mode (an engine's sampling, scoring and
    evaluation) run unsteered, and the finished model is used without the hook.

        with preventative_steering(engine.model, layer, v, alpha=2.0):
            train_sft(engine, data, config, pad_id)
    """
    with steering(model, layer, vector, alpha, training_only=True):
        yield


def response_activations(model: nn.Module, ids: torch.Tensor, response_mask: torch.Tensor, layer: int) -> torch.Tensor:
    """The mean residual activation after block `layer` over each row's response tokens (no gradient).
    ids [B, T] (right-padded: a causal model's real tokens do not see the padding), response_mask [B, T] (1 on the
    response tokens) -> [B, D]. A row with no response token is an error."""
    if ids.dim() != 2 or response_mask.shape != ids.shape:
        raise ValueError(f"response_activations: need ids [B, T] and response_mask [B, T], got {tuple(ids.shape)} "
                         f"and {tuple(response_mask.shape)}")
    m = response_mask.float()  # [B, T]
    if (m.sum(-1) == 0).any():
        raise ValueError("response_activations: a row of response_mask selects no token")
    with torch.no_grad(), residuals(model, [layer]) as captured:
        model(ids)
    acts = captured[layer][-1].float()  # [B, T, D]
    return (acts * m[..., None]).sum(1) / m.sum(-1)[:, None]


def projection_difference(data_acts: torch.Tensor, base_acts: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """Data screening's metric (Chen et al. 2025 §6; book ch.17.2): for each training sample, the projection onto
    the persona vector of the activations on the sample's response minus that on the base model's own response to
    the same prompt. data_acts, base_acts [N, D] (e.g. `response_activations`), vector [D] -> [N]: large means the
    sample would push the model toward the trait."""
    if data_acts.dim() != 2 or base_acts.shape != data_acts.shape:
        raise ValueError(f"projection_difference: need data_acts and base_acts [N, D] alike, got "
                         f"{tuple(data_acts.shape)} and {tuple(base_acts.shape)}")
    return projection(data_acts, vector) - projection(base_acts, vector)


def screen_by_projection(differences: torch.Tensor, threshold: float) -> torch.Tensor:
    """Which training samples to keep: differences [N] (`projection_difference`) -> [N] bool, True where the
    difference is at most `threshold` (the samples above it are flagged and left out)."""
    if differences.dim() != 1:
        raise ValueError(f"screen_by_projection: differences must be [N], got shape {tuple(differences.shape)}")
    return differences <= threshold
