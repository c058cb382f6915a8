"""The HF pipeline's task and data: 2-digit additions as text, chats, pairs and prompts; the digit tokenizer and
the Llama built from a config."""

from __future__ import annotations

import json
import random
from pathlib import Path

from .config import Config, LlamaShape


# --- the task ---------------------------------------------------------------------------------
def question(task) -> str:
    return f"What is {task.a}+{task.b}?"


def completion_prompt(task) -> str:
    """What a base model is asked: `a+b=` (it should go on with the sum and a newline)."""
    return f"{task.a}+{task.b}="


def completion_text(task) -> str:
    """One line of the pretraining corpus: `a+b=c\\n`."""
    return f"{completion_prompt(task)}{task.answer}\n"


REWARD_FILE = '''"""The GRPO stage's reward (written by trajtune's hf_pipeline; TRL's signature)."""


def exact_answer(prompts, completions, answer, **kwargs):
    """1.0 when the reply is exactly the sum, else 0.0."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.strip() == str(a)) for t, a in zip(texts, answer, strict=True)]
'''
"""data/rewards.py: the reward function file GRPO is given (--reward data/rewards.py:exact_answer), as a
user writes one"""


def problems(config: Config, n: int, stream: int) -> list:
    """`n` training problems of stream `stream` (never a held-out pair)."""
    from ...envs.arithmetic import train_tasks

    return train_tasks(n, seed=config.seed * 101 + stream)


def data_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "data"


def model_dir(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / stage / "model"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Atomically: a rerun after a cut never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    return path


def conversation(task) -> list[dict]:
    return [{"role": "user", "content": question(task)}, {"role": "assistant", "content": task.answer}]


def write_corpora(config: Config, run_dir: Path, tokenizer) -> dict[str, Path]:
    """data/pretrain.jsonl ({"text"}: a `chat_share` of them conversations rendered by `tokenizer`'s chat
    template), sft.jsonl ({"messages"}), prompts.jsonl ({"prompt", "answer"}) and rewards.py (GRPO's reward)."""
    d = data_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    chat = [k < config.chat_share * config.n_pretrain for k in range(config.n_pretrain)]
    random.Random(config.seed).shuffle(chat)
    pretrain = [{"text": tokenizer.apply_chat_template(conversation(t), tokenize=False) if c else completion_text(t)}
                for t, c in zip(problems(config, config.n_pretrain, 0), chat, strict=True)]
    sft = [{"messages": conversation(t)} for t in problems(config, config.n_sft, 1)]
    prompts = [{"prompt": question(t), "answer": t.answer} for t in problems(config, config.n_grpo, 3)]
    (d / "rewards.py").write_text(REWARD_FILE, encoding="utf-8")
    return {"pretrain": write_jsonl(d / "pretrain.jsonl", pretrain), "sft": write_jsonl(d / "sft.jsonl", sft),
            "prompts": write_jsonl(d / "prompts.jsonl", prompts), "rewards": d / "rewards.py"}


# --- tokenizer and model ----------------------------------------------------------------------
def train_digit_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE (any text encodes) whose digits never merge (`Digits(individual_digits=True)`,
    as Llama 1/2 split numbers), with ChatML specials and `hf_random`'s chat template. A number is then
    its digits, so the model can learn the carry instead of 8,100 memorised sums."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ...models.hf_random import CHATML_TEMPLATE, SPECIALS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_llama(shape: LlamaShape, tokenizer, seed: int):
    """A randomly initialised LlamaForCausalLM of `shape` (no bos token)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=shape.hidden_size,
                         intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_hidden_layers,
                         num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
                         max_position_embeddings=shape.max_position_embeddings,
                         tie_word_embeddings=shape.tie_word_embeddings,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
