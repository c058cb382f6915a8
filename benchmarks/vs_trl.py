"""Speed race: trajtune vs TRL, seconds per optimizer step, same models / data / batch shapes, CPU fp32.

    pip install -e '.[hf,bench]'
    python benchmarks/vs_trl.py                       # tiny and small random Llama, SFT / DPO / GRPO
    python benchmarks/vs_trl.py --sizes tiny --steps 4

Both libraries run in this one process, alternating (trajtune, TRL, trajtune, TRL
...), so background load hits both alike. A step's time is the interval between
consecutive optimizer steps (setup, data preparation and the first step are
excluded); the table shows the median over `--steps` steps and `--repeats` runs.

Workloads (per optimizer step):
  SFT   8 conversations (~40 tokens)
  DPO   8 preference pairs
  GRPO  8 prompts x 8 completions, 8 new tokens, 1 update per generation batch, no KL
Models: random Llama built from a config with a locally trained tokenizer (no downloads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

N_ROWS, BATCH, PROMPTS, GROUP, NEW_TOKENS = 64, 8, 8, 8, 8


def write_data(d: Path) -> None:
    with open(d / "sft.jsonl", "w") as f:
        for i in range(N_ROWS):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"what is {i} + 5? answer with the number."},
                                             {"role": "assistant", "content": f"the answer is {i + 5}."}]}) + "\n")
    with open(d / "dpo.jsonl", "w") as f:
        for i in range(N_ROWS):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i} + 5?"}],
                                "chosen": [{"role": "assistant", "content": f"the answer is {i + 5}."}],
                                "rejected": [{"role": "assistant", "content": "hello world, the cat sat."}]}) + "\n")
    with open(d / "grpo.jsonl", "w") as f:
        for i in range(N_ROWS):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i} + 5?"}], "answer": str(i + 5)}) + "\n")


def reward_fn(prompts, completions, answer=None, **kw):
    return [float(a in (c if isinstance(c, str) else c[-1]["content"])) for c, a in zip(completions, answer)]


class StepClock:
    """Timestamps of optimizer steps -> intervals (the first interval is dropped: warm-up)."""

    def __init__(self):
        self.t: list[float] = []

    def tick(self):
        self.t.append(time.perf_counter())

    def intervals(self):
        return [b - a for a, b in zip(self.t[1:], self.t[2:])]


# --- trajtune ------------------------------------------------------------------------------------------
def run_trajtune(kind: str, model_dir: Path, d: Path, steps: int) -> list[float]:
    from trajtune import data as D
    from trajtune.algorithms.dpo import DPOConfig, train_dpo
    from trajtune.algorithms.rl import RLConfig, train_rl
    from trajtune.algorithms.sft import SFTConfig, train_sft
    from trajtune.engine import OptimConfig, make_engine
    from trajtune.envs.base import SingleTurnEnv
    from trajtune.models.hf import load_policy, load_tokenizer
    from trajtune.collect import make_collect
    from trajtune.rewards import reward_verifier
    from trajtune.text.chat import ChatRenderer

    torch.manual_seed(0)
    tok = load_tokenizer(model_dir)
    r = ChatRenderer(tok)
    engine = make_engine(load_policy(model_dir), OptimConfig(lr=1e-5, grad_clip=1.0))
    clock = StepClock()
    step = engine.optim_step

    def timed_step():
        out = step()
        clock.tick()
        return out

    engine.optim_step = timed_step
    clock.tick()
    n = steps + 1
    if kind == "SFT":
        trajs = D.sft_trajectories(D.read_rows(d / "sft.jsonl"), r)
        train_sft(engine, trajs, SFTConfig(steps=n, batch_size=BATCH), r.pad_id)
    elif kind == "DPO":
        pairs = D.preference_pairs(D.read_rows(d / "dpo.jsonl"), r)
        train_dpo(engine, pairs, DPOConfig(steps=n, batch_size=BATCH, beta=0.1), r.pad_id)
    else:
        tasks = D.prompt_tasks(D.read_rows(d / "grpo.jsonl"))
        collect = make_collect(engine.sample, lambda: SingleTurnEnv(reward_verifier(reward_fn)), r,
                               max_turns=1, max_tokens=512, max_action_tokens=NEW_TOKENS)
        train_rl(engine, tasks, collect, RLConfig(steps=n, tasks_per_step=PROMPTS, group_size=GROUP, advantage="grpo",
                                                   aggregation="sequence"), r.pad_id)
    return clock.intervals()


# --- TRL ------------------------------------------------------------------------------------------------
def run_trl(kind: str, model_dir: Path, d: Path, steps: int, out: Path) -> list[float]:
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    clock = StepClock()

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            clock.tick()

        def on_step_end(self, *a, **k):
            clock.tick()

    common = dict(output_dir=str(out), max_steps=steps + 1, learning_rate=1e-5, max_grad_norm=1.0, report_to="none",
                  logging_strategy="no", save_strategy="no", use_cpu=True, bf16=False, fp16=False,
                  dataloader_num_workers=0, seed=0, disable_tqdm=True, lr_scheduler_type="constant",
                  warmup_steps=0, adam_beta2=0.95, weight_decay=0.0)
    if kind == "SFT":
        from trl import SFTConfig, SFTTrainer

        ds = load_dataset("json", data_files=str(d / "sft.jsonl"), split="train")
        cfg = SFTConfig(per_device_train_batch_size=BATCH, max_length=512, **common)
        trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Clock()])
    elif kind == "DPO":
        from trl import DPOConfig, DPOTrainer

        ds = load_dataset("json", data_files=str(d / "dpo.jsonl"), split="train")
        cfg = DPOConfig(per_device_train_batch_size=BATCH, beta=0.1, max_length=512, **common)
        trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Clock()])
    else:
        from trl import GRPOConfig, GRPOTrainer

        ds = load_dataset("json", data_files=str(d / "grpo.jsonl"), split="train")
        cfg = GRPOConfig(per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
                         max_completion_length=NEW_TOKENS, gradient_accumulation_steps=1, beta=0.0,
                         temperature=1.0, **common)
        trainer = GRPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, reward_funcs=reward_fn,
                              callbacks=[Clock()])
    trainer.train()
    return clock.intervals()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--kinds", nargs="+", default=["SFT", "DPO", "GRPO"])
    ap.add_argument("--steps", type=int, default=5, help="timed optimizer steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per library")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from trajtune.models.hf_random import make_random_model
    from trajtune.models.hf import load_policy

    import trl
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"{torch.get_num_threads()} threads, CPU fp32", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_data(d)
        for size in args.sizes:
            model_dir = make_random_model(d / size, "llama", size)
            n_params = load_policy(model_dir).num_parameters()
            for kind in args.kinds:
                ours, theirs = [], []
                for rep in range(args.repeats):
                    ours += run_trajtune(kind, model_dir, d, args.steps)
                    theirs += run_trl(kind, model_dir, d, args.steps, d / f"trl-{size}-{kind}-{rep}")
                a, b = statistics.median(ours), statistics.median(theirs)
                rows.append((f"{size} ({n_params / 1e6:.2f}M)", kind, a, b))
                print(f"{size:<6} {kind:<5} trajtune {a:.3f}s  TRL {b:.3f}s  ratio {a / b:.2f}", flush=True)
    print("\n| model | method | trajtune s/step | TRL s/step | trajtune / TRL |\n|---|---|---|---|---|")
    for m, k, a, b in rows:
        print(f"| {m} | {k} | {a:.3f} | {b:.3f} | {a / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
