"""tinker-cookbook's supervised loop (`recipes/sl_loop.py`), re-stated with the `tinker` client alone, on a small
local dataset: run it against any Tinker server, trajtune's by default.

    trajtune tinker-serve --home runs/tinker --port 8000 &             # in another shell (docs/tinker.md)
    TINKER_API_KEY=tml-local python examples/tinker_sl_loop.py        # tiny-llama, 30 steps: a few seconds
    python examples/tinker_sl_loop.py --home runs/tinker              # in-process: the same client objects, no HTTP
    python examples/tinker_sl_loop.py --model smollm2-135m --steps 8 --rank 32 --lr 1e-4

The call sequence is sl_loop's, call for call: create_lora_training_client(base_model, rank); per step
forward_backward(batch, "cross_entropy"), then optim_step(AdamParams(lr * (1 - step / steps), 0.9, 0.95, 1e-8))
submitted before either result is awaited; the mean NLL from the returned `logprobs` and the datums' `weights`;
at the end save_state("final") and save_weights_for_sampler("final"). The data replaces sl_loop's
HuggingFaceH4/no_robots: chat rows "What is a+b? Answer with the number only." -> "a+b" (a, b in 1..9), rendered
with the model's own chat template (`training_client.get_tokenizer()`), weights on the answer's tokens only, each
row's weights summing to 1 (the cookbook's `conversation_to_datum` default). It also measures what sl_loop does
not: the NLL of held-out rows (never trained on) through `forward`, before and after.

Verdict: PASS when the held-out NLL falls (after < before); the numbers measured with it are in docs/tinker.md.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import tinker
from tinker import types

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


@dataclass
class Settings:
    base_url: str = os.environ.get("TINKER_BASE_URL", DEFAULT_BASE_URL)
    """the Tinker server (TINKER_BASE_URL, else trajtune tinker-serve's default address)"""
    home: str = ""
    """in-process: a trajtune tinker home (no server, no HTTP); overrides --base-url"""
    model: str = "tiny-llama"
    """base_model: trajtune's tiny-llama / tiny-qwen2 / smollm2-135m, or a local HF folder"""
    rank: int = 32
    """LoRA rank (sl_loop's default 32; 0: full fine-tune on trajtune)"""
    steps: int = 30
    """optimizer steps (one batch each)"""
    batch_size: int = 8
    """conversations per step"""
    lr: float = 2e-3
    """peak learning rate, decayed linearly to 0 over the steps as sl_loop does"""
    n_eval: int = 16
    """held-out rows scored before and after"""
    seed: int = 0
    """the data's order and the LoRA initialisation"""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "n_eval"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: needs at least 1")
        if self.rank < 0:
            raise ValueError(f"--rank {self.rank}: needs 0 (full fine-tune) or more")
        if not self.lr > 0:
            raise ValueError(f"--lr {self.lr}: needs a positive learning rate")
        if self.n_eval >= len(PROBLEMS):
            raise ValueError(f"--n-eval {self.n_eval}: needs fewer than the {len(PROBLEMS)} problems")


PROBLEMS = [(a, b) for a in range(1, 10) for b in range(1, 10)]


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}? Answer with the number only."


def split(n_eval: int, seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, held_out): the 81 problems shuffled by Random(seed); the first n_eval are held out."""
    problems = list(PROBLEMS)
    random.Random(seed).shuffle(problems)
    return problems[n_eval:], problems[:n_eval]


def chat_tokens(tokenizer, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True,
                                        return_dict=False)
    return list(out["input_ids"] if isinstance(out, dict) else out)


def datum(tokenizer, a: int, b: int) -> types.Datum:
    """One row as sl_loop's conversation_to_datum makes it: model_input x = tokens[:-1], target y = tokens[1:]
    (position t predicts y[t] = tokens[t+1]), weights 1/k on the k answer tokens (the assistant turn), 0 on the
    prompt."""
    user = {"role": "user", "content": question(a, b)}
    prompt = chat_tokens(tokenizer, [user], generation_prompt=True)
    full = chat_tokens(tokenizer, [user, {"role": "assistant", "content": str(a + b)}])
    if full[:len(prompt)] != prompt:
        raise ValueError("the chat template does not extend the generation prompt with the answer; "
                         "this example needs a template that does")
    weights = np.zeros(len(full) - 1, np.float32)
    weights[len(prompt) - 1:] = 1.0 / (len(full) - len(prompt))
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(np.array(full[1:], np.int64)),
                                       "weights": types.TensorData.from_numpy(weights)})


def mean_nll(result: types.ForwardBackwardOutput, batch: list[types.Datum]) -> float:
    """-sum(logprobs * weights) / sum(weights) over the batch (the cookbook's compute_mean_nll)."""
    num = den = 0.0
    for out, d in zip(result.loss_fn_outputs, batch):
        w = d.loss_fn_inputs["weights"].to_numpy()
        num += float(np.dot(out["logprobs"].to_numpy(), w))
        den += float(w.sum())
    return -num / den


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
    train, held_out = split(s.n_eval, s.seed)
    eval_batch = [datum(tokenizer, a, b) for a, b in held_out]
    order = random.Random(s.seed + 1)

    def held_out_nll() -> float:
        return mean_nll(training_client.forward(eval_batch, "cross_entropy").result(), eval_batch)

    before = held_out_nll()
    history = []
    start = time.perf_counter()
    for step in range(s.steps):
        t0 = time.perf_counter()
        batch = [datum(tokenizer, a, b) for a, b in order.choices(train, k=s.batch_size)]
        lr = s.lr * max(0.0, 1.0 - step / s.steps)
        fb = training_client.forward_backward(batch, loss_fn="cross_entropy")
        op = training_client.optim_step(types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8))
        fb_result, op_result = fb.result(), op.result()
        row = {"step": step, "train_mean_nll": mean_nll(fb_result, batch), "learning_rate": lr,
               "loss:sum": fb_result.metrics.get("loss:sum"), "time": time.perf_counter() - t0,
               **(op_result.metrics or {})}
        history.append(row)
        if verbose:
            print(f"step {step:3d}  train NLL {row['train_mean_nll']:.3f}  lr {lr:.2e}  {row['time']:.2f}s",
                  flush=True)
    seconds = time.perf_counter() - start
    after = held_out_nll()
    state = training_client.save_state("final").result().path
    sampler = training_client.save_weights_for_sampler("final").result().path
    passed = after < before
    if verbose:
        print(f"held-out NLL {before:.3f} -> {after:.3f} ({s.n_eval} rows); train NLL "
              f"{history[0]['train_mean_nll']:.3f} -> {history[-1]['train_mean_nll']:.3f}; "
              f"{s.steps / seconds:.2f} steps/s; saved {state} and {sampler}")
        print("PASS: the held-out loss fell" if passed else "FAIL: the held-out loss did not fall")
    return {"before": before, "after": after, "history": history, "steps_per_s": s.steps / seconds,
            "state_path": state, "sampler_path": sampler, "passed": passed}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Settings()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    try:  # every value checked before any work: a bad one is one line naming it, not a traceback
        settings = Settings(**vars(p.parse_args()))
    except ValueError as e:
        p.error(str(e))
    raise SystemExit(0 if main(settings)["passed"] else 1)
