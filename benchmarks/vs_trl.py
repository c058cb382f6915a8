"""Speed race: trajtune vs TRL, seconds per optimizer step, same models / data / batch shapes, CPU fp32.

    pip install -e '.[hf,bench]'
    python benchmarks/vs_trl.py                       # tiny and small random Llama, SFT / DPO / GRPO
    python benchmarks/vs_trl.py --sizes tiny --steps 4
    python benchmarks/vs_trl.py --flops               # + the FLOP-bound row (a 20M Llama; ~6 min more)
    python benchmarks/vs_trl.py --kinds SFT DPO --profile          # + where each library's step goes
    python benchmarks/vs_trl.py --kinds SFT DPO --trl-same-math    # TRL without the work trajtune skips
    python benchmarks/vs_trl.py --all-positions       # + trajtune with the output layer at every position

Both libraries run in this one process, alternating (trajtune, TRL, trajtune, TRL
...), so background load hits both alike. A step's time is the interval between
consecutive optimizer steps (setup, data preparation and the first step are
excluded); the table shows the median over `--steps` steps and `--repeats` runs. `--clock cpu --threads 1`
times a step in this process's CPU seconds instead: what it takes on a core of its own, so another process
on the machine changes it little (the wall clock then measures the load as much as the code).

Workloads (per optimizer step):
  SFT   8 conversations (~40 tokens)
  DPO   8 preference pairs
  GRPO  8 prompts x 8 completions, 8 new tokens, 1 update per generation batch, no KL
Models: random Llama built from a config with a locally trained tokenizer (no downloads).

--flops adds the FLOP-bound row: a 20.5M-parameter Llama (hidden 384, 6 layers, MLP 1536, 6 heads,
vocabulary 16,384, tied head), SFT on 16 x 256 tokens and GRPO with 8 x 8 completions of 64 new tokens.
It prints the achieved FLOP/s as a share of this CPU's matmul peak, measured in the same run (the best of
10 fp32 2048 x 2048 matmuls at the run's thread count, before and after each method's runs). FLOPs counted:
N = the parameters of the matmuls (every Linear of the blocks plus the output layer; not the embedding
lookup, norms or attention scores), 6 N per trained token (forward + backward: every position of the
batch; trajtune runs this row with head_positions="all" and share_prefix=False, so the output layer runs at
every position and a GRPO group's prompt runs once per completion),
plus for GRPO 2 N per token the sampler runs forward (prompt + generated). Both libraries do the same work,
so trajtune / TRL is the ratio of the times. A last line times GRPO with trajtune's defaults (each group's prompt
once, the output layer at the completion's tokens only): less math than counted, so no share of peak.

--profile: wall-clock timers around the pieces both libraries share -- the decoder forward with gradient
(`LlamaModel.forward`), the decoder forward without it (TRL's per-step DPO reference), the LM head (trajtune's
`TokenHead`, TRL's fused head), the backward (`torch.autograd.backward`; TRL's recomputes the forward: gradient
checkpointing is on by default in its configs) and the optimizer (AdamW step + gradient clipping) -- printed per
library as ms / step; "own" is the rest: each library's per-step Python (collate, loss, metrics, hooks). From
those, `bound` = trajtune's shared pieces / TRL's whole step: the ratio an implementation doing trajtune's math
with zero overhead of its own would get. Both libraries step AdamW's fused kernel (`OptimConfig.fused`, the default
of trajtune's Hugging Face commands, as of TRL's).

trajtune runs with `make_engine(head_positions="actions")`: the output layer only at the positions the loss
reads (the completion's tokens; `logprobs.TokenHead.keep`), as TRL's GRPO does (`logits_to_keep`) and its SFT
and DPO do not. --all-positions adds a column: trajtune with head_positions="all" (every position of the batch,
prompt and padding included, through the output layer), in the same alternation, so one run shows both.

--draw race: trajtune's sampler draws each token as torch.multinomial does (TRL's generation too: an exponential
race, one random number per vocabulary entry and row, serial on a CPU: ~33 ms per token for 64 completions over
the FLOP row's 16,384 entries); by default it draws by inverse CDF (one per row; the default of `trajtune grpo`).

--no-share-prefix: trajtune runs each DPO pair's and GRPO group's prompt once per completion, as TRL does;
by default the engine runs it once (`logprobs.SharedPrefix`: the same log-probs to float rounding), and
GRPO's sampler prefills it once per group (`sample(share_prompts=True)`, the default of `trajtune grpo`).

--trl-same-math: TRL configured to do no more math than trajtune: gradient_checkpointing=False (the backward
recomputes nothing) and, for DPO, precompute_ref_log_probs=True (the reference log-probs once, before the first
step, as trajtune computes them once per pair set; TRL's default runs the reference forward every step).
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
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL posts usage telemetry from a thread
warnings.filterwarnings("ignore")

import torch  # noqa: E402

N_ROWS = 64


@dataclass(frozen=True)
class Workload:
    """Shapes of one optimizer step (the same for both libraries)."""

    batch: int = 8
    """SFT conversations / DPO pairs per step"""
    prompts: int = 8
    """GRPO prompts per step"""
    group: int = 8
    """GRPO completions per prompt"""
    new_tokens: int = 8
    """GRPO tokens sampled per completion"""
    repeat: int = 1
    """SFT answers repeat their sentence this many times (longer sequences)"""
    max_length: int = 512
    """TRL's max_length (and the model's context)"""


DEFAULT = Workload()
FLOPS = Workload(batch=16, prompts=8, group=8, new_tokens=64, repeat=0)  # SFT rows of exactly 256 tokens (write_data)
FLOP_MODEL = dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6,
                  num_key_value_heads=6)
FLOP_VOCAB, FLOP_SFT_TOKENS = 16_384, 256


def write_data(d: Path, repeat: int = 1, tokenizer=None, sft_tokens: int = 0) -> None:
    """sft.jsonl, dpo.jsonl, grpo.jsonl in `d`. sft_tokens > 0 (with `tokenizer`): every SFT conversation
    renders to exactly that many tokens (the answer padded with words, then cut), and so does each DPO
    prompt with its chosen and with its rejected answer."""
    with open(d / "sft.jsonl", "w") as f:
        for i in range(N_ROWS):
            answer = " ".join([f"the answer is {i + 5}."] * max(1, repeat))
            if sft_tokens:
                answer = _fit(tokenizer, f"what is {i} + 5? answer with the number.", answer, sft_tokens)
            f.write(json.dumps({"messages": [{"role": "user", "content": f"what is {i} + 5? answer with the number."},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    with open(d / "dpo.jsonl", "w") as f:
        for i in range(N_ROWS):
            chosen, rejected = f"the answer is {i + 5}.", "hello world, the cat sat."
            if sft_tokens:  # each answer grown to about sft_tokens with its prompt
                chosen = _fit(tokenizer, f"what is {i} + 5?", chosen, sft_tokens)
                rejected = _fit(tokenizer, f"what is {i} + 5?", rejected, sft_tokens)
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i} + 5?"}],
                                "chosen": [{"role": "assistant", "content": chosen}],
                                "rejected": [{"role": "assistant", "content": rejected}]}) + "\n")
    with open(d / "grpo.jsonl", "w") as f:
        for i in range(N_ROWS):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i} + 5?"}],
                                "answer": str(i + 5)}) + "\n")


def _fit(tok, question: str, answer: str, n: int) -> str:
    """`answer` grown with words, then cut, so the conversation renders to exactly `n` tokens."""
    def length(a):
        return len(tok.apply_chat_template([{"role": "user", "content": question}, {"role": "assistant", "content": a}],
                                           tokenize=True, return_dict=False))
    words = answer.split()
    while length(" ".join(words)) < n:
        words += ["the", "cat", "sat", "on", "the", "mat."]
    while length(" ".join(words)) > n and len(words) > 1:
        words.pop()
    return " ".join(words)


def reward_fn(prompts, completions, answer=None, **kw):
    return [float(a in (c if isinstance(c, str) else c[-1]["content"])) for c, a in zip(completions, answer)]


DRAW = "cdf"
"""how trajtune's sampler draws a token (`--draw`): "cdf", as `trajtune grpo` / `rft` do by default, or "race",
torch.multinomial's draw, which TRL's generation uses (the same distribution; `trajtune.engine.decoding.pick_next`)"""

CLOCK = time.perf_counter
"""What a step's time is: wall (`perf_counter`), or with `--clock cpu` this process's CPU seconds (`process_time`)"""


class StepClock:
    """Timestamps of optimizer steps -> intervals (the first interval is dropped: warm-up)."""

    def __init__(self):
        self.t: list[float] = []

    def tick(self):
        self.t.append(CLOCK())

    def intervals(self):
        return [b - a for a, b in zip(self.t[1:], self.t[2:])]


# --- trajtune ------------------------------------------------------------------------------------------
def run_trajtune(kind: str, model_dir: Path, d: Path, steps: int, w: Workload = DEFAULT, policy_kw: dict | None = None,
                 rl_kw: dict | None = None, **engine_kw) -> list[float]:
    """trajtune's step times; policy_kw go to `load_policy` (gradient_checkpointing), rl_kw to RLConfig (log_kl),
    engine_kw to `make_engine`."""
    from trajtune.sources import data as D
    from trajtune.algorithms.dpo import DPOConfig, train_dpo
    from trajtune.algorithms.rl import RLConfig, train_rl
    from trajtune.algorithms.sft import SFTConfig, train_sft
    from trajtune.engine import OptimConfig, make_engine
    from trajtune.envs.base import SingleTurnEnv
    from trajtune.models.hf import load_policy, load_tokenizer
    from trajtune.sources.episodes import EpisodeSource
    from trajtune.sources.sampler import Decoder, SamplerSettings
    from trajtune.sources.rewards import reward_verifier
    from trajtune.text.chat import ChatRenderer

    torch.manual_seed(0)
    tok = load_tokenizer(model_dir)
    r = ChatRenderer(tok)
    engine = make_engine(load_policy(model_dir, **(policy_kw or {})), OptimConfig(lr=1e-5, grad_clip=1.0, fused=True),
                         **engine_kw)
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
        train_sft(engine, trajs, SFTConfig(steps=n, batch_size=w.batch), r.pad_id)
    elif kind == "DPO":
        pairs = D.preference_pairs(D.read_rows(d / "dpo.jsonl"), r)
        train_dpo(engine, pairs, DPOConfig(steps=n, batch_size=w.batch, beta=0.1), r.pad_id)
    else:
        tasks = D.prompt_tasks(D.read_rows(d / "grpo.jsonl"))
        sampler = Decoder(engine.sample, SamplerSettings(w.new_tokens, draw=DRAW,
                                                         share_prompts=engine_kw.get("share_prefix", True)))
        collect = EpisodeSource(sampler, lambda: SingleTurnEnv(reward_verifier(reward_fn)), r,
                                max_turns=1, max_tokens=w.max_length)
        train_rl(engine, tasks, collect, RLConfig(steps=n, tasks_per_step=w.prompts, group_size=w.group,
                                                  advantage="grpo",
                                                   aggregation="sequence", **(rl_kw or {})), r.pad_id)
    return clock.intervals()


# --- TRL ------------------------------------------------------------------------------------------------
def run_trl(kind: str, model_dir: Path, d: Path, steps: int, out: Path, w: Workload = DEFAULT,
            same_math: bool = False, checkpointing: bool | None = None) -> list[float]:
    """TRL's step times; checkpointing: gradient checkpointing on / off (None: TRL's default, on)."""
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
    if same_math or checkpointing is not None:  # same_math: no recompute in the backward (TRL's default: on)
        common["gradient_checkpointing"] = bool(checkpointing) and not same_math
    if kind == "SFT":
        from trl import SFTConfig, SFTTrainer

        ds = load_dataset("json", data_files=str(d / "sft.jsonl"), split="train")
        cfg = SFTConfig(per_device_train_batch_size=w.batch, max_length=w.max_length, **common)
        trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Clock()])
    elif kind == "DPO":
        from trl import DPOConfig, DPOTrainer

        ds = load_dataset("json", data_files=str(d / "dpo.jsonl"), split="train")
        cfg = DPOConfig(per_device_train_batch_size=w.batch, beta=0.1, max_length=w.max_length,
                        precompute_ref_log_probs=same_math, **common)
        trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Clock()])
    else:
        from trl import GRPOConfig, GRPOTrainer

        ds = load_dataset("json", data_files=str(d / "grpo.jsonl"), split="train")
        cfg = GRPOConfig(per_device_train_batch_size=w.prompts * w.group, num_generations=w.group,
                         max_completion_length=w.new_tokens, gradient_accumulation_steps=1, beta=0.0,
                         temperature=1.0, **common)
        trainer = GRPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, reward_funcs=reward_fn,
                              callbacks=[Clock()])
    trainer.train()
    return clock.intervals()


class Profile:
    """--profile: seconds per piece of the timed steps (module docstring), summed while `on`."""

    PIECES = ("decoder", "reference", "head", "backward", "optimizer")

    def __init__(self):
        self.on, self.t, self._busy = False, dict.fromkeys(self.PIECES, 0.0), False
        from transformers.models.llama import modeling_llama
        import trl.trainer.utils as trl_utils
        from trajtune import logprobs

        def timed(fn, piece):
            def wrapper(*a, **k):
                if not self.on or self._busy:  # outer calls only (clip inside the optimizer piece, ...)
                    return fn(*a, **k)
                name = "reference" if piece == "decoder" and not torch.is_grad_enabled() else piece
                self._busy, t = True, time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.t[name] += time.perf_counter() - t
                    self._busy = False
            return wrapper

        modeling_llama.LlamaModel.forward = timed(modeling_llama.LlamaModel.forward, "decoder")
        logprobs.TokenHead.__call__ = timed(logprobs.TokenHead.__call__, "head")
        trl_utils._ChunkedLogProbFunction.apply = timed(trl_utils._ChunkedLogProbFunction.apply, "head")
        torch.autograd.backward = timed(torch.autograd.backward, "backward")
        torch.optim.AdamW.step = timed(torch.optim.AdamW.step, "optimizer")
        torch.nn.utils.clip_grad_norm_ = timed(torch.nn.utils.clip_grad_norm_, "optimizer")

    def start(self):
        self.t, self.on, self.steps = dict.fromkeys(self.PIECES, 0.0), True, []

    def mark(self):
        """The end of a timed step: its pieces."""
        self.steps.append(dict(self.t))
        self.t = dict.fromkeys(self.PIECES, 0.0)

    def stop(self) -> list[dict[str, float]]:
        self.on = False
        return self.steps


PROFILE: Profile | None = None


def profiled(run, *a, **k) -> tuple[list[float], list[dict[str, float]]]:
    """`run(*a, **k)` -> (its step intervals, seconds per piece of each of those steps)."""
    if PROFILE is None:
        return run(*a, **k), []
    tick = StepClock.tick

    def start_after_warmup(clock):
        tick(clock)
        if len(clock.t) == 2:  # the end of the warm-up step the intervals drop
            PROFILE.start()
        elif len(clock.t) > 2:
            PROFILE.mark()

    StepClock.tick = start_after_warmup
    try:
        out = run(*a, **k)
    finally:
        StepClock.tick = tick
    return out, PROFILE.stop()


def median_pieces(steps: list[dict[str, float]]) -> dict[str, float]:
    """The median over steps of each piece, in seconds (medians: a step slowed by load does not skew them)."""
    return {k: statistics.median(s[k] for s in steps) for k in Profile.PIECES}


def profile_line(lib: str, step_s: float, pieces: dict[str, float]) -> str:
    ms = {k: 1000 * v for k, v in pieces.items()}
    own = 1000 * step_s - sum(ms.values())
    return (f"    {lib:<8} {1000 * step_s:7.1f} ms/step = " + "  ".join(f"{k} {v:.1f}" for k, v in ms.items() if v)
            + f"  own {own:.1f} ({own / (1000 * step_s):.0%})")


def matmul_peak(n: int = 2048, reps: int = 10) -> float:
    """FLOP/s of the best of `reps` fp32 n x n matmuls at the current thread count (2 n^3 FLOPs each), on the
    step's clock (`--clock cpu`: this process's CPU seconds, as robust to other processes as the steps)."""
    return best_matmul_rate(n, n, n, reps)


def best_matmul_rate(m: int, k: int, n: int, reps: int) -> float:
    """FLOP/s of the best of `reps` fp32 [m, k] @ [k, n] matmuls (2 m k n FLOPs each), after one warm-up, on the
    step's clock."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = CLOCK()
        a @ b
        best = min(best, CLOCK() - t)
    return 2 * m * k * n / best


def matmul_params(model_dir: Path) -> int:
    """N of 6 N tokens: the weights of every Linear (the blocks' projections and the output layer, counted
    once though tied to the embedding); the embedding lookup, norms and attention scores are not counted."""
    from trajtune.models.hf import load_policy

    return sum(m.weight.numel() for m in load_policy(model_dir).modules() if isinstance(m, torch.nn.Linear))


def step_flops(kind: str, n: int, tok, d: Path, w: Workload) -> float:
    """Training FLOPs of one step: 6 N per trained token, plus (GRPO) 2 N per token the sampler runs forward."""
    rows = [json.loads(x) for x in (d / f"{kind.lower()}.jsonl").read_text().splitlines()]
    if kind == "SFT":
        lengths = [len(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=False)) for r in rows]
        return 6 * n * w.batch * statistics.mean(lengths)
    prompt = statistics.mean(len(tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True,
                                                         return_dict=False)) for r in rows)
    seqs = w.prompts * w.group
    return 6 * n * seqs * (prompt + w.new_tokens) + 2 * n * seqs * (prompt + w.new_tokens)


def flop_rows(d: Path, args) -> list[tuple]:
    """The FLOP-bound row: SFT and GRPO on the 20M Llama, FLOP/s as a share of the measured matmul peak."""
    from trajtune.models.hf import load_tokenizer
    from trajtune.models.hf_random import make_random_model

    fd = d / "flops"
    fd.mkdir()
    model_dir = make_random_model(fd / "model", "llama", "tiny", padded_vocab=FLOP_VOCAB, overrides=FLOP_MODEL)
    tok = load_tokenizer(model_dir)
    write_data(fd, tokenizer=tok, sft_tokens=FLOP_SFT_TOKENS)
    n = matmul_params(model_dir)
    print(f"FLOP row: Llama hidden 384, 6 layers, vocab {FLOP_VOCAB}: N = {n / 1e6:.2f}M matmul parameters", flush=True)
    out = []
    for kind in ("SFT", "GRPO"):
        peak = matmul_peak()
        flops = step_flops(kind, n, tok, fd, FLOPS)
        ours, theirs, lean = [], [], []
        for rep in range(args.repeats):
            ours += run_trajtune(kind, model_dir, fd, args.flop_steps, FLOPS, head_positions="all",
                                 share_prefix=False)  # 6 N every token of every row
            theirs += run_trl(kind, model_dir, fd, args.flop_steps, fd / f"trl-{kind}-{rep}", FLOPS)
            if kind == "GRPO":  # trajtune as a user gets it: the prompt once per group, the head at completions only
                lean += run_trajtune(kind, model_dir, fd, args.flop_steps, FLOPS, head_positions="actions")
        a, b = statistics.median(ours), statistics.median(theirs)
        peak = max(peak, matmul_peak())  # before and after the runs: one slow measurement (a noisy VM) is not the peak
        out.append((kind, a, b, flops, peak))
        print(f"flops  {kind:<5} trajtune {a:.2f}s ({flops / a / peak:.0%} of peak)  TRL {b:.2f}s "
              f"({flops / b / peak:.0%})  ratio {a / b:.2f}  [peak {peak / 1e9:.0f} GFLOP/s]", flush=True)
        if lean:
            c = statistics.median(lean)
            out.append((kind + " lean", c, b, None, peak))
            print(f"flops  {kind:<5} trajtune with its defaults (less math) {c:.2f}s  ratio {c / b:.2f}", flush=True)
    return out


def resolve(spec: str) -> Path:
    """--model: a Hugging Face folder, or where `trajtune.models.hub` exists a catalog name (smollm2-135m), a hub id
    or a .gguf file, resolved to its folder."""
    try:
        from trajtune.models.hub import resolve_model
    except ImportError:
        return Path(spec).expanduser()
    return Path(resolve_model(spec))


def padding_share(kind: str, model_dir: Path, d: Path, w: Workload) -> float:
    """The share of padding in the batches trajtune forwards for `kind`: 1 - tokens / (rows x longest row), over
    consecutive batches of the data (SFT: w.batch conversations; DPO: w.batch pairs, chosen and rejected rows, before
    the shared prompt is cut; GRPO: each prompt with w.new_tokens new tokens, the completions' own spread not
    counted)."""
    from trajtune.models.hf import load_tokenizer
    from trajtune.sources import data as D
    from trajtune.text.chat import ChatRenderer

    tok = load_tokenizer(model_dir)
    r = ChatRenderer(tok)
    rows = D.read_rows(d / f"{kind.lower()}.jsonl")
    if kind == "SFT":
        lengths = [len(t.ids) for t in D.sft_trajectories(rows, r)]
        per = w.batch
    elif kind == "DPO":
        lengths = [len(t.ids) for pair in D.preference_pairs(rows, r) for t in pair[:2]]
        per = 2 * w.batch
    else:
        lengths = [len(tok.apply_chat_template(row.data["prompt"], tokenize=True, add_generation_prompt=True,
                                                return_dict=False)) + w.new_tokens for row in rows]
        per = w.prompts
    batches = [lengths[i:i + per] for i in range(0, len(lengths) - per + 1, per)]
    return 1 - sum(map(sum, batches)) / sum(len(b) * max(b) for b in batches)


def model_peak(model_dir: Path, tokens: int, reps: int = 10) -> float:
    """FLOP/s of the best of `reps` fp32 matmuls at the model's MLP shape: [tokens, hidden] @ [hidden, intermediate],
    on the step's clock."""
    import json as _json

    cfg = _json.loads((model_dir / "config.json").read_text())
    return best_matmul_rate(tokens, cfg["hidden_size"], cfg["intermediate_size"], reps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="*", default=["tiny", "small"],
                    help="sizes of the speed rows (none: only --flops)")
    ap.add_argument("--model", default=None,
                    help="a real model instead of the random sizes: a Hugging Face folder, or (trajtune.models.hub) "
                         "smollm2-135m, a hub id or a .gguf file; prints the padding share of the batches and SFT's "
                         "share of this CPU's matmul peak")
    ap.add_argument("--kinds", nargs="+", default=["SFT", "DPO", "GRPO"])
    ap.add_argument("--steps", type=int, default=5, help="timed optimizer steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per library")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--flops", action="store_true", help="add the FLOP-bound row (20M Llama, SFT and GRPO)")
    ap.add_argument("--flop-steps", type=int, default=2, help="timed optimizer steps per run of the FLOP row")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="a step's time: wall seconds, or this process's CPU seconds (with --threads 1: the time "
                         "the step would take on an idle core, robust to other processes on the machine)")
    ap.add_argument("--draw", choices=["cdf", "race"], default="cdf",
                    help="how trajtune's sampler draws a token: cdf (the default of trajtune grpo / rft: one "
                         "random number per row) or race (torch.multinomial's, as TRL: one per vocabulary entry)")
    ap.add_argument("--profile", action="store_true", help="print where each library's step goes, and the bound")
    ap.add_argument("--trl-same-math", action="store_true",
                    help="TRL without gradient checkpointing and, for DPO, with precomputed reference log-probs")
    ap.add_argument("--no-share-prefix", action="store_true",
                    help="trajtune runs a DPO pair's / GRPO group's prompt once per completion, as TRL does "
                         "(engine share_prefix=False)")
    ap.add_argument("--all-positions", action="store_true",
                    help="also time trajtune with the output layer at every position (head_positions='all')")
    args = ap.parse_args()
    global PROFILE, CLOCK, DRAW
    DRAW = args.draw
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.profile:
        PROFILE = Profile()
    if args.threads:
        torch.set_num_threads(args.threads)
    from trajtune.models.hf_random import make_random_model
    from trajtune.models.hf import load_policy

    import trl
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"{torch.get_num_threads()} threads, CPU fp32, {args.clock} clock, trajtune draw {args.draw}; load average "
          f"{os.getloadavg()[0]:.1f} at the start (1, 5, 15 min: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + ")",
          flush=True)
    rows, flop = [], []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_data(d)
        for size in [Path(args.model).name] if args.model else args.sizes:
            model_dir = resolve(args.model) if args.model else make_random_model(d / size, "llama", size)
            n_params = load_policy(model_dir).num_parameters()
            if args.model:
                print(f"{model_dir}: {n_params:,} parameters; padding share of the batches: " + ", ".join(
                    f"{k} {padding_share(k, model_dir, d, DEFAULT):.1%}" for k in args.kinds), flush=True)
            for kind in args.kinds:
                ours, every, theirs, pieces = [], [], [], {"trajtune": [], "TRL": []}
                for rep in range(args.repeats):
                    iv, p = profiled(run_trajtune, kind, model_dir, d, args.steps,
                                     share_prefix=not args.no_share_prefix, head_positions="actions")
                    ours, pieces["trajtune"] = ours + iv, pieces["trajtune"] + p
                    if args.all_positions:
                        every += run_trajtune(kind, model_dir, d, args.steps, share_prefix=not args.no_share_prefix,
                                              head_positions="all")
                    iv, p = profiled(run_trl, kind, model_dir, d, args.steps, d / f"trl-{size}-{kind}-{rep}",
                                     same_math=args.trl_same_math)
                    theirs, pieces["TRL"] = theirs + iv, pieces["TRL"] + p
                a, b = statistics.median(ours), statistics.median(theirs)
                c = statistics.median(every) if every else None
                rows.append((f"{size} ({n_params / 1e6:.2f}M)", kind, a, b, c))
                also = f"  (all positions {c:.3f}s, ratio {c / b:.2f})" if c is not None else ""
                print(f"{size:<6} {kind:<5} trajtune {a:.3f}s  TRL {b:.3f}s  ratio {a / b:.2f}{also}", flush=True)
                if args.model and kind == "SFT":  # the share of this CPU's matmul peak (6 N per token of the batch)
                    from trajtune.models.hf import load_tokenizer

                    tok = load_tokenizer(model_dir)
                    flops = step_flops("SFT", matmul_params(model_dir), tok, d, DEFAULT)
                    tokens = round(flops / (6 * matmul_params(model_dir)))
                    peaks = {"square 2048": matmul_peak(), f"MLP [{tokens}, h] @ [h, i]": model_peak(model_dir, tokens)}
                    print("    SFT: " + ", ".join(f"trajtune {flops / a / p:.0%} / TRL {flops / b / p:.0%} of the {k} "
                                                  f"matmul peak ({p / 1e9:.0f} GFLOP/s)" for k, p in peaks.items())
                          + f"; 6 N x {tokens} tokens = {flops / 1e9:.0f} GFLOP a step", flush=True)
                if PROFILE is not None:  # the median step and the median of each piece
                    mine, trl_ = median_pieces(pieces["trajtune"]), median_pieces(pieces["TRL"])
                    print(profile_line("trajtune", a, mine))
                    print(profile_line("TRL", b, trl_))
                    shared = sum(mine.values())
                    print(f"    bound {shared / b:.2f} (now {a / b:.2f})", flush=True)
        if args.flops:
            flop = flop_rows(d, args)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end (1, 5, 15 min: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + ")")
    if rows and args.all_positions:
        print("\n| model | method | trajtune s/step | TRL s/step | trajtune / TRL | all positions s/step "
              "| all positions / TRL |\n|---|---|---|---|---|---|---|")
    elif rows:
        print("\n| model | method | trajtune s/step | TRL s/step | trajtune / TRL |\n|---|---|---|---|---|")
    for m, k, a, b, c in rows:
        tail = f" {c:.3f} | {c / b:.2f} |" if c is not None else ""
        print(f"| {m} | {k} | {a:.3f} | {b:.3f} | {a / b:.2f} |{tail}")
    if flop:
        print("\n| FLOP row (20.5M Llama) | trajtune s/step | trajtune % of peak | TRL s/step | TRL % of peak "
              "| trajtune / TRL | matmul peak |\n|---|---|---|---|---|---|---|")
        for k, a, b, f, peak in flop:
            what = {"SFT": "SFT 16 x 256", "GRPO": "GRPO 8 x 8 x 64 new"}.get(k,
                                                                              "GRPO, trajtune's defaults (less math)")
            print(f"| {what} | {a:.2f} | {f / a / peak:.0%} | {b:.2f} | {f / b / peak:.0%} | {a / b:.2f} "
                  f"| {peak / 1e9:.0f} GFLOP/s |" if f is not None else
                  f"| {what} | {a:.2f} | - | {b:.2f} | - | {a / b:.2f} | {peak / 1e9:.0f} GFLOP/s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
