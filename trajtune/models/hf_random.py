"""Tiny random Hugging Face models with locally trained tokenizers: for tests, benchmarks and demos.

Nothing is downloaded: a byte-level BPE tokenizer is trained on a small corpus
with `tokenizers`, a Llama or Qwen2 config is filled in, and both are written
with `save_pretrained`, so everything downstream goes through the real loading
path (`AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(dir)`).

    from trajtune.models.hf_random import make_random_model
    make_random_model("runs/tiny-llama", arch="llama", size="tiny")
    # trajtune sft --model runs/tiny-llama --data demo.jsonl ...
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML-style template with system prompts, tool schemas and tool calls (the Qwen2 layout, simplified).
CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if not (tools and loop.first and m.role == 'system') -%}"
    "<|im_start|>{{ m.role }}\n"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% "
    "endif %}"
    "<|im_end|>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)

# Like Qwen3's template: the <think> block of an assistant turn is dropped once a later user
# message follows it -- NOT prefix-preserving across turns.
DROP_THINK_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- set c = m.content or '' -%}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1] | trim -%}{%- endif -%}"
    "<|im_start|>{{ m.role }}\n{{ c }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)

DEFAULT_CORPUS = [
    "the cat sat on the mat. what is 2 + 3? the answer is 5.",
    "You are a helpful assistant. Please answer the question.",
    "user assistant system tool call result passed failed",
    '{"name": "run_tests", "arguments": {"path": "clamp.py"}} <tool_call> </tool_call>',
    "<think> let me think step by step </think> hello world 0 1 2 3 4 5 6 7 8 9",
]

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "small": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4),
}


def train_tokenizer(corpus: Iterable[str] = DEFAULT_CORPUS, vocab_size: int = 512,
                    chat_template: str = CHATML_TEMPLATE):
    """A byte-level BPE `PreTrainedTokenizerFast` (any text encodes) with ChatML specials and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus) * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = chat_template
    return fast


def make_random_model(path: str | os.PathLike, arch: str = "llama", size: str = "tiny", *, seed: int = 0,
                      corpus: Iterable[str] = DEFAULT_CORPUS, vocab_size: int = 512,
                      chat_template: str = CHATML_TEMPLATE, max_positions: int = 512, padded_vocab: int = 0,
                      overrides: dict | None = None) -> Path:
    """Write a randomly initialised Llama / Qwen2 causal LM and its tokenizer to `path`; returns it.

    padded_vocab: the model's vocabulary (embedding rows) when larger than the tokenizer's, as Qwen2.5
    pads its 151,646 tokens to 151,936 (benchmarks/memory.py: a real vocabulary on a small model).
    overrides: config fields that replace the size's (e.g. {"hidden_size": 384, "num_hidden_layers": 6})."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if arch not in ("llama", "qwen2") or size not in SIZES:
        raise ValueError(f"arch in (llama, qwen2) and size in {list(SIZES)}; got {arch!r}, {size!r}")
    tok = train_tokenizer(corpus, vocab_size, chat_template)
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    if padded_vocab and padded_vocab < len(tok):
        raise ValueError(f"padded_vocab={padded_vocab} is smaller than the tokenizer's {len(tok)} tokens")
    config = config_cls(vocab_size=max(len(tok), padded_vocab), max_position_embeddings=max_positions,
                        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                        bos_token_id=None, **{**SIZES[size], **(overrides or {})})
    torch.manual_seed(seed)
    model = model_cls(config)
    path = Path(path)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path
