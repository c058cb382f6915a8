"""TinyTransformer: a small decoder-only transformer with a KV cache, for CPU gyms and tests.

Pre-LayerNorm blocks, learned absolute positions (or rotary, or none), tied input/output embeddings,
`scaled_dot_product_attention` with an explicit boolean mask. Positions are
derived from the attention mask (`cumsum - 1`), so left-padded prompts (used by
the sampler) and right-padded training batches give the same logits for the
same real tokens.

Its checkpoint format (`save_model` / `load_model`) is a directory, written atomically:

    config.json        {"format": "trajtune", "model": "TinyTransformer", "config": {...}, "meta": {...}}
    model.safetensors  the weights
    tokenizer.json     (optional) the toy tokenizer
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checkpoint import CheckpointError, atomic_dir, load_model_weights, save_model_weights
from ..logprobs import TokenHead
from ..text.tokenizers import Tokenizer


POSITIONS = ("learned", "rope", "none")
"""TinyConfig.positions"""
ROPE_BASE = 10_000.0
"""rotary frequency base (RoFormer, Llama)"""


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int
    """number of token ids (tokenizer's `vocab_size`)"""
    dim: int = 128
    """width of the residual stream"""
    n_layers: int = 4
    """number of transformer blocks"""
    n_heads: int = 4
    """attention heads per block (dim must be divisible by it)"""
    max_len: int = 512
    """context length: the largest position the model can embed"""
    mlp_ratio: int = 4
    """hidden width of the MLP = mlp_ratio * dim"""
    dropout: float = 0.0
    """dropout on attention output and MLP (0 keeps sampling and training identical)"""
    value_head: bool = False
    """add a scalar head on the last hidden state (PPO value / reward model)"""
    tied: bool = True
    """the output layer is the token embedding (GPT-2). False: a separate `lm_head` with PyTorch's default
    Linear init (logits of std ~0.6 at init); then a token never seen in training inputs keeps its small
    init embedding instead of being pushed around by the softmax of every output position"""
    positions: str = "learned"
    """how a token's position enters: "learned" (GPT-2's absolute embedding table), "rope" (rotary
    embeddings on queries and keys: attention sees only relative offsets) or "none" (no position signal
    but the causal mask)"""

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"TinyConfig: positions={self.positions!r} is not one of {', '.join(POSITIONS)}")
        if self.positions == "rope" and (self.dim // max(1, self.n_heads)) % 2:
            raise ValueError(f"TinyConfig: positions='rope' needs an even head size, got dim/n_heads="
                             f"{self.dim}/{self.n_heads}")
        if self.dim % self.n_heads:
            raise ValueError(f"TinyConfig: dim={self.dim} is not divisible by n_heads={self.n_heads}")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TinyConfig: {name} must be positive, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """Preallocated keys/values for incremental decoding.

    k, v: per layer [B, H, max_len, head_dim]; `length` = positions filled so far;
    `key_mask` [B, max_len] bool marks real (non-padding) positions.
    """

    def __init__(self, config: TinyConfig, batch_size: int, device, dtype=torch.float32, max_len: int | None = None):
        L = max_len or config.max_len
        hd = config.dim // config.n_heads
        shape = (batch_size, config.n_heads, L, hd)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.key_mask = torch.zeros(batch_size, L, dtype=torch.bool, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.long, device=device)  # next position id per row
        self.position_bound = 0  # >= every row's next position id (so a decode step needs no max() to check it)
        self.length = 0
        self.capacity = L

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep row index[i] as row i (index [B'] long; repeats copy a row): e.g. a prompt prefilled
        once, continued by every row that shares it (`sampling.sample(share_prompts=True)`)."""
        self.k = [t.index_select(0, index) for t in self.k]
        self.v = [t.index_select(0, index) for t in self.v]
        self.key_mask = self.key_mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)


def _rotary(pos, head_dim: int, dtype):
    """pos [B, t] long -> (cos, sin) [B, 1, t, head_dim/2]: angle pos * base^(-2i/head_dim) per pair i."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)
    angle = pos[:, None, :, None].float() * inv_freq  # [B, 1, t, hd/2]
    return angle.cos().to(dtype), angle.sin().to(dtype)


def _rotate(x, cos, sin):
    """x [B, H, t, hd] with its halves (x1, x2) as the pairs' coordinates -> the pairs rotated by the angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, c: TinyConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.ln1 = nn.LayerNorm(c.dim)
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.proj = nn.Linear(c.dim, c.dim)
        self.ln2 = nn.LayerNorm(c.dim)
        self.mlp = nn.Sequential(nn.Linear(c.dim, c.mlp_ratio * c.dim), nn.GELU(), nn.Linear(c.mlp_ratio * c.dim,
                                                                                             c.dim))
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x, allowed, cache: KVCache | None = None, layer: int = 0, rotary=None):
        # x [B, t, D]; allowed [B, 1, t, S] bool (S = keys visible: t, or cache length + t),
        # or None: plain causal attention (no cache, every row's padding is on the right);
        # rotary: (cos, sin) [B, 1, t, hd/2] of the new tokens' positions, or None
        B, t, D = x.shape
        H = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (z.view(B, t, H, D // H).transpose(1, 2) for z in (q, k, v))  # [B, H, t, hd]
        if rotary is not None:
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        if cache is not None:
            s = cache.length
            cache.k[layer][:, :, s : s + t] = k
            cache.v[layer][:, :, s : s + t] = v
            k, v = cache.k[layer][:, :, : s + t], cache.v[layer][:, :, : s + t]  # [B, H, S, hd]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=allowed is None)  # [B, H, t, hd]
        y = y.transpose(1, 2).reshape(B, t, D)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyTransformer(nn.Module):
    """`forward(ids [B,t], attention_mask [B,t] | None, cache) -> logits [B,t,V]`
    (or, with `head=TokenHead(ids)`, the token log-probs without the whole logits).

    Without a cache: ordinary causal forward over the whole sequence.
    With a cache: `ids` are the next t tokens of every row; their keys/values are
    appended to the cache and they attend to everything cached before them.
    `attention_mask` marks real tokens among the new `ids` (False = padding).
    """

    def __init__(self, config: TinyConfig):
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.dim)
        self.pos_emb = nn.Embedding(c.max_len, c.dim) if c.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.dim)
        self.value = nn.Linear(c.dim, 1) if c.value_head else None
        self.apply(self._init)
        # after the GPT-2 init: the untied head keeps PyTorch's default Linear init, U(+-1/sqrt(dim))
        self.lm_head = None if c.tied else nn.Linear(c.dim, c.vocab_size, bias=False)
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        p = self.tok_emb.weight
        return KVCache(self.config, batch_size, p.device, p.dtype, max_len)

    def hidden(self, ids, attention_mask=None, cache: KVCache | None = None):
        """Final hidden states [B, t, D] (after the last LayerNorm)."""
        B, t = ids.shape
        real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if cache is None:
            pos = (real.long().cumsum(-1) - 1).clamp(min=0)  # [B, t]
            keys = real  # [B, S=t]
            causal_diagonal = 0
        else:
            s = cache.length
            if s + t > cache.capacity:
                raise ValueError(f"KV cache overflow: {s} cached + {t} new > capacity {cache.capacity}")
            if t == 1:  # one decode step: the row's next position, no cumsum
                pos = cache.positions[:, None]  # [B, 1]
                cache.positions = cache.positions + real[:, 0]
            else:
                pos = cache.positions[:, None] + (real.long().cumsum(-1) - 1).clamp(min=0)
                cache.positions = cache.positions + real.long().sum(-1)
            cache.key_mask[:, s : s + t] = real
            keys = cache.key_mask[:, : s + t]
            causal_diagonal = s
        if cache is None or cache.position_bound + t > self.config.max_len:
            if int(pos.max()) >= self.config.max_len:
                raise ValueError(f"sequence longer than the model's context max_len={self.config.max_len}")
        if cache is not None:
            cache.position_bound += t
        if cache is not None and t == 1:
            # a decode step sees every real cached key and itself: the general mask below, in two ops
            allowed = keys.clone()
            allowed[:, -1] = True
            allowed = allowed[:, None, None, :]  # [B, 1, 1, S]
        elif cache is None and bool((real[:, 1:] <= real[:, :-1]).all()):
            # right padding only (training batches): causal attention alone gives every real
            # token the same keys as the explicit mask, and no [B, t, t] mask is built
            allowed = None
        else:
            causal = torch.ones(t, keys.shape[1], dtype=torch.bool, device=ids.device).tril(diagonal=causal_diagonal)
            allowed = causal[None] & keys[:, None, :]  # [B, t, S]
            # a query always sees itself, so padded queries never attend to nothing (NaN)
            diag = torch.zeros_like(allowed)
            diag[:, torch.arange(t), torch.arange(t) + (allowed.shape[-1] - t)] = True
            allowed = (allowed | diag)[:, None]  # [B, 1, t, S]
        x = self.tok_emb(ids)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        rotary = _rotary(pos, self.config.dim // self.config.n_heads,
                         x.dtype) if self.config.positions == "rope" else None
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, cache, i, rotary)
        if cache is not None:
            cache.length += t
        return self.ln_f(x)

    def forward(self, ids, attention_mask=None, cache: KVCache | None = None, return_values: bool = False,
                head: TokenHead | None = None):
        """-> logits [B, t, V]; with `head`, its `HeadOutput` instead (token log-probs of `head.ids`, in
        chunks of positions: no [B, t, V] tensor). return_values: also the value head's [B, t]."""
        if return_values and self.value is None:
            raise ValueError("this TinyTransformer has no value head (TinyConfig.value_head=False)")
        h = self.hidden(ids, attention_mask, cache)
        weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight  # [V, D]
        project = lambda x: x @ weight.T  # noqa: E731  [B, t, V]
        out = project(h) if head is None else head(h, weight, None, project)
        return (out, self.value(h).squeeze(-1)) if return_values else out  # [B, t]

    def values(self, ids, attention_mask=None):
        """Scalar head on every position: [B, T] (needs `value_head=True`)."""
        if self.value is None:
            raise ValueError("this TinyTransformer has no value head (TinyConfig.value_head=False)")
        return self.value(self.hidden(ids, attention_mask)).squeeze(-1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


# --- the checkpoint format ------------------------------------------------------
MODEL_CLASSES = {"TinyTransformer": (TinyTransformer, TinyConfig)}
"""model class name (config.json "model") -> (model class, config class)"""


def save_model(path: str | os.PathLike, model: TinyTransformer, tokenizer: Tokenizer | None = None,
               meta: dict | None = None) -> Path:
    """Save a model (and optionally its tokenizer and a JSON-able `meta` dict) to directory `path`."""
    name = type(model).__name__
    if name not in MODEL_CLASSES:
        raise TypeError(f"save_model: no checkpoint format for {name}; known: {sorted(MODEL_CLASSES)}")
    with atomic_dir(path) as tmp:
        cfg = {"format": "trajtune", "model": name, "config": model.config.to_dict(), "meta": meta or {}}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        save_model_weights(model, tmp / "model.safetensors")
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
    return Path(path)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[TinyTransformer, Tokenizer | None]:
    """Load what `save_model` wrote: (model, tokenizer or None)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{path}: not a trajtune checkpoint (no config.json)")
    try:
        cfg = json.loads(cfg_file.read_text())
        cls, config_cls = MODEL_CLASSES[cfg["model"]]
        config = config_cls(**cfg["config"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{cfg_file}: malformed checkpoint config ({e!r})") from e
    model = cls(config)
    load_model_weights(model, path / "model.safetensors")
    tok_file = path / "tokenizer.json"
    tokenizer = Tokenizer.load(tok_file) if tok_file.exists() else None
    return model.to(device), tokenizer
