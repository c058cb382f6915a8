"""Your own single-turn task, end to end: teach the built-in tiny model to reverse strings with GRPO.

    python examples/reverse_string.py              # ~8 CPU-s; prints held-out reward before -> after
    python examples/reverse_string.py --steps 20   # shorter

The task is written only through the public Env API (trajtune/envs/base.py): a task type with
`.name` and `.prompt`, and a verifier, turned into an environment by `SingleTurnEnv`. The model is
a randomly initialised TinyTransformer, so it starts near chance; reward is partial credit (the
share of positions right), so GRPO has a signal from the first step. docs/environments.md walks
through it.

Measured with `python examples/reverse_string.py` (seed 0, 100 steps, the "start here" settings: GRPO,
learning rate 2e-3) on 2026-12-04 on an idle 2-core Intel Xeon VM: held-out mean reward 0.02 -> 0.26 in
5 s wall (8 CPU-s; 0.22 on 2026-12-01's AMD EPYC VM, whose float rounding differs); exact match (pass@1)
stays 0.00: in 100 steps from a random init the model learns the answer's length and some positions, not
yet whole strings.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

import torch

from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.sources.episodes import EpisodeSource
from trajtune.sources.sampler import Decoder, SamplerSettings
from trajtune.engine import OptimConfig, make_engine
from trajtune.envs.base import SingleTurnEnv
from trajtune.evaluation import score_policy
from trajtune.runs.loop import Run
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer

LETTERS = "abcd"
LENGTHS = (2, 3, 4)


# --- 1. the task: a frozen dataclass with the two attributes SingleTurnEnv reads ------------
@dataclass(frozen=True)
class ReverseTask:
    text: str

    @property
    def name(self) -> str:  # logs, info["task"], the per-task table
        return self.text

    @property
    def prompt(self) -> str:  # the user message
        return f"reverse {self.text}"


def make_tasks(n_held_out: int, seed: int, letters: str = LETTERS, lengths=LENGTHS) -> tuple[list, list]:
    """(train, held_out): every string of the given lengths over `letters`, shuffled by `seed`;
    the first `n_held_out` are held out (never trained on)."""
    texts = [""]
    for _ in range(max(lengths)):
        texts += [t + c for t in texts if len(t) == max(len(x) for x in texts) for c in letters]
    tasks = [ReverseTask(t) for t in texts if len(t) in lengths]
    random.Random(seed).shuffle(tasks)
    return tasks[n_held_out:], tasks[:n_held_out]


# --- 2. the verifier: (task, reply) -> (reward, checks for info) -----------------------------
def score_reversal(task: ReverseTask, reply: str) -> tuple[float, dict]:
    """Share of positions right (divided by the longer of reply and answer): 1.0 iff exact."""
    target = task.text[::-1]
    right = sum(a == b for a, b in zip(reply, target))
    return right / max(len(reply), len(target)), {"exact": reply == target, "reply": reply}


def reverse_env() -> SingleTurnEnv:
    return SingleTurnEnv(score_reversal)


# --- 3. the "start here" settings ------------------------------------------------------------
@dataclass
class Settings:
    steps: int = 100
    """RL steps"""
    lr: float = 2e-3
    """learning rate: the start-here value (OptimConfig's default is 1e-3)"""
    advantage: str = "grpo"
    """'grpo' ((R - mean) / std over the group): the start-here value (RLConfig's default is 'reinforce')"""
    seed: int = 0
    letters: str = LETTERS
    """the alphabet of the strings"""
    min_length: int = min(LENGTHS)
    """strings have min_length .. max_length letters"""
    max_length: int = max(LENGTHS)
    """the longest string"""
    group_size: int = 8
    """episodes per task in a step (8 tasks per step)"""
    n_eval: int = 64
    """held-out strings (the rest of all strings of those lengths are the training tasks)"""
    eval_samples: int = 4
    """episodes per held-out task (sampled at temperature 1)"""

    def __post_init__(self) -> None:  # the script's own values; the library's configs check theirs (`configs`)
        if not self.letters or len(set(self.letters)) != len(self.letters):
            raise ValueError(f"--letters {self.letters!r}: needs one or more distinct letters")
        if not 1 <= self.min_length <= self.max_length <= MAX_LENGTH:
            raise ValueError(f"--min-length {self.min_length} --max-length {self.max_length}: needs 1 <= min <= max "
                             f"<= {MAX_LENGTH} (a longer prompt and reply do not fit the model's {MAX_TOKENS} "
                             "positions)")
        strings = sum(len(self.letters) ** n for n in range(self.min_length, self.max_length + 1))
        if not 1 <= self.n_eval < strings:
            raise ValueError(f"--n-eval {self.n_eval}: needs 1 <= n-eval < {strings}, the strings of those lengths "
                             "(the rest are the training tasks)")
        if self.eval_samples < 1:
            raise ValueError(f"--eval-samples {self.eval_samples}: needs at least 1 episode per held-out string")


MAX_TOKENS = 32
"""the model's positions: the prompt ("reverse " + the string, 4 tokens of template) and the reply (the
reversed string and the end token) must fit"""
MAX_LENGTH = 9
"""the longest string that fits MAX_TOKENS: 8 + n + 4 + n + 1 <= 32"""


def configs(s: Settings) -> tuple[OptimConfig, RLConfig]:
    """The library's configs of these settings; each checks its values as it is built."""
    return OptimConfig(lr=s.lr), RLConfig(steps=s.steps, tasks_per_step=8, group_size=s.group_size,
                                          advantage=s.advantage, seed=s.seed, eval_every=max(s.steps // 5, 1))


def main(s: Settings, verbose: bool = True) -> dict:
    optim, config = configs(s)
    torch.manual_seed(s.seed)
    tok = CharTokenizer.from_corpus(s.letters + "reverse ")
    renderer = Renderer(tok)
    model = TinyTransformer(TinyConfig(tok.vocab_size, dim=64, n_layers=2, n_heads=4, max_len=MAX_TOKENS))
    engine = make_engine(model, optim)
    sampler = Decoder(engine.sample, SamplerSettings(max_new_tokens=s.max_length + 1))  # + 1: the end token
    source = EpisodeSource(sampler, reverse_env, renderer, max_turns=1, max_tokens=MAX_TOKENS)
    train, held_out = make_tasks(s.n_eval, s.seed, s.letters, tuple(range(s.min_length, s.max_length + 1)))

    def evaluate(step: int) -> dict:  # held-out mean reward and pass@1 (exact match), sampled at T=1
        return score_policy(source, held_out, n=s.eval_samples, ks=(1,), seed=1).metrics()

    before = score_policy(source, held_out, n=s.eval_samples, seed=1)
    history = train_rl(engine, train, source, config, tok.pad_id, Run("rl", evaluate=evaluate))
    after = score_policy(source, held_out, n=s.eval_samples, seed=1)
    if verbose:
        for row in history:
            if "eval/reward" in row:
                print(f"step {row['step']:4d}  train reward {row['rollout/reward']:.3f}  "
                      f"held-out reward {row['eval/reward']:.3f}  pass@1 {row['eval/pass@1']:.3f}")
        print(after.table(max_rows=8))
        print(f"held-out mean reward {before.mean_reward:.2f} -> {after.mean_reward:.2f}, "
              f"exact match {before.pass_at[1]:.2f} -> {after.pass_at[1]:.2f}  (measured with this script's "
              f"defaults, seed 0, on a 2-core Intel Xeon: 0.02 -> 0.26 and 0.00 -> 0.00)")
    return {"before": before, "after": after, "history": history}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Settings()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    try:  # every value checked before any work: a bad one is one line naming it, not a traceback
        settings = Settings(**vars(p.parse_args()))
        configs(settings)
    except ValueError as e:
        p.error(str(e))
    main(settings)
