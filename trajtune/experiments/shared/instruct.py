"""Post-training ch.13 steps 1-2 (REPRODUCE B1-B2): a char LM pretrained on Shakespeare, then SFT.

    B1  pretrain  a character-level TinyTransformer (~355k parameters) on the Shakespeare
                  corpus: next-token NLL on every character (SFT where every token is POLICY)
    B2  sft       SFT on the narrow (16 words) and broad (~400 words) demonstration sets of
                  equal size; adherence on seen words, unseen words, first letter; loss on
                  ordinary text before/after

Every conversation goes through the one `Renderer`: a demonstration is
`<bos><|user|>Q: love\\nA: <|end|><|assistant|>Love is ...<|end|>`, and the models are
sampled on exactly that prompt. The base model never saw the wrapper tokens: the
seed's base model never saw `Q:`/`A:` used as an instruction either; both only continue text.

A stage is `fn(ctx: trajtune.runs.stages.StageContext, *args) -> dict`: it reads the experiment's
`Config` from `ctx.config`, its inputs from models earlier stages saved under `ctx.run_dir`,
and returns JSON-able results (`chapter13/__init__.py` lists the stages and their order).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Callable

import torch

from ...algorithms.sft import train_sft
from ...sources.base import Source
from ...sources.build import episode_source
from ...sources.episodes import sample_episodes
from ...sources.sampling import SamplingConfig
from ...engine import Engine
from ...envs.instruct import (
    SEEN, UNSEEN, InstructTask, demo_sets, demonstrations, instruct_env, instruct_tokenizer, shakespeare_text,
)
from ...models.tiny import TinyConfig, TinyTransformer, load_model
from ...text.render import Renderer
from ...trajectory import Owner, Trajectory, collate
from ...seeding import derive

MAX_LEN = 128  # context: prompt (16 tokens) + a 64-character reply fits


@lru_cache(maxsize=2)
def corpus(val_fraction: float = 0.1):
    """(tokenizer, train ids, val ids, demonstrations cut from the training text only)."""
    text = shakespeare_text()
    tok = instruct_tokenizer(text)
    split = int(len(text) * (1 - val_fraction))
    ids = tok.encode(text)
    return tok, ids[:split], ids[split:], demonstrations(text[:split])


def renderer() -> Renderer:
    return Renderer(corpus()[0])


def demo(r: Renderer, task: InstructTask, reply: str) -> Trajectory:
    """One demonstration, rendered by the one renderer (reply and its <|end|> are POLICY)."""
    return r.render([{"role": "user", "content": task.prompt}, {"role": "assistant", "content": reply}])


def text_windows(ids: list[int], n: int, length: int, seed: int) -> list[Trajectory]:
    """`n` random windows of `length + 1` characters; every predicted character is POLICY (pretraining)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = rng.randrange(len(ids) - length - 1)
        t = Trajectory()
        t.append(ids[s : s + 1], Owner.PROMPT, 0)
        t.append(ids[s + 1 : s + length + 1], Owner.POLICY, 0)
        out.append(t)
    return out


@torch.no_grad()
def window_losses(engine: Engine, val_windows: list[Trajectory], pad_id: int, batch: int = 64) -> list[float]:
    """Each held-out window's mean next-character NLL: [windows] (the per-item numbers a paired comparison of two
    models on the same windows needs, `runs.verdicts.paired`)."""
    out: list[float] = []
    for i in range(0, len(val_windows), batch):
        b = collate(val_windows[i : i + batch], pad_id)
        nll = -(engine.forward(b).logprobs * b.action_mask).sum(-1)  # [B]
        out += (nll / b.action_mask.sum(-1)).tolist()
    return out


def corpus_loss(engine: Engine, val_windows: list[Trajectory], pad_id: int, batch: int = 64) -> float:
    """Mean next-character NLL on held-out Shakespeare windows (how much text modelling survives; every window has
    `block_size` predicted characters, so the mean over windows is the mean over characters)."""
    losses = window_losses(engine, val_windows, pad_id, batch)
    return sum(losses) / len(losses)


def val_windows(config) -> list[Trajectory]:
    """The seed's 10 x 32 held-out windows of 64 characters (fixed: generator 1234)."""
    tok, _, val, _ = corpus()
    return text_windows(val, config.val_windows, config.block_size, seed=1234)


def instruct_source(engine: Engine, reward: str, max_reply: int, *, score: Callable[[Source], Source] | None = None,
                    measure: Callable[[list[Trajectory]], dict[str, float]] | None = None) -> Source:
    """The instruct gym's episodes with this engine's model (one reply each: up to `max_reply` tokens at temperature
    1, each token drawn as torch.multinomial draws it), as a source (`trajtune.sources.build.episode_source`;
    `score`: the run's graders around them, `measure`: its counts). Every draw from one generator, not sharded."""
    sampling = SamplingConfig(max_new_tokens=max_reply, draw="race", share_prompts=False)
    return episode_source(sampling, engine, lambda: instruct_env(reward), renderer(), "instruct", max_turns=1,
                          max_tokens=MAX_LEN, score=score, measure=measure, episode_seeds=False, sharded=False)


def adherence(engine: Engine, words, n: int, seed: int, max_reply: int) -> dict:
    """Sample n replies per word: share starting with the word, with its first letter, how many replies; examples."""
    trajs = sample_episodes(instruct_source(engine, "format", max_reply), [InstructTask(w) for w in words], n, seed)
    return {"word": sum(t.info["format_ok"] for t in trajs) / len(trajs), "n": len(trajs),
            "letter": sum(t.info["first_letter_ok"] for t in trajs) / len(trajs),
            "examples": [f"{t.info['word']} -> {t.info['reply']!r}" for t in trajs[::n][:4]]}


def evaluate_instruct(engine: Engine, config, windows) -> dict:
    """B1/B2 numbers for one model: seen/unseen adherence, first letter (and how many replies each share counts),
    val loss (and each held-out window's, for a paired comparison)."""
    tok = corpus()[0]
    seen = adherence(engine, SEEN, config.adherence_samples, derive(config.seed, 1, stride=7919), config.max_reply)
    unseen = adherence(engine, UNSEEN, config.adherence_samples, derive(config.seed, 2, stride=7919), config.max_reply)
    losses = window_losses(engine, windows, tok.pad_id)
    return {"seen": seen["word"], "seen_letter": seen["letter"], "unseen": unseen["word"],
            "unseen_letter": unseen["letter"], "n_seen": seen["n"], "n_unseen": unseen["n"],
            "val_loss": sum(losses) / len(losses), "window_losses": [round(x, 5) for x in losses],
            "examples": seen["examples"][:2] + unseen["examples"][:2]}


# --- stages ---------------------------------------------------------------------------------

PRETRAIN_READS = ("seed", "dim", "n_layers", "n_heads", "block_size", "val_windows", "pretrain", "pretrain_optim",
                  "adherence_samples", "max_reply")
"""the config fields `stage_pretrain` reads (`Stage.reads`)"""
SFT_READS = ("seed", "block_size", "val_windows", "sft", "sft_optim", "adherence_samples", "max_reply")
"""the config fields `stage_sft` reads"""


def stage_pretrain(ctx) -> dict:
    """B1: pretrain the base model on raw Shakespeare; it continues text but ignores the format."""
    config = ctx.config
    tok, train_ids, _, _ = corpus()
    torch.manual_seed(config.seed)
    model = TinyTransformer(TinyConfig(tok.vocab_size, config.dim, config.n_layers, config.n_heads, max_len=MAX_LEN))
    engine = ctx.engine(model, config.pretrain_optim)
    windows = text_windows(train_ids, config.pretrain.steps * config.pretrain.batch_size, config.block_size,
                           config.seed)
    held_out = val_windows(config)
    history = train_sft(engine, windows, config.pretrain, tok.pad_id,
                        ctx.run(lambda step: {"eval/loss": corpus_loss(engine, held_out, tok.pad_id)}))
    ctx.save_model(model, tok, "model", meta={"stage": ctx.name})
    result = evaluate_instruct(engine, config, held_out)
    result.update(params=model.num_parameters(),
                  curve=[(r["step"], r["eval/loss"]) for r in history if "eval/loss" in r])
    return result


def stage_sft(ctx, which: str) -> dict:
    """B2: SFT the base model on the narrow or broad demonstration set (same size, seed batches)."""
    config = ctx.config
    tok, _, _, demos = corpus()
    narrow, broad = demo_sets(demos, seed=1)
    data = narrow if which == "narrow" else broad
    r = renderer()
    model, _ = load_model(ctx.run_dir / "pretrain" / "model")
    engine = ctx.engine(model, config.sft_optim)
    trajs = [demo(r, task, reply) for task, reply in data]
    train_sft(engine, trajs, config.sft, tok.pad_id, ctx.run())
    ctx.save_model(model, tok, "model", meta={"stage": ctx.name})
    result = evaluate_instruct(engine, config, val_windows(config))
    result.update(n_demos=len(data), n_words=len({t.word for t, _ in data}))
    return result
