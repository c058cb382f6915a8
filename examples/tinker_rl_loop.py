"""tinker-cookbook's RL loop (`recipes/rl_loop.py`), re-stated with the `tinker` client alone: run it against any
Tinker server, trajtune's by default.

    trajtune tinker-serve --home runs/tinker --port 8000 &             # in another shell (docs/tinker.md)
    TINKER_API_KEY=tml-local python examples/tinker_rl_loop.py        # tiny-llama, task sevens, 30 steps: ~10 s
    python examples/tinker_rl_loop.py --home runs/tinker              # in-process: the same client objects, no HTTP
    python examples/tinker_rl_loop.py --model smollm2-135m --task add --steps 8 --lr 1e-4

The call sequence is rl_loop's, call for call. Per step: save_weights_and_get_sampling_client(); one
`sample(prompt, num_samples=group_size, SamplingParams(max_tokens, stop))` per prompt, all submitted before the
first result is awaited; a reward per sampled sequence; advantages = reward - the group's mean, and a group whose
advantages are all 0 is skipped; one datum per sequence: model_input = prompt + sampled[:-1], target_tokens =
[0] * (P - 1) + sampled, logprobs = [0.0] * (P - 1) + the sampler's logprobs, advantages = [0.0] * (P - 1) + [A] *
len(sampled); forward_backward(datums, "importance_sampling"), then optim_step(AdamParams(lr, 0.9, 0.95, 1e-8)),
then both results. At the end save_state("final") and save_weights_for_sampler("final"). The prompts are rendered
with the model's chat template and sampling stops at its end-of-turn token; samples are drawn at temperature 1,
where the sampler's log-probs and the learner's are the same distribution's.

Two tasks replace rl_loop's GSM8K (which a tiny model scores 0 on, so every group would be skipped):

- `sevens` (for a tiny random model): "Write the digit 7 n times."; reward = the share of the `max_tokens`
  positions that hold the token "7" (so 1.0 is max_tokens sevens). A random 398-token model starts near 0.
- `add` (for the real model): "What is a+b? Answer with the number only." (a, b in 1..9); reward 1 when the last
  integer in the reply is a+b, else 0 (the usual lenient last-number grading of math answers).

It also measures what rl_loop does not: the mean reward on fixed evaluation prompts, sampled with fixed seeds,
before and after. Verdict: PASS when that evaluation reward rose; the numbers measured with it are in docs/tinker.md.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time
from dataclasses import dataclass

import numpy as np
import tinker
from tinker import types

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
TASKS = ("sevens", "add")


@dataclass
class Settings:
    base_url: str = os.environ.get("TINKER_BASE_URL", DEFAULT_BASE_URL)
    """the Tinker server (TINKER_BASE_URL, else trajtune tinker-serve's default address)"""
    home: str = ""
    """in-process: a trajtune tinker home (no server, no HTTP); overrides --base-url"""
    model: str = "tiny-llama"
    """base_model: trajtune's tiny-llama / tiny-qwen2 / smollm2-135m, or a local HF folder"""
    task: str = "sevens"
    """sevens (a tiny random model can learn it) or add (one-digit sums, for the real model)"""
    rank: int = 32
    """LoRA rank (rl_loop's default 32; 0: full fine-tune on trajtune)"""
    steps: int = 30
    """RL steps"""
    batch_size: int = 8
    """prompts per step"""
    group_size: int = 8
    """samples per prompt"""
    max_tokens: int = 8
    """sampled tokens per reply at most"""
    lr: float = 3e-3
    """learning rate (constant, as rl_loop's)"""
    n_eval: int = 8
    """evaluation prompts, each sampled group_size times before and after"""
    seed: int = 0
    """the prompts, the sampling seeds and the LoRA initialisation"""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"--task {self.task!r}: not one of {', '.join(TASKS)}")
        for name in ("steps", "batch_size", "group_size", "max_tokens", "n_eval"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: needs at least 1")
        if self.group_size < 2:
            raise ValueError(f"--group-size {self.group_size}: needs 2 or more (advantages are reward - group mean)")
        if self.rank < 0:
            raise ValueError(f"--rank {self.rank}: needs 0 (full fine-tune) or more")
        if not self.lr > 0:
            raise ValueError(f"--lr {self.lr}: needs a positive learning rate")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int  # sevens: n (unused by the reward); add: a + b


def problem(task: str, rng: random.Random) -> Problem:
    if task == "sevens":
        n = rng.randint(2, 9)
        return Problem(f"Write the digit 7 {n} times.", n)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return Problem(f"What is {a}+{b}? Answer with the number only.", a + b)


class Grader:
    """reward(problem, sampled tokens) for a task (module docstring)."""

    def __init__(self, task: str, tokenizer, max_tokens: int):
        self.task, self.tokenizer, self.max_tokens = task, tokenizer, max_tokens
        self.stop = tokenizer.eos_token_id
        if task == "sevens":
            seven = tokenizer.encode("7", add_special_tokens=False)
            if len(seven) != 1:
                raise ValueError(f"--task sevens needs '7' to be one token; this tokenizer makes it {seven}")
            self.seven = seven[0]

    def __call__(self, p: Problem, tokens: list[int]) -> float:
        if self.task == "sevens":
            return sum(t == self.seven for t in tokens) / self.max_tokens
        text = self.tokenizer.decode([t for t in tokens if t != self.stop], skip_special_tokens=True)
        numbers = re.findall(r"-?\d+", text)
        return 1.0 if numbers and int(numbers[-1]) == p.answer else 0.0


def prompt_input(tokenizer, p: Problem) -> types.ModelInput:
    out = tokenizer.apply_chat_template([{"role": "user", "content": p.question}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return types.ModelInput.from_ints(list(out["input_ids"] if isinstance(out, dict) else out))


def rl_datum(prompt: types.ModelInput, tokens: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    """rl_loop's datum: shapes (N,), N = P - 1 + len(tokens); position t predicts target_tokens[t]."""
    ob_len = prompt.length - 1
    model_input = prompt.append(types.EncodedTextChunk(tokens=tokens[:-1]))
    arrays = {"target_tokens": np.array([0] * ob_len + tokens, np.int64),
              "logprobs": np.array([0.0] * ob_len + logprobs, np.float32),
              "advantages": np.array([0.0] * ob_len + [advantage] * (model_input.length - ob_len), np.float32)}
    assert all(len(a) == model_input.length for a in arrays.values())
    return types.Datum(model_input=model_input,
                       loss_fn_inputs={k: types.TensorData.from_numpy(v) for k, v in arrays.items()})


def connect(s: Settings):
    """A tinker.ServiceClient: trajtune in-process where --home is given, else over HTTP to --base-url."""
    if s.home:
        from trajtune.tinker.local import service_client

        return service_client(s.home)
    return tinker.ServiceClient(base_url=s.base_url, api_key=os.environ.get("TINKER_API_KEY", "tml-local"))


def main(s: Settings, service_client=None, verbose: bool = True) -> dict:
    service_client = service_client or connect(s)
    training_client = service_client.create_lora_training_client(base_model=s.model, rank=s.rank,
                                                                 seed=s.seed).result()
    tokenizer = training_client.get_tokenizer()
    grade = Grader(s.task, tokenizer, s.max_tokens)
    adam = types.AdamParams(learning_rate=s.lr, beta1=0.9, beta2=0.95, eps=1e-8)
    rng = random.Random(s.seed)
    eval_problems = [problem(s.task, random.Random(10_000 + i)) for i in range(s.n_eval)]

    def params(seed: int) -> types.SamplingParams:
        return types.SamplingParams(max_tokens=s.max_tokens, stop=[grade.stop], temperature=1.0, seed=seed)

    def evaluate(sampling_client) -> float:
        futures = [sampling_client.sample(prompt=prompt_input(tokenizer, p), num_samples=s.group_size,
                                          sampling_params=params(1_000_000 + i))
                   for i, p in enumerate(eval_problems)]
        rewards = [grade(p, list(seq.tokens)) for p, f in zip(eval_problems, futures) for seq in f.result().sequences]
        return sum(rewards) / len(rewards)

    history = []
    start = time.perf_counter()
    for step in range(s.steps):
        t0 = time.perf_counter()
        sampling_client = training_client.save_weights_and_get_sampling_client().result()
        if step == 0:
            before = evaluate(sampling_client)
            t0 = time.perf_counter()
        problems = [problem(s.task, rng) for _ in range(s.batch_size)]
        prompts = [prompt_input(tokenizer, p) for p in problems]
        futures = [sampling_client.sample(prompt=prompt, num_samples=s.group_size,
                                          sampling_params=params(s.seed * 100_003 + step * s.batch_size + i))
                   for i, prompt in enumerate(prompts)]
        datums, group_rewards = [], []
        for future, prompt, p in zip(futures, prompts, problems):
            sequences = future.result().sequences
            rewards = [grade(p, list(seq.tokens)) for seq in sequences]
            mean = sum(rewards) / len(rewards)
            group_rewards.append(mean)
            advantages = [r - mean for r in rewards]
            if all(a == 0.0 for a in advantages):
                continue  # rl_loop: no signal in this group
            for seq, advantage in zip(sequences, advantages):
                assert seq.logprobs is not None
                datums.append(rl_datum(prompt, list(seq.tokens), list(seq.logprobs), advantage))
        row = {"step": step, "reward": sum(group_rewards) / len(group_rewards), "datums": len(datums)}
        if datums:
            fb = training_client.forward_backward(datums, loss_fn="importance_sampling")
            op = training_client.optim_step(adam)
            row["loss:sum"] = fb.result().metrics.get("loss:sum")
            row.update(op.result().metrics or {})
        row["time"] = time.perf_counter() - t0
        history.append(row)
        if verbose:
            print(f"step {step:3d}  reward {row['reward']:.3f}  datums {row['datums']:3d}  {row['time']:.2f}s",
                  flush=True)
    seconds = sum(row["time"] for row in history)
    after = evaluate(training_client.save_weights_and_get_sampling_client().result())
    state = training_client.save_state("final").result().path
    sampler = training_client.save_weights_for_sampler("final").result().path
    passed = after > before
    if verbose:
        quarter = max(1, s.steps // 4)
        first = sum(r["reward"] for r in history[:quarter]) / quarter
        last = sum(r["reward"] for r in history[-quarter:]) / quarter
        print(f"eval reward {before:.3f} -> {after:.3f} ({s.n_eval} prompts x {s.group_size}); train reward "
              f"{first:.3f} (first {quarter} steps) -> {last:.3f} (last {quarter}); {s.steps / seconds:.3f} steps/s; "
              f"saved {state} and {sampler}")
        print("PASS: the reward rose" if passed else "FAIL: the reward did not rise")
    return {"before": before, "after": after, "history": history, "steps_per_s": s.steps / seconds,
            "seconds": time.perf_counter() - start, "state_path": state, "sampler_path": sampler, "passed": passed}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Settings()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    try:  # every value checked before any work: a bad one is one line naming it, not a traceback
        settings = Settings(**vars(p.parse_args()))
    except ValueError as e:
        p.error(str(e))
    raise SystemExit(0 if main(settings)["passed"] else 1)
