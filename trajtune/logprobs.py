"""Per-token log-probabilities, entropy and masked loss aggregation.

Conventions (RLHF book, "Implementation"; checklist 0.3): the log-prob of token t+1 comes from
`log_softmax(logits[:, t])` gathered at `ids[:, t+1]` (or at a given target: `TokenHead.targets`), so every
per-token tensor here has length T-1 and lines up with `Batch.action_mask`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F

Aggregation = Literal["token", "sequence", "constant"]
AGGREGATIONS: tuple[str, ...] = ("token", "sequence", "constant")

AUTO_WHOLE_LOGITS = 1 << 24
"""`TokenHead(chunk=-1)` computes the whole logits while they are at most this many values (64 MB in fp32)...
Larger whole logits are slower than slices as well as bigger: every [B, T, V]-sized temporary (logsumexp's,
its backward's, the slice's gradient) is a fresh mmap above glibc's 32 MB threshold, its pages faulted in
one by one (a 16 x 256 x 16,384 SFT step of the 20M Llama: 5.5-7.0 s whole, 20 s of its 38 s in the kernel
over 4 steps; 4.0-4.5 s in slices). The built-in experiments stay below it (at most 6.6M values: iw-SFT's
BugFix evaluation batches), so they compute the same floats as ever."""
AUTO_CHUNK_LOGITS = 1 << 22
"""... and beyond that, slices of this many values (16 MB in fp32; at least the output layer's width in positions):
positions per slice = max(this / vocabulary, width). At 2^23 values (exactly 32 MB, with the allocator's header
just above glibc's largest mmap threshold) each slice's temporaries were fresh pages (the 20M Llama's 16 x 256 SFT
step: 4.4-4.6 s and 0.6-1.2M minor faults over 4 steps, against 4.0-4.4 s and 20-230K at 2^22); below it they
come from the heap, which glibc still hands back to the kernel at times: fp32 slices reuse two (`_slice_buffers`)."""


@dataclass
class HeadOutput:
    """What a model's output layer returns for a `TokenHead`.

    logprobs [B, T-1]         log pi(y_t | ids[:, :t+1]), y = `TokenHead.targets` (default ids[:, 1:]; pi =
                              softmax(logits / `TokenHead.temperature`)) at the positions asked for (`TokenHead.keep`;
                              every position without it), exactly 0.0 at the others (no gradient there)
    entropy  [B, T-1] | None  entropy (nats) of the next-token distribution at t, if asked for (0.0 where
                              not kept, like the log-probs)
    logits   [B, T, V] | None the whole logits, only if asked for (`TokenHead.logits`)
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    logits: torch.Tensor | None = None


@dataclass(frozen=True)
class TokenHead:
    """A request to a model's output layer: the per-token statistics of `ids` instead of logits [B, T, V].

    A model that supports it takes `head=TokenHead(...)` in its forward and returns `head(hidden, weight, bias,
    project)` (plus its values with `return_values=True`), where hidden [B, T, D] are its final hidden states,
    weight [V, D] / bias [V] | None its output layer and `project(hidden) -> logits` the layer itself (the
    unchunked path calls exactly it).

    ids [B, T] long: the tokens whose log-probs are wanted (targets are ids[:, 1:], unless `targets`).
    chunk: positions per slice of the output layer. The logits of at most `chunk` positions exist at once, forward
      and backward (the backward recomputes each slice: one more matmul of the output layer), so memory grows with
      the chunk, not with B x T x V. -1 (auto): the whole logits while B x T x V <= `AUTO_WHOLE_LOGITS` (a small
      vocabulary: no recompute), else slices of max(`AUTO_CHUNK_LOGITS` / V, D) positions; 0: never chunk (the
      whole [B, T, V] logits, as before). A batch that fits in one slice takes the unchunked path (the same floats
      as chunk=0).
    entropy: also return the entropy [B, T-1].
    logits: also return the whole logits [B, T, V] (full-vocabulary losses such as distillation to a teacher's
      logits); implies no chunking.
    keep [B, T-1] bool | None: the positions whose statistics are wanted (a loss that reads only the POLICY
      tokens: `Batch.action_mask != 0`). The output layer then runs on those positions' hidden states only
      ([K, D] gathered, K = keep.sum(); whole or in chunks of K), and the log-probs / entropy are 0.0 at the
      other positions, with no gradient through them: the same values and gradients at the kept positions
      up to float rounding (a matmul over fewer rows may round differently). None: every position.
      Not with `logits` (whole logits are every position's).
    temperature: the policy is softmax(logits / temperature), the distribution the batch was sampled at
      (`Batch.temperature`): every log-prob, entropy and logits returned is of logits / temperature (the
      chunked path scales the output layer's weight and bias, differentiably). 1.0: the logits as they are
      (no division: the same floats as without the option).
    targets [B, T-1] long | None: the token whose log-prob position t gives, in place of ids[:, t+1] (a Tinker
      datum's target_tokens: a prompt position may target token 0); every path gathers at them. None: ids[:, 1:]
      (the same floats as without the option).
    """

    ids: torch.Tensor
    chunk: int = -1
    entropy: bool = False
    logits: bool = False
    keep: torch.Tensor | None = None
    temperature: float = 1.0
    targets: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"TokenHead: temperature must be a finite number > 0, got {self.temperature!r}")
        B, T = self.ids.shape
        y = self.targets
        if y is not None and (y.dtype != torch.long or tuple(y.shape) != (B, T - 1)):
            raise ValueError(f"TokenHead: targets must be long [B, T-1] = [{B}, {T - 1}], got {y.dtype} "
                             f"{tuple(y.shape)}")
        if self.keep is None:
            return
        if self.keep.dtype != torch.bool or tuple(self.keep.shape) != (B, T - 1):
            raise ValueError(f"TokenHead: keep must be a bool mask [B, T-1] = [{B}, {T - 1}] of the positions "
                             f"wanted, got {self.keep.dtype} {tuple(self.keep.shape)}")
        if self.logits:
            raise ValueError("TokenHead: keep (some positions) and logits=True (the whole logits) exclude "
                             "each other; ask for one")

    def kept(self) -> torch.Tensor | None:
        """The kept positions as indices [K] long into the flattened [B * T] positions (b * T + t), in
        row-major order; None without `keep`."""
        if self.keep is None:
            return None
        flat = self.keep.reshape(-1).nonzero().squeeze(1)  # [K] into [B * (T-1)]
        return flat + flat // self.keep.shape[1] if self.keep.shape[1] else flat  # b*(T-1)+t -> b*T+t

    def positions(self, vocab: int, dim: int = 1, n: int | None = None) -> int:
        """Positions per slice for an output layer [vocab, dim] (0: one slice, the unchunked path), over `n`
        positions (default: all B x (T-1)). Auto slices have at least `dim` positions: a slice's logits are
        then at least as large as the layer's weight, which each slice reads once (fewer positions would
        make the matmuls memory-bound)."""
        if self.logits or self.chunk == 0:
            return 0
        n = self.ids.shape[0] * (self.ids.shape[1] - 1) if n is None else n
        if self.chunk < 0 and n * vocab <= AUTO_WHOLE_LOGITS:
            return 0
        c = max(1, AUTO_CHUNK_LOGITS // vocab, dim) if self.chunk < 0 else self.chunk
        return c if n > c else 0

    def of_logits(self, logits: torch.Tensor) -> HeadOutput:
        """The answer from whole logits [B, T, V] (the unchunked path; models without a `head` argument).
        With `keep`, the kept positions' rows of them (the same floats as without; 0.0 elsewhere). Divided by
        `temperature` here (unless 1.0)."""
        logits = self._scaled(logits)
        rows = self.kept()
        if rows is not None:
            z = logits.reshape(-1, logits.shape[-1]).index_select(0, rows)  # [K, V]
            return self._placed(rows, *_row_stats(z, self._targets(rows), self.entropy))
        ent = entropy_from_logits(logits[:, :-1]) if self.entropy else None
        return HeadOutput(token_log_probs(logits, self.ids, self.targets), ent, logits if self.logits else None)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        """logits (or an output layer's weight / bias) / temperature; x itself at temperature 1."""
        return x if self.temperature == 1.0 else x / self.temperature

    def _scaled_layer(self, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output layer of logits / temperature: (weight / T, bias / T | None); differentiable."""
        return self._scaled(weight), None if bias is None else self._scaled(bias)

    def next_tokens(self) -> torch.Tensor:
        """[B, T-1] long: the token each position's log-prob is of (`targets`, else ids[:, 1:])."""
        return self.ids[:, 1:] if self.targets is None else self.targets

    def _targets(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [K] (indices b * T + t) -> the predicted tokens [K] (`next_tokens()[b, t]`)."""
        return self.next_tokens().reshape(-1).index_select(0, rows - rows // self.ids.shape[1])

    def _placed(self, rows: torch.Tensor, lp: torch.Tensor, ent: torch.Tensor | None) -> HeadOutput:
        """Per-kept-position lp [K] / ent [K] | None -> [B, T-1], 0.0 at the positions not kept."""
        B, T = self.ids.shape
        flat = rows - rows // T  # b * T + t -> b * (T-1) + t

        def place(x):
            return x.new_zeros(B * (T - 1)).index_copy(0, flat, x).view(B, T - 1)
        return HeadOutput(place(lp), place(ent) if ent is not None else None)

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 project: Callable[[torch.Tensor], torch.Tensor]) -> HeadOutput:
        """hidden [B, T, D], weight [V, D], bias [V] | None, project(hidden [..., D]) -> logits [..., V]
        (with `keep` it gets the kept positions' hidden states [K, D])."""
        B, T = self.ids.shape
        assert hidden.shape[:2] == (B, T), f"TokenHead: hidden {tuple(hidden.shape)} vs ids {tuple(self.ids.shape)}"
        rows = self.kept()
        if rows is not None:  # the output layer on the kept positions only: [K, D] -> [K, V]
            h = hidden.reshape(B * T, hidden.shape[-1]).index_select(0, rows)  # [K, D]
            targets = self._targets(rows)  # [K]
            chunk = self.positions(*weight.shape, n=rows.shape[0])
            if not chunk:
                return self._placed(rows, *_row_stats(self._scaled(project(h)), targets, self.entropy))
            lp, ent = _ChunkedHead.apply(h, *self._scaled_layer(weight, bias), targets, chunk, self.entropy)
            return self._placed(rows, lp, ent if self.entropy else None)
        chunk = self.positions(*weight.shape)
        if not chunk:
            return self.of_logits(project(hidden))  # divided by the temperature there
        h = hidden[:, :-1].reshape(B * (T - 1), hidden.shape[-1])  # [N, D]
        targets = self.next_tokens().reshape(-1)  # [N]
        lp, ent = _ChunkedHead.apply(h, *self._scaled_layer(weight, bias), targets, chunk, self.entropy)
        return HeadOutput(lp.view(B, T - 1), ent.view(B, T - 1) if self.entropy else None)


@dataclass(frozen=True)
class SharedPrefix:
    """A request to a model's forward: run rows that begin with the same tokens (a DPO pair: one prompt, two
    completions) as one packed row -- the common prefix once, then each row's tail -- and answer for the rows
    as given. The answer is the unpacked forward's up to float rounding: each token sees the same tokens at the
    same positions (the prefix, then its own tail; a tail never sees another tail), and the packed hidden states
    are gathered back to the rows before the output layer (`source`), so the log-probs, values and gradients
    of every row are those of the unpacked batch. Saves the prefix's compute on every row but the first.

    ids       [U, L] long   packed rows (one per unit of rows; right-padded with the batch's first token)
    positions [U, L] long   position ids: the prefix 0..P-1, each tail from P on
    mask      [U, 1, L, L]  bool: query i may attend to key j (causal, prefix + own tail; padding sees itself)
    source    [B, T] long   index into the packed [U * L] positions of each (row, position) of the batch
                            (padding positions point at their unit's first position)
    Build it with `SharedPrefix.of(ids, attention_mask, units)`.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    source: torch.Tensor

    @staticmethod
    def of(ids: torch.Tensor, attention_mask: torch.Tensor, units: list[list[int]]) -> "SharedPrefix | None":
        """The packing of right-padded rows ids [B, T] / attention_mask [B, T] (True on real tokens) whose
        `units` (lists of rows, e.g. `trajectory.row_units`) share prefixes; None when no unit of two or more
        rows shares a first token (nothing to save)."""
        B, T = ids.shape
        real = attention_mask.bool()
        lead = [0] * B  # the first row of each row's unit
        for unit in units:
            for r in unit:
                lead[r] = unit[0]
        lead_t = torch.tensor(lead, device=ids.device)
        same = (ids == ids[lead_t]) & real & real[lead_t]  # [B, T]: real tokens equal to the unit's first row's
        common = same.long().cumprod(-1).sum(-1).tolist()  # [B]: the length of that common prefix
        lengths, rows = real.sum(-1).tolist(), ids.tolist()
        packed, tails = [], []  # per unit: (tokens, segment of each: 0 prefix / j + 1 tail j, position ids)
        for unit in units:
            first, p = rows[unit[0]], min(common[r] for r in unit)  # p: the common prefix of the unit's rows
            toks, seg, pos, starts = first[:p], [0] * p, list(range(p)), []
            for j, r in enumerate(unit):  # row r's tail: its tokens after the prefix, at positions p, p+1, ...
                starts.append(len(toks))
                toks += rows[r][p:lengths[r]]
                seg += [j + 1] * (lengths[r] - p)
                pos += range(p, lengths[r])
            packed.append((toks, seg, pos))
            tails.append((p, starts))
        if all(p * (len(u) - 1) == 0 for u, (p, _) in zip(units, tails, strict=True)):
            return None
        L = max(len(t) for t, _, _ in packed)
        source = [[0] * T for _ in range(B)]  # padding positions: their unit's first packed position
        for u, (unit, (p, starts)) in enumerate(zip(units, tails, strict=True)):
            for r, start in zip(unit, starts, strict=True):
                source[r][:lengths[r]] = [u * L + t for t in range(p)] + \
                    [u * L + start + t for t in range(lengths[r] - p)]
                source[r][lengths[r]:] = [u * L] * (T - lengths[r])
        pad = rows[0][0]
        ids_seg_pos = torch.tensor([[t + [pad] * (L - len(t)), s + [-1] * (L - len(s)), q + [0] * (L - len(q))]
                                    for t, s, q in packed], dtype=torch.long)  # [U, 3, L]
        seg = ids_seg_pos[:, 1]  # [U, L]
        i = torch.arange(L)
        q, k = seg[:, :, None], seg[:, None, :]  # [U, L, 1], [U, 1, L]
        mask = (i[None, None, :] <= i[None, :, None]) & (k >= 0) & ((k == 0) | (k == q))
        mask |= (q < 0) & (i[None, None, :] == i[None, :, None])  # padding attends to itself (no empty softmax)
        dev = ids.device
        return SharedPrefix(ids_seg_pos[:, 0].to(dev), ids_seg_pos[:, 2].to(dev), mask[:, None].to(dev),
                            torch.tensor(source, dtype=torch.long, device=dev))

    @staticmethod
    def prompt_units(ids: torch.Tensor, attention_mask: torch.Tensor, action_mask: torch.Tensor,
                     units: list[list[int]]) -> list[list[int]]:
        """`units` (lists of rows that stay together, e.g. a DPO pair) merged where their rows have the same
        prompt -- the same tokens up to the first POLICY token (a GRPO group: one prompt, G completions; DPO
        pairs of one prompt) -- so `of` runs that prompt once for all of them. A merged unit's packed row
        stays at most twice as long as its longest row (else a unit starts anew): the packing's attention
        runs over the packed row (its mask is dense, [L, L]), so this bounds it at twice the rows' own.

        ids [B, T] long, attention_mask [B, T] (nonzero on real tokens), action_mask [B, T-1] (nonzero on
        POLICY tokens' predictions) -> units, a partition of the rows (units never split; order of first row)."""
        if len(units) < 2:
            return units
        lengths = attention_mask.bool().sum(-1).tolist()  # [B]
        acting = action_mask != 0  # [B, T-1]
        first = torch.where(acting.any(-1), acting.float().argmax(-1) + 1, -1).tolist()  # [B] the first policy token
        rows = ids.tolist()
        open_units: dict[tuple, list[int]] = {}  # prompt -> the index in `merged` of the unit still taking rows
        merged: list[list[int]] = []
        for unit in units:
            lead = unit[0]
            if first[lead] <= 0 or any(first[r] != first[lead] or rows[r][:first[r]] != rows[lead][:first[lead]]
                                       for r in unit):
                merged.append(list(unit))  # rows without a policy token, or a unit of several prompts: as given
                continue
            key, p = tuple(rows[lead][:first[lead]]), first[lead]
            at = open_units.get(key)
            if at is not None:
                cand = merged[at] + list(unit)
                packed = p + sum(lengths[r] - p for r in cand)
                if packed <= 2 * max(lengths[r] for r in cand):
                    merged[at] = cand
                    continue
            open_units[key] = len(merged)
            merged.append(list(unit))
        return merged

    def gather(self, packed: torch.Tensor) -> torch.Tensor:
        """Per-position outputs of the packed rows [U, L, ...] -> the batch's rows [B, T, ...]."""
        flat = packed.reshape(-1, *packed.shape[2:])  # [U * L, ...]
        return flat[self.source]


def _amp_state(device_type: str) -> torch.dtype | None:
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


class _ChunkedHead(torch.autograd.Function):
    """Token log-probs (and entropy) through an output layer, `chunk` positions at a time:
    forward(h [N, D], weight [V, D], bias [V] | None, targets [N] long, chunk, entropy) ->
    (logprobs [N], entropy [N] or [0]). Saves only its inputs and the logsumexp [N]; the backward
    recomputes each slice's logits [chunk, V] and forms d/dz directly:
      d logp / dz = onehot(target) - p        d H / dz = -p * (z - lse + H)
    Under autocast the matmuls run in the autocast dtype in both passes; everything after them in fp32.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, targets, chunk, entropy):
        amp = _amp_state(h.device.type)
        # outputs allocated up front: small tensors kept between the slices' large temporaries would
        # pin the freed heap (glibc), and the resident memory would grow with the batch after all
        n = h.shape[0]
        lp, lse = (torch.empty(n, device=h.device) for _ in range(2))
        ent = torch.empty(n if entropy else 0, device=h.device)
        z_buf, e_buf = _slice_buffers(h, weight, amp, min(chunk, n), 1 if entropy else 2)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            z = _slice_logits(h[s:e], weight, bias, z_buf)  # [c, V]
            lse[s:e] = torch.logsumexp(z, dim=-1) if e_buf is None else _logsumexp_rows(z, e_buf[: e - s])
            lp[s:e] = z.gather(-1, targets[s:e, None]).squeeze(-1) - lse[s:e]
            if entropy:
                ent[s:e] = lse[s:e] - (torch.softmax(z, dim=-1) * z).sum(-1)
            del z
        ctx.save_for_backward(h, weight, bias, targets, lse, ent)
        ctx.chunk, ctx.entropy, ctx.amp = chunk, entropy, amp
        if not entropy:
            ctx.mark_non_differentiable(ent)
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h, weight, bias, targets, lse, ent = ctx.saved_tensors
        chunk, amp = ctx.chunk, ctx.amp
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        mm = amp or weight.dtype  # the dtype of the matmuls
        w_mm = weight.to(mm)
        g_h = torch.empty_like(h) if need_h else None
        g_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        g_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        z_buf, _ = _slice_buffers(h, weight, amp, min(chunk, h.shape[0]), 1)
        for s in range(0, h.shape[0], chunk):
            e = min(s + chunk, h.shape[0])
            hc = h[s:e]  # [c, D]
            with torch.autocast(h.device.type, dtype=amp, enabled=amp is not None):
                z = _slice_logits(hc, weight, bias, z_buf)  # [c, V], recomputed
            # one [c, V] buffer (two with entropy): z -> log p -> p -> d loss / d z, in place
            logp = z.sub_(lse[s:e, None])
            if ctx.entropy and g_ent is not None:
                p = logp.exp()
                gz = p * (logp + ent[s:e, None]) * (-g_ent[s:e].float()[:, None])  # d H / dz
                if g_lp is not None:
                    gz -= p * g_lp[s:e].float()[:, None]
                del p
            else:
                gz = logp.exp_()  # p
                gz *= -g_lp[s:e].float()[:, None] if g_lp is not None else 0.0
            del z, logp
            if g_lp is not None:
                gz.scatter_add_(-1, targets[s:e, None], g_lp[s:e].float()[:, None])
            if need_b:
                g_b += gz.sum(0)
            gz = gz.to(mm)
            if need_h:
                g_h[s:e] = (gz @ w_mm).to(h.dtype)
            if need_w:
                if mm == torch.float32 and hc.dtype == torch.float32:
                    g_w.addmm_(gz.T, hc)
                else:
                    g_w += (gz.T @ hc.to(mm)).float()
            del gz
        return (g_h, g_w.to(weight.dtype) if need_w else None, g_b.to(bias.dtype) if need_b else None,
                None, None, None)


def _slice_buffers(h: torch.Tensor, weight: torch.Tensor, amp, rows: int, n: int) -> tuple:
    """`n` fp32 buffers [rows, V] that every slice of `_ChunkedHead` reuses (None where they do not apply: under
    autocast or with weights other than fp32 the slice's logits come from F.linear, cast). A fresh [c, V] tensor of
    tens of MB per slice came back as fresh pages from the kernel each time (`x - max` in logsumexp: 3.7 ms with
    ~2,500 page faults for [384, 16,384], against 1.1 ms into a buffer) -> (logits buffer, logsumexp buffer)."""
    if amp is not None or h.dtype != torch.float32 or weight.dtype != torch.float32:
        return None, None
    bufs = [torch.empty(rows, weight.shape[0], device=h.device) for _ in range(n)]
    return bufs[0], (bufs[1] if n > 1 else None)


def _slice_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None):
    """h [c, D] -> logits [c, V] fp32: F.linear's own kernel (addmm with a bias, mm without), written into `out`
    [>= c, V] when given (the same floats), else F.linear's output cast to fp32."""
    if out is None:
        return F.linear(h, weight, bias).float()
    z = out[: h.shape[0]]
    return torch.addmm(bias, h, weight.t(), out=z) if bias is not None else torch.mm(h, weight.t(), out=z)


def _logsumexp_rows(z: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """torch.logsumexp(z, -1) for z [c, V], its own steps (max, exp of the difference, sum, log, + max; an
    infinite max counts as 0) with the [c, V] difference written into `tmp` -> [c]."""
    m = z.amax(-1, keepdim=True)  # [c, 1]
    m.masked_fill_(m.abs() == float("inf"), 0)
    return torch.sub(z, m, out=tmp).exp_().sum(-1).log_() + m.squeeze(-1)


def token_log_probs(logits: torch.Tensor, ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability of each next token: logits [B, T, V] (float), ids [B, T] (long), targets [B, T-1] long |
    None (default ids[:, 1:]) -> [B, T-1], entry t log pi(targets[:, t] | ids[:, :t+1]). Computed as gathered
    logit minus logsumexp (numerically stable, no [B, T, V] log-softmax kept for backward)."""
    assert logits.dim() == 3 and ids.dim() == 2 and logits.shape[:2] == ids.shape, \
        f"token_log_probs: logits {tuple(logits.shape)} and ids {tuple(ids.shape)}"
    return _row_stats(logits[:, :-1], ids[:, 1:] if targets is None else targets, entropy=False)[0]  # [B, T-1]


def _row_stats(z: torch.Tensor, targets: torch.Tensor, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits z [..., V], targets [...] long -> (log-probs [...], entropy [...] | None), in fp32: the
    gathered logit minus the logsumexp (`token_log_probs` on [B, T-1, V]; the kept rows [K, V] of a `TokenHead`)."""
    z = z.float()
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1), entropy_from_logits(z) if entropy else None


def sequence_log_probs(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token log-probs of `ids` under `model`.

    model: callable `(ids [B,T], attention_mask [B,T] | None) -> logits [B,T,V]`. ids [B, T], attention_mask
    [B, T] (bool, True on real tokens) -> [B, T-1]. Positions whose target is padding hold meaningless values:
    multiply by a mask.
    """
    logits = model(ids, attention_mask=attention_mask)
    return token_log_probs(logits, ids)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: logits [..., V] -> [...] in nats,
    H = logsumexp(z) - sum softmax(z) * z."""
    logits = logits.float()
    logz = torch.logsumexp(logits, dim=-1)
    p = torch.softmax(logits, dim=-1)
    return logz - (p * logits).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1 (any shape; 0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token",
              constant: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss to a scalar: the three strategies of the RLHF book,
    "Loss Aggregation Tradeoffs" (checklist 6.13).

    per_token [B, T-1], mask [B, T-1] (1.0 on tokens that count) -> scalar.

    - "token"    (DAPO, S2): sum_i sum_t l_it / sum_i |a_i| -- every token weighs the same.
    - "sequence" (GRPO, S1): (1/B) sum_i (1/|a_i|) sum_t l_it -- every sequence weighs the
      same, so tokens of short sequences weigh more. Rows with an empty mask count as 0.
    - "constant" (Dr. GRPO, S3): (1/B) sum_i (1/C) sum_t l_it with a fixed C (e.g. the
      maximum generation length), independent of the batch.
    """
    assert per_token.shape == mask.shape, f"aggregate: {tuple(per_token.shape)} vs mask {tuple(mask.shape)}"
    assert per_token.dim() == 2, f"aggregate expects [B, T-1], got {tuple(per_token.shape)}"
    mask = mask.to(per_token.dtype)
    summed = (per_token * mask).sum(-1)  # [B]
    if mode == "token":
        return summed.sum() / mask.sum().clamp(min=1)
    if mode == "sequence":
        return (summed / mask.sum(-1).clamp(min=1)).mean()
    if mode == "constant":
        if constant is None or constant <= 0:
            raise ValueError("aggregate(mode='constant') needs a positive `constant`")
        return (summed / constant).mean()
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")


def aggregation_share(part_mask: torch.Tensor, whole_mask: torch.Tensor, mode: Aggregation = "token") -> float:
    """Weight of a sub-batch's `aggregate`d loss in the whole batch's: sum over the parts of
    share * aggregate(part) == aggregate(whole). Used to shard a batch across processes
    (trajtune.engine.distributed) and to split it into micro-batches.

    part_mask [b, T-1] (rows of the whole batch), whole_mask [B, T-1] -> float in [0, 1].
    - "token": the part's POLICY tokens / the whole batch's (0 when the batch has none)
    - "sequence", "constant": the part's rows / the whole batch's rows
    """
    if mode == "token":
        total = float(whole_mask.sum())
        return float(part_mask.sum()) / total if total > 0 else 0.0
    if mode in ("sequence", "constant"):
        return part_mask.shape[0] / whole_mask.shape[0]
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")
