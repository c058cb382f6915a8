"""Hugging Face causal LMs behind the TinyTransformer contract (optional LoRA).

`HFPolicy` wraps any `AutoModelForCausalLM` so the sampler, the engine and every
algorithm loop use it exactly like `TinyTransformer`:

    policy(ids [B,t], attention_mask [B,t] | None, cache=None, return_values=False, head=None)
        -> logits [B,t,V]   (and values [B,t] with return_values=True)
        -> with head=TokenHead(ids): its HeadOutput (token log-probs through the output layer in
           chunks of positions, never the whole [B,t,V] logits; `trajtune.logprobs.TokenHead`)
    policy.new_cache(batch_size, max_len) -> HFCache

Positions come from the attention mask (`cumsum - 1`), as in TinyTransformer, so
left-padded sampler prompts and right-padded training batches give the same
logits for the same real tokens. With a cache, `ids` are the next t tokens of
every row; `attention_mask` marks which of them are real, and the cache keeps
the mask of everything before them.

Models and tokenizers load from a local folder with `local_files_only=True`; what
`--model` names (a folder, a hub id, a .gguf file, a catalog name such as
smollm2-135m) becomes that folder in `check_model_dir` (`trajtune.models.hub`:
the only place that may download or convert), and a spec that names no model
fails with one line that says so.

LoRA (peft): `load_policy(..., lora=LoraSettings(r=16))` freezes the base
weights and trains adapters. The KL / DPO reference is then the base model with
adapters disabled (`frozen_reference`), not a second copy of the weights.
`save_pretrained` writes a directory `AutoModelForCausalLM.from_pretrained`
loads (LoRA merged in) plus `adapter/` (the peft adapter) and, for reward models
and PPO, `value_head.safetensors`. A policy with a value head is also a
sequence classifier: the same weights file holds the head as the classifier's
`score` weight, and config.json says `num_labels=1`, the pad token and the
`...ForSequenceClassification` architecture, so
`AutoModelForSequenceClassification.from_pretrained(dir)` loads the trained
reward model (its logit is the head at the last non-pad token: `last_token_values`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..checkpoint import atomic_dir, load_tensors, save_tensors
from ..logprobs import SharedPrefix, TokenHead
from .hub import ModelPathError, resolve_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoraSettings:
    """A peft LoRA adapter, with TRL's `ModelConfig` defaults (lora_r 16, lora_alpha 32, lora_dropout 0.05)."""

    r: int = 16
    """adapter rank"""
    alpha: float = 32.0
    """scaling numerator (the update is alpha / r * B A)"""
    dropout: float = 0.05
    """dropout on the adapter input"""
    target_modules: list[str] | str | None = None
    """which Linear layers get adapters: None for peft's default of the architecture (q_proj, v_proj for
    Llama / Qwen2; TRL's default), "all-linear", or names such as ["q_proj", "k_proj", "v_proj", "o_proj"]"""

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ValueError(f"LoraSettings: r >= 1, alpha > 0, 0 <= dropout < 1 (got {asdict(self)})")


def check_model_dir(path: str | os.PathLike) -> Path:
    """The local Hugging Face folder (config.json) that `path` names: the folder itself, or what a hub id, a .gguf
    file or a catalog name resolves to (`trajtune.models.hub.resolve_model`: may download or convert, once);
    otherwise a `ModelPathError` saying what was tried."""
    return resolve_model(path)


def _tokenizer_file(name: str) -> bool:
    """Whether a file of a model directory may be (part of) a tokenizer: tokenizer.json / tokenizer_config.json
    and the like, a BPE or WordPiece vocabulary, merges, a sentencepiece or tiktoken model."""
    return name.startswith(("tokenizer", "vocab", "merges", "spiece", "sentencepiece")) or name.endswith(
        (".tiktoken", ".model"))


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved in a local model directory (pad token set to eos if missing)."""
    from transformers import AutoTokenizer

    p = check_model_dir(path)
    if not any(_tokenizer_file(f.name) for f in p.iterdir()):
        raise ModelPathError(f"{p}: no tokenizer in the directory (no tokenizer.json, tokenizer_config.json, vocab "
                             "or sentencepiece file); save one there with tokenizer.save_pretrained(dir)")
    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelPathError(f"{p}: cannot load a tokenizer ({e})") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(
    path: str | os.PathLike,
    *,
    value_head: bool = False,
    lora: LoraSettings | None = None,
    dtype: str = "float32",
    gradient_checkpointing: bool = False,
    disable_dropout: bool = False,
) -> "HFPolicy":
    """Load `AutoModelForCausalLM` from a local directory and wrap it as an `HFPolicy`.

    value_head: add a scalar head (reward model, PPO value); restored from
      `value_head.safetensors` when the directory has one.
    lora: train LoRA adapters instead of all weights.
    dtype: weight dtype ("float32"; "bfloat16" to halve memory; use engine autocast for mixed precision).
    gradient_checkpointing: recompute activations in backward (less memory, ~30% more compute).
    disable_dropout: set every dropout probability to 0, LoRA's included (TRL's `disable_dropout`).
    """
    from transformers import AutoModelForCausalLM

    p = check_model_dir(path)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {list(DTYPES)}")
    from safetensors import SafetensorError

    try:
        with _quiet_head_report(p):
            model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, dtype=DTYPES[dtype])
    except SafetensorError as e:  # a truncated or corrupted weights file
        weights = sorted(q.name for q in p.glob("*.safetensors")) or ["*.safetensors"]
        raise ModelPathError(f"{p}: cannot read its weights ({', '.join(weights)}: {e}); the file is truncated or "
                             f"corrupted: save the model again, or copy it again") from e
    except (OSError, ValueError, KeyError) as e:
        raise ModelPathError(f"{p}: cannot load a causal LM ({type(e).__name__}: {e})") from e
    if gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    if disable_dropout:
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    policy = HFPolicy(model, value_head=value_head)
    head = p / "value_head.safetensors"
    if value_head and head.exists():
        policy.value.load_state_dict(load_tensors(head))
    return policy


class _OnlyUnexpectedHead(logging.Filter):
    """Drops transformers' load report when all it says is that keys were UNEXPECTED."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("LOAD REPORT" in text and "UNEXPECTED" in text and "MISSING" not in text and "MISMATCH" not in text)


@contextlib.contextmanager
def _quiet_head_report(path: Path):
    """A reward model trajtune saved is also a sequence classifier: its `score` weight is an unexpected key for
    the causal LM, by design. Silence that one report (only for such a directory; any other report shows)."""
    try:
        ours = json.loads((path / "trajtune.json").read_text()).get("sequence_classification", False)
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        yield
        return
    log, quiet = logging.getLogger("transformers.modeling_utils"), _OnlyUnexpectedHead()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


class HFCache:
    """KV cache of an HF model plus what the adapter needs to continue left-padded rows.

    kv: the model's own cache object (`DynamicCache`); key_mask [B, S] bool: real
    positions so far; positions [B]: next position id of each row; position_bound: > every
    position id given so far (a decode step checks the context limit without reading `positions`
    back from the device).
    """

    def __init__(self, batch_size: int, device, config):
        from transformers import DynamicCache

        try:
            self.kv = DynamicCache(config=config)
        except TypeError:  # older signature
            self.kv = DynamicCache()
        self.key_mask = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.position_bound = 0
        self.length = 0

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep row index[i] as row i (index [B'] long; repeats copy a row), through the model cache's own
        `reorder_cache` (beam search's: every cache layer type of transformers has it)."""
        self.kv.reorder_cache(index)
        self.key_mask = self.key_mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)


class HFPolicy(nn.Module):
    """An HF causal LM (optionally a peft LoRA model) with the TinyTransformer forward contract."""

    def __init__(self, model: nn.Module, value_head: bool = False):
        super().__init__()
        self.model = model
        hidden = self.base_config.hidden_size
        self.value = nn.Linear(hidden, 1) if value_head else None
        if self.value is not None:
            nn.init.normal_(self.value.weight, std=1.0 / (hidden + 1) ** 0.5)
            nn.init.zeros_(self.value.bias)
            self.value.to(next(model.parameters()).dtype)
        params = inspect.signature(self._causal_lm().forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2x renamed it

    # --- what kind of model this is
    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def _causal_lm(self) -> nn.Module:
        return self.model.get_base_model() if self.is_lora else self.model

    @property
    def base_config(self):
        return self._causal_lm().config

    @property
    def max_len(self) -> int:
        return int(getattr(self.base_config, "max_position_embeddings", 0) or 1 << 30)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> HFCache:
        if max_len is not None and max_len > self.max_len:
            raise ValueError(f"KV cache of {max_len} positions > the model's max_position_embeddings={self.max_len}")
        return HFCache(batch_size, next(self.parameters()).device, self.base_config)

    # --- the contract
    @property
    def supports_shared_prefix(self) -> bool:
        """Whether `forward(..., packing=SharedPrefix)` is exact for this model: SDPA attention (which takes
        the packing's boolean mask as is) and no sliding-window layers (a custom mask would replace the window)."""
        config = self.base_config
        sliding = (getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)) or \
            "sliding_attention" in (getattr(config, "layer_types", None) or ())
        return getattr(config, "_attn_implementation", None) == "sdpa" and not sliding

    def forward(self, ids, attention_mask=None, cache: HFCache | None = None, return_values: bool = False,
                head: TokenHead | None = None, packing: SharedPrefix | None = None):
        """-> logits [B, t, V]; with `head`, its `HeadOutput` (token log-probs of `head.ids` through the
        output layer in chunks, for the heads `_plain_head` accepts). return_values: also values [B, t].
        packing: run the rows' shared prefixes once (`logprobs.SharedPrefix`, no cache; see
        `supports_shared_prefix`); the outputs are still those of `ids`' rows."""
        real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()  # [B, t]
        step = (real.long().cumsum(-1) - 1).clamp(min=0)  # [B, t]
        # no cache: else transformers builds a DynamicCache and copies every K / V into it
        kwargs = {"use_cache": False}
        if packing is not None:
            if cache is not None:
                raise ValueError("HFPolicy.forward: a SharedPrefix packing cannot continue a KV cache")
            ids, pos, mask = packing.ids, packing.positions, packing.mask  # [U, L], [U, L], [U, 1, L, L]
        elif cache is None:
            pos, mask = step, real
        else:
            pos = cache.positions[:, None] + step
            cache.positions = cache.positions + real.long().sum(-1)
            cache.key_mask = torch.cat([cache.key_mask, real], 1)  # [B, S + t]
            mask = cache.key_mask
            kwargs = {self._cache_kw: cache.kv, "use_cache": True}
            cache.length += ids.shape[1]
        if cache is not None:  # ids.shape[1] more positions at most: no host-device sync while the bound fits
            cache.position_bound += ids.shape[1]
        if (cache is None or cache.position_bound > self.max_len) and int(pos.max()) >= self.max_len:
            raise ValueError(f"sequence longer than the model's context max_position_embeddings={self.max_len}")
        if return_values and self.value is None:
            raise ValueError("this HFPolicy has no value head (load_policy(..., value_head=True))")
        lm_head = self._plain_head() if head is not None else None
        mask = mask if packing is not None else mask.long()  # the packing's 4D boolean mask goes to SDPA as is
        unpack = packing.gather if packing is not None else (lambda x: x)  # packed rows -> the batch's rows
        if lm_head is not None:  # the decoder alone, then the head in chunks: no [B, t, V] logits
            decoder = getattr(self._causal_lm(), self._causal_lm().base_model_prefix)
            h = unpack(decoder(input_ids=ids, attention_mask=mask, position_ids=pos, **kwargs).last_hidden_state)
            out = head(h, lm_head.weight, lm_head.bias, lm_head)
        else:
            res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                             output_hidden_states=return_values, **kwargs)
            h = unpack(res.hidden_states[-1]) if return_values else None  # [B, t, D]
            logits = unpack(res.logits)
            out = logits if head is None else head.of_logits(logits)
        if not return_values:
            return out
        return out, self.value(h.to(self.value.weight.dtype)).squeeze(-1)  # [B, t]

    def _plain_head(self) -> nn.Linear | None:
        """The output layer if logits are just `lm_head(last hidden state)` (Llama, Qwen2, ...): then a
        `TokenHead` can run it in chunks. None for heads that scale or cap logits, or carry adapters."""
        lm = self._causal_lm()
        head = lm.get_output_embeddings()
        config = self.base_config
        scaled = any(getattr(config, k, None) not in (None, 1.0, 1) for k in
                     ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale"))
        if type(head) is not nn.Linear or scaled or not hasattr(lm, getattr(lm, "base_model_prefix", "") or "-"):
            return None
        return head

    def values(self, ids, attention_mask=None):
        """Scalar head on every position: [B, T]."""
        return self.forward(ids, attention_mask, return_values=True)[1]

    # --- reference without a second copy
    def frozen_reference(self, adapters_off: bool = False) -> nn.Module:
        """A frozen model equal to the current policy, for KL / DPO references.

        With LoRA adapters that are still at their initial value (B = 0, so the policy
        equals the base model) this is the base model seen with adapters disabled: no
        second copy in memory. Otherwise a deep copy. `adapters_off=True` asks for the
        base model whatever the adapters hold (a resumed stage whose reference was it).
        """
        if self.is_lora and (adapters_off or all(float(p.detach().abs().max()) == 0.0
                                                 for n, p in self.model.named_parameters() if "lora_B" in n)):
            return AdaptersOff(self)
        ref = copy.deepcopy(self)
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # --- saving in the Hugging Face format
    def save_pretrained(self, path: str | os.PathLike, tokenizer=None, meta: dict | None = None) -> Path:
        """Write a directory `AutoModelForCausalLM.from_pretrained(path)` loads (LoRA merged),
        plus `adapter/` (LoRA only), `value_head.safetensors` (value head only),
        the tokenizer and `trajtune.json` (`meta`). With a value head the directory is also what
        `AutoModelForSequenceClassification.from_pretrained(path)` loads, head included (see the
        module docstring). Atomic: a crash leaves the old directory."""
        with atomic_dir(path) as tmp:
            if self.is_lora:
                self.model.save_pretrained(str(tmp / "adapter"))
                merged = copy.deepcopy(self.model).merge_and_unload()
            else:
                merged = self.model
            classifier = self._classifier(merged, tokenizer) if self.value is not None else None
            state = {**merged.state_dict(), **classifier[1]} if classifier else None
            merged.save_pretrained(str(tmp), state_dict=state)
            if classifier:
                classifier[0].save_pretrained(str(tmp))  # config.json: num_labels=1, pad token, both architectures
            if tokenizer is not None:
                tokenizer.save_pretrained(str(tmp))
            if self.value is not None:
                save_tensors(self.value.state_dict(), tmp / "value_head.safetensors")
            info = {"format": "trajtune-hf", "lora": self.is_lora, "value_head": self.value is not None,
                    "sequence_classification": bool(classifier), "meta": meta or {}}
            (tmp / "trajtune.json").write_text(json.dumps(info, indent=1))
        return Path(path)

    def _classifier(self, merged: nn.Module, tokenizer) -> tuple | None:
        """(config, {head key: tensor}) that make the saved causal LM an `AutoModelForSequenceClassification`
        checkpoint with this value head as its one-label head; None where transformers has no classifier
        for the architecture, or its head is not a plain Linear on the last hidden state without a bias while
        this head's bias is not 0 (a Bradley-Terry head keeps its bias at 0: the loss reads only differences)."""
        from transformers import AutoModelForSequenceClassification

        config = copy.deepcopy(merged.config)
        config.num_labels = 1
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is not None:
            config.pad_token_id = pad
        try:
            with torch.device("meta"):
                shell = AutoModelForSequenceClassification.from_config(config)
        except (ValueError, KeyError):
            return None
        own = set(merged.state_dict())
        head = {k: v for k, v in shell.state_dict().items() if k not in own}
        weight = [k for k, v in head.items() if tuple(v.shape) == tuple(self.value.weight.shape)]
        bias = [k for k in head if k not in weight]
        if len(weight) != 1 or len(bias) > 1 or (not bias and float(self.value.bias.detach().abs().max()) != 0.0):
            return None
        tensors = {weight[0]: self.value.weight.detach().clone()}
        if bias:
            tensors[bias[0]] = self.value.bias.detach().clone()
        config.architectures = [type(shell).__name__, type(merged).__name__]
        return config, tensors

    def num_parameters(self, trainable: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable)


class AdaptersOff(nn.Module):
    """The base model under a LoRA `HFPolicy`: same weights, adapters disabled (no copy).

    Holds the policy without registering it, so `parameters()` is empty: an engine
    around it never builds an optimizer over the policy's weights.
    """

    shares_policy_weights = True  # nothing of its own to checkpoint (trajtune.runs.resume.Checkpointer.reference)

    def __init__(self, policy: HFPolicy):
        super().__init__()
        object.__setattr__(self, "policy", policy)
        self.anchor = nn.Parameter(torch.zeros(0, device=next(policy.parameters()).device), requires_grad=False)

    def train(self, mode: bool = True):  # never switch the shared policy's mode from here
        self.training = mode
        return self

    @property
    def supports_shared_prefix(self) -> bool:
        return self.policy.supports_shared_prefix

    def forward(self, ids, attention_mask=None, cache=None, return_values: bool = False, head: TokenHead | None = None,
                packing: SharedPrefix | None = None):
        was = self.policy.training
        self.policy.eval()
        try:
            with self.policy.model.disable_adapter():
                return self.policy(ids, attention_mask, cache, return_values, head, packing)
        finally:
            self.policy.train(was)
