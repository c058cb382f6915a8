"""An HF pipeline that learns, end to end, in CPU minutes (a nanochat-style speedrun): a Llama built from a
config learns 2-digit addition through pretraining, SFT, DPO and GRPO, each stage through the code path of the
matching `trajtune` command, the held-out pass@1 measured after every stage.

    trajtune run hf_pipeline                  # ~3 min on 2 CPU cores; runs/hf_pipeline-*/report.md

    stage     what it does                                                   trains (code path)
    base      write the corpora (data/*), train a byte-level BPE with one    --
              token per digit, build a random Llama from a config
    pretrain  next-token prediction on raw text, every token trained: lines  hf/sft.py train (= trajtune sft)
              `23+45=68`, a `chat_share` of them conversations written in    on plain-text trajectories
              the chat template (chat data in a pretraining mix)
    sft       `{"messages": [user "What is 23+45?", assistant "68"]}` rows    hf/sft.py train (= trajtune sft)
    pairs     sample the SFT model on fresh problems; each problem with a    --
              wrong sample gives {"prompt", "chosen": the sum, "rejected": it}
    dpo       DPO + NLL on those on-policy pairs                             hf/dpo.py train (= trajtune dpo)
    grpo      GRPO with an exact-match reward function (data/rewards.py,    hf/grpo.py train (= trajtune grpo)
              TRL's signature) on `{"prompt", "answer"}` rows

Each training stage is the method's own stage function (`sft.train`, `dpo.train`, `grpo.train`: what
`trajtune sft|dpo|grpo` run) on the method's own config (`SFTRun`, `DPORun`, `GRPORun`) built from this
config, with the previous stage's `model/` as its --model and a file of `data/` as its --data, checked by
the command's own checks (`hf/common.check`: device, rows, lengths, reward functions, schedule); it
writes `<stage>/model` (AutoModelForCausalLM loads it). One run directory, one metrics.jsonl, one runner:
Ctrl-C saves the running stage in `<stage>/resume` and the same command continues it exactly; finished
stages are read back.

Evaluation (`heldout_eval`): the 256 held-out problems of `trajtune.envs.arithmetic` (never a training
pair), on each stage's saved model loaded from disk: chat pass@1 greedy and sampled (temperature 1, the
mean over `eval_samples` samples per problem; pass@k from the same samples), through the model's chat
template and stop tokens as `trajtune chat` and GRPO see it; completion pass@1 (`23+45=` -> `68`, how a
base model is asked); the mean NLL of the right answer's tokens. Every training stage is judged on chat
pass@1 greedy and sampled, pretraining also on completion pass@1; the report says which rose.

Measured (seed 0, 2 shared CPU cores, 170 s): chat pass@1 greedy / sampled after each stage
0 / 0 (random), 72.7 / 51.0 (pretrain; completion 97.3), 97.7 / 76.4 (sft), 96.9 / 79.5 (dpo),
98.8 / 85.9 (grpo): every stage raises sampled pass@1; DPO leaves greedy 2 of 256 problems lower.

How this departs from nanochat's speedrun:
1. The corpus is synthetic arithmetic, not web text: it ships with the project, and a 0.17M-parameter
   model learns it in about a minute.
2. No separate midtraining stage: a tenth of the pretraining documents are conversations in the chat
   template (in a run with none, the pretrained model's addition did not carry over to the chat format:
   SFT then reached 7% greedy); SFT trains on the assistant turns only.
3. The preference stage is DPO (with the chosen side's NLL) on on-policy pairs labelled by the verifier,
   not a reward model: a reward model does not change the policy, so its stage could not move the metric.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...algorithms.dpo import DPOConfig
from ...algorithms.rl import RLConfig
from ...algorithms.sft import SFTConfig
from ...config import check_ranges
from ...engine import OptimConfig
from ...runs.stages import Stage, StageOptions, run_stages
from ..hf.common import OutputConfig
from ..hf.model import ModelConfig
from ..hf.sampling import SamplingConfig
from ..hf.schedule import ScheduleConfig
from ...seeding import derive

MAX_ANSWER = 4
"""evaluation reply budget in tokens: up to three digits and the stop token"""
TRAINING = ("pretrain", "sft", "dpo", "grpo")
MODEL_STAGES = ("base",) + TRAINING


@dataclass
class LlamaShape:
    """The Llama built from a config (transformers.LlamaConfig fields) and its tokenizer's size."""

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 128
    """the context; a chat-formatted problem is ~30 tokens"""
    vocab_size: int = 320
    """BPE vocabulary target (256 bytes + 3 specials + merges such as 'What', 'assistant')"""
    tie_word_embeddings: bool = False
    """one matrix for input and output embeddings"""

    def __post_init__(self) -> None:
        check_ranges(self, "llama", counts=("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads", "max_position_embeddings"))
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"llama: hidden_size ({self.hidden_size}) must divide by num_attention_heads "
                             f"({self.num_attention_heads}), and that by num_key_value_heads ({self.num_key_value_heads})")
        if self.vocab_size < 260:
            raise ValueError(f"llama: vocab_size must be >= 260 (256 bytes, 3 specials), got {self.vocab_size}")


def adam(lr: float, warmup: int = 0) -> OptimConfig:
    """AdamW with TRL's betas (0.9, 0.999) and `warmup` warm-up steps."""
    return OptimConfig(lr=lr, beta2=0.999, warmup_steps=warmup)


def cosine() -> ScheduleConfig:
    """The sft command's schedule section: after warm-up, cosine decay over the stage's remaining steps."""
    return ScheduleConfig(lr_scheduler_type="cosine")


@dataclass
class Config:
    seed: int = 0
    """one seed: model init, the problem streams, every loop's batches and samples"""
    llama: LlamaShape = field(default_factory=LlamaShape)
    """the model built from a config"""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(max_length=128))
    """how every HF stage trains (device, precision, LoRA, lengths) as the commands' model section;
    `path` stays empty: each stage trains the previous stage's model/"""
    output: OutputConfig = field(default_factory=lambda: OutputConfig(logging_steps=100))
    """the commands' output section: a console line every logging_steps, HF snapshots every save_every
    steps in <stage>/checkpoints (0: only each stage's model/)"""
    n_pretrain: int = 40_000
    """raw-text problems in the pretraining corpus (a stream: pairs repeat)"""
    chat_share: float = 0.1
    """share of pretraining documents that are conversations in the chat template (`<|im_start|>user\\n
    What is a+b?<|im_end|>...`, every token trained, as chat data in a pretraining mix); the rest `a+b=c`"""
    n_sft: int = 8_000
    """chat rows for SFT"""
    n_pair_prompts: int = 4_096
    """fresh problems the SFT model is sampled on for DPO pairs"""
    pair_samples: int = 4
    """samples per pair problem (a problem gives a pair when one of them is wrong)"""
    n_grpo: int = 4_000
    """prompt rows for GRPO"""
    n_eval: int = 256
    """held-out problems evaluated (the first n of the fixed 256)"""
    eval_samples: int = 8
    """sampled replies per held-out problem (temperature 1): sampled pass@1 and pass@k"""
    pretrain: SFTConfig = field(default_factory=lambda: SFTConfig(steps=1000, batch_size=128))
    """pretraining: every token of the raw text trained"""
    pretrain_optim: OptimConfig = field(default_factory=lambda: adam(3e-3, 20))
    """pretraining's AdamW (a random model takes a high learning rate)"""
    pretrain_schedule: ScheduleConfig = field(default_factory=cosine)
    """the sft command's schedule section for pretraining (epochs, warm-up ratio, cosine)"""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=100, batch_size=64))
    """SFT on the chat rows (the assistant turn trained)"""
    sft_optim: OptimConfig = field(default_factory=lambda: adam(1e-3, 10))
    """SFT's AdamW"""
    sft_schedule: ScheduleConfig = field(default_factory=cosine)
    """the sft command's schedule section for SFT"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, batch_size=32, beta=0.1, nll_weight=1.0))
    """DPO on the on-policy pairs, plus the chosen side's NLL (DPO + NLL as in RPO, Pang et al. 2024, for
    math; without it DPO lowered held-out pass@1 in our runs: pairs that differ in one digit)"""
    dpo_optim: OptimConfig = field(default_factory=lambda: adam(1e-4))
    """DPO's AdamW"""
    dpo_schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(num_train_epochs=2.0))
    """the dpo command's schedule section: epochs over the pairs (their number depends on the SFT model's
    errors), so dpo.steps stays the command's default"""
    grpo: RLConfig = field(default_factory=lambda: RLConfig(steps=100, tasks_per_step=32, group_size=8,
                                                            advantage="grpo"))
    """GRPO (the grpo command's rl section)"""
    grpo_optim: OptimConfig = field(default_factory=lambda: replace(adam(1e-4), grad_clip=0.0))
    """GRPO's AdamW (no gradient clipping, as chapter 13's GRPO)"""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=4))
    """GRPO's sampling section (an answer is at most 3 digits + the stop token)"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=1))
    """the stage runner (a chain: nothing runs in parallel)"""

    def __post_init__(self) -> None:
        check_ranges(self, "hf_pipeline", counts=("n_pretrain", "n_sft", "n_pair_prompts", "pair_samples",
                                                   "n_grpo", "n_eval", "eval_samples"))
        if not 0 <= self.chat_share <= 1:
            raise ValueError(f"hf_pipeline: chat_share must be in [0, 1], got {self.chat_share}")
        if self.model.path:
            raise ValueError("hf_pipeline: model.path is set by the pipeline (each stage trains the previous "
                             "stage's model/); leave it empty")
        if not 1 <= self.n_eval <= 256:
            raise ValueError(f"hf_pipeline: n_eval must be in 1..256 (the held-out set), got {self.n_eval}")
        for name in ("pretrain", "sft", "dpo", "grpo"):
            setattr(self, name, replace(getattr(self, name), seed=self.seed))


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


# --- evaluation -------------------------------------------------------------------------------
def heldout_eval(ctx, path: Path, config: Config) -> dict:
    """pass@1 on the held-out problems of the model saved at `path` (loaded from disk, as a user would):
    chat greedy, chat sampled (mean over `eval_samples` at temperature 1) and pass@k from those samples,
    through the chat template and stop tokens (what `trajtune chat` and GRPO see); completion greedy
    (`a+b=` -> `c\\n`, the base model's question); the right answers' NLL. A reply counts only if it
    ends with a stop token."""
    import torch

    from ...engine.distributed import launched_distributed
    from ...envs.arithmetic import heldout_tasks
    from ...evaluation import mean_pass_at_k
    from ...models.hf import load_policy, load_tokenizer
    from ...text.chat import ChatRenderer

    tok, policy = load_tokenizer(path), load_policy(path)
    device = None if config.model.device == "cuda" and launched_distributed() else config.model.device
    engine = ctx.engine(policy, device=device)
    r, tasks, k, n = ChatRenderer(tok), list(heldout_tasks())[: config.n_eval], config.eval_samples, MAX_ANSWER
    answers = [t.answer for t in tasks]
    chat = [r.prompt_ids(r.start([{"role": "user", "content": question(t)}])) for t in tasks]
    stop, pad = list(r.stop_ids), r.pad_id

    def correct(samples, answers, text) -> list[bool]:  # one per sample
        return [s and text(x) == a for x, s, a in zip(samples.tokens, samples.stopped, answers, strict=True)]

    greedy = engine.sample(chat, n, greedy=True, stop_ids=stop, pad_id=pad)
    g = torch.Generator().manual_seed(derive(config.seed, 5, stride=7919))
    drawn = correct(engine.sample([p for p in chat for _ in range(k)], n, g, stop_ids=stop, pad_id=pad),
                    [a for a in answers for _ in range(k)], r.action_text)  # task-major: k samples of task 0 first
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    raw = [tok(completion_prompt(t), add_special_tokens=False)["input_ids"] for t in tasks]
    base = correct(engine.sample(raw, n, greedy=True, stop_ids=newline, pad_id=pad), answers,
                   lambda x: tok.decode(x[:-1]))
    return {"chat_greedy": mean(correct(greedy, answers, r.action_text)), "chat_sampled": mean(drawn),
            "chat_answer_nll": answer_nll(engine, r, tasks),
            "chat_pass_at_k": mean_pass_at_k([drawn[i * k:(i + 1) * k] for i in range(len(tasks))], k),
            "completion_greedy": mean(base),
            "examples": [[question(t), r.action_text(x)] for t, x in zip(tasks[:6], greedy.tokens, strict=False)]}


def answer_nll(engine, renderer, tasks) -> float:
    """Mean NLL per answer token (the digits and the stop token) of the held-out conversations, the answer
    right: a smooth measure of what pass@1 counts."""
    import torch

    from ...trajectory import collate

    batch = collate([renderer.render(conversation(t)) for t in tasks], renderer.pad_id)
    with torch.no_grad():
        logp_B_T = engine.forward(batch).logprobs  # [B, T-1]
    mask = batch.action_mask.to(logp_B_T.device)  # [B, T-1]: the answer's tokens
    return float(-(logp_B_T * mask).sum() / mask.sum())


def mean(xs) -> float:
    xs = list(xs)
    return sum(map(float, xs)) / len(xs)


# --- the stages -------------------------------------------------------------------------------
def stage_base(ctx) -> dict:
    """The corpora, the tokenizer trained on them, a random Llama from a config; its (zero) scores."""
    from ...engine.distributed import barrier

    config, run_dir = ctx.config, ctx.run_dir
    sample = problems(config, 2_000, 0)
    corpus = [completion_text(t) for t in sample] + [f"user\n{question(t)}\nassistant\n{t.answer}\nsystem\n"
                                                     for t in sample[:500]]
    tok = train_digit_tokenizer(corpus, config.llama.vocab_size)
    model = build_llama(config.llama, tok, config.seed)
    path = model_dir(run_dir, ctx.name)
    if ctx.logger is not None:  # rank 0 writes
        write_corpora(config, run_dir, tok)
        model.save_pretrained(str(path))
        tok.save_pretrained(str(path))
    barrier()
    return {"model": str(path), "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
            "data": str(data_dir(run_dir)), "eval": heldout_eval(ctx, path, config)}


def text_data(tokenizer, path: Path, limit: int):
    """The pretraining corpus as `Prepared` trajectories whose every token is trained (plain text, no template)."""
    from ...sources.data import read_rows
    from ...trajectory import Owner, Trajectory
    from ..hf.prepare import Prepared

    items = []
    for row in read_rows(path):
        ids = tokenizer(row.data["text"], add_special_tokens=False)["input_ids"]
        if len(ids) > limit:
            raise ValueError(f"{row.where}: {len(ids)} tokens > the length budget {limit}")
        t = Trajectory(info={"source": row.where})
        t.append(ids, Owner.POLICY, 0)
        items.append(t)
    return Prepared(tokenizer=tokenizer, items=items, limit=limit)


def method_config(cls, ctx, previous: str, data: str, **sections):
    """The method's own run config, as its command builds it from flags: --model the previous stage's
    model/, --data run_dir/data/<data>, the model and output sections of this config, `sections`."""
    model = replace(ctx.config.model, path=str(model_dir(ctx.run_dir, previous)))
    return cls(model=model, data=str(data_dir(ctx.run_dir) / data), output=ctx.config.output, **sections)


def checked(ctx, c, module):
    """What the method's command checks before its model loads (`hf/common.check`: the device, the rows,
    every length, the reward functions, the schedule), with the stage directory as the method's run
    directory: the pipeline's runner keeps the resume state (<stage>/resume), so the method finds no run
    of its own there."""
    from ..hf.common import check

    return check(c, ctx.dir, module.prepare)


def stage_pretrain(ctx) -> dict:
    """`sft.train` (what `trajtune sft` runs) on raw text: every token trained."""
    from ...models.hf import load_tokenizer
    from ..hf import sft
    from ..hf.common import check_device
    from ..hf.prepare import budget, planned

    c = method_config(sft.SFTRun, ctx, "base", "pretrain.jsonl", sft=ctx.config.pretrain,
                      optim=ctx.config.pretrain_optim, schedule=ctx.config.pretrain_schedule)
    check_device(c.model.device)
    data = text_data(load_tokenizer(c.model.path), Path(c.data), budget(c.model)[0])
    return evaluated(ctx, sft.train(ctx, c, planned(c, data, "sft", c.sft.batch_size, "samples"), home=ctx.name))


def stage_sft(ctx) -> dict:
    """`trajtune sft --model pretrain/model --data data/sft.jsonl`: its checks, then its stage function."""
    from ..hf import sft

    c = method_config(sft.SFTRun, ctx, "pretrain", "sft.jsonl", sft=ctx.config.sft, optim=ctx.config.sft_optim,
                      schedule=ctx.config.sft_schedule)
    return evaluated(ctx, sft.train(ctx, c, checked(ctx, c, sft), home=ctx.name))


def stage_pairs(ctx) -> dict:
    """On-policy preference pairs: the SFT model's samples on fresh problems, labelled by the verifier;
    a problem with a wrong sample gives {"prompt", "chosen": the sum, "rejected": that sample} (a wrong
    reply that ended with the stop token preferred)."""
    import torch

    from ...models.hf import load_policy, load_tokenizer
    from ...text.chat import ChatRenderer

    config, path = ctx.config, model_dir(ctx.run_dir, "sft")
    tok, policy = load_tokenizer(path), load_policy(path)
    engine, r, n = ctx.engine(policy), ChatRenderer(tok), config.pair_samples
    tasks = problems(config, config.n_pair_prompts, 2)
    prompts = [r.prompt_ids(r.start([{"role": "user", "content": question(t)}])) for t in tasks]
    out = engine.sample([p for p in prompts for _ in range(n)], config.sampling.max_new_tokens,
                        torch.Generator().manual_seed(derive(config.seed, 2, stride=7919)), stop_ids=list(r.stop_ids), pad_id=r.pad_id)
    replies = [(r.action_text(x).strip(), stopped) for x, stopped in zip(out.tokens, out.stopped, strict=True)]
    rows, right = [], 0
    for i, t in enumerate(tasks):
        mine = replies[i * n:(i + 1) * n]  # task-major: the n samples of task i
        right += sum(x == t.answer and stopped for x, stopped in mine)
        wrong = sorted((not stopped, x) for x, stopped in mine if x and x != t.answer)
        if wrong:
            rows.append({"prompt": question(t), "chosen": t.answer, "rejected": wrong[0][1]})
    if not rows:
        raise ValueError("pairs: the SFT model answered every sampled problem right; nothing for DPO to prefer")
    if ctx.logger is not None:  # rank 0 writes
        write_jsonl(data_dir(ctx.run_dir) / "pairs.jsonl", rows)
    return {"pairs": len(rows), "problems": len(tasks), "samples_per_problem": n,
            "wrong_share": 1 - right / (n * len(tasks))}


def stage_dpo(ctx) -> dict:
    """`trajtune dpo --model sft/model --data data/pairs.jsonl`."""
    from ..hf import dpo

    c = method_config(dpo.DPORun, ctx, "sft", "pairs.jsonl", dpo=ctx.config.dpo, optim=ctx.config.dpo_optim,
                      schedule=ctx.config.dpo_schedule)
    return evaluated(ctx, dpo.train(ctx, c, checked(ctx, c, dpo), home=ctx.name))


def stage_grpo(ctx) -> dict:
    """`trajtune grpo --model dpo/model --data data/prompts.jsonl --reward data/rewards.py:exact_answer`."""
    from ..hf import grpo

    reward = f"{data_dir(ctx.run_dir) / 'rewards.py'}:exact_answer"
    c = method_config(grpo.GRPORun, ctx, "dpo", "prompts.jsonl", reward=[reward], rl=ctx.config.grpo,
                      sampling=ctx.config.sampling, optim=ctx.config.grpo_optim)
    return evaluated(ctx, grpo.train(ctx, c, checked(ctx, c, grpo), home=ctx.name))


def evaluated(ctx, results: dict) -> dict:
    """A training stage's results plus the held-out scores of the model it saved."""
    return {**results, "eval": heldout_eval(ctx, Path(results["model"]), ctx.config)}


def stages() -> list[Stage]:
    return [Stage("base", stage_base), Stage("pretrain", stage_pretrain, after=("base",)),
            Stage("sft", stage_sft, after=("pretrain",)), Stage("pairs", stage_pairs, after=("sft",)),
            Stage("dpo", stage_dpo, after=("pairs",)), Stage("grpo", stage_grpo, after=("dpo",))]


def run(config: Config, run_dir: Path) -> Path:
    """Run (or resume) every stage; write report.md / report.html with the per-stage table and plots."""
    from ...engine.distributed import init_distributed, is_main

    run_dir = Path(run_dir)
    init_distributed()
    results = run_stages(stages(), config, run_dir, config.runner)
    if not is_main():
        return run_dir / "report.md"
    report = write_pipeline_report(run_dir, config, results)
    print(table(results, config))
    return report


# --- the report -------------------------------------------------------------------------------
STAGE_METRIC = {"pretrain": ("completion_greedy", "chat_greedy", "chat_sampled"),
                "sft": ("chat_greedy", "chat_sampled"), "dpo": ("chat_greedy", "chat_sampled"),
                "grpo": ("chat_greedy", "chat_sampled")}
"""the held-out metrics each training stage is judged by (pretraining also in the form its corpus has)"""
TRAINED_ON = {"base": "random init", "pretrain": "raw text, every token", "sft": "chat rows, assistant turn",
              "dpo": "on-policy pairs", "grpo": "exact-match reward"}


def rises(results: dict) -> dict[str, dict[str, float]]:
    """stage -> {metric: after - before} for the stage's own metrics (before: the previous model's score)."""
    out, previous = {}, "base"
    for name in TRAINING:
        out[name] = {m: results[name]["eval"][m] - results[previous]["eval"][m] for m in STAGE_METRIC[name]}
        previous = name
    return out


def verdict(deltas: dict[str, float]) -> str:
    """'chat greedy +2.3% (rises), chat sampled -0.4% (does NOT rise)'."""
    return ", ".join(f"{m.replace('_', ' ')} {d:+.1%} ({'rises' if d > 0 else 'does NOT rise'})"
                     for m, d in deltas.items())


def table(results: dict, config: Config) -> str:
    """The per-stage markdown table: held-out pass@1 of each stage's model, and whether its metrics rose."""
    from ...runs.report import markdown_table

    delta, rows = rises(results), []
    for name in MODEL_STAGES:
        e, r = results[name]["eval"], results[name]
        rows.append((name, TRAINED_ON[name], r.get("steps", 0), f"{e['completion_greedy']:.1%}",
                     f"{e['chat_greedy']:.1%}", f"{e['chat_sampled']:.1%}", f"{e['chat_pass_at_k']:.1%}",
                     f"{e['chat_answer_nll']:.3f}", f"{r['time']['wall_s']:.0f}s", verdict(delta[name]) if name in delta else ""))
    k = config.eval_samples
    return markdown_table(["stage", "trained on", "steps", "completion pass@1 (greedy)", "chat pass@1 (greedy)",
                           "chat pass@1 (sampled)", f"chat pass@{k}", "answer NLL", "wall",
                           "its metric vs the stage before"], rows)


def stage_plot(path: Path, results: dict, config: Config) -> Path:
    """Held-out pass@1 after each stage (x: the stages, in order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    xs = list(range(len(MODEL_STAGES)))
    for key, label in (("completion_greedy", "completion pass@1 (greedy)"), ("chat_greedy", "chat pass@1 (greedy)"),
                       ("chat_sampled", "chat pass@1 (sampled, T=1)"),
                       ("chat_pass_at_k", f"chat pass@{config.eval_samples}")):
        ax.plot(xs, [results[s]["eval"][key] for s in MODEL_STAGES], "-o", label=label, markersize=4)
    ax.set_xticks(xs, MODEL_STAGES)
    ax.set(title=f"held-out 2-digit addition ({config.n_eval} problems never trained on)", xlabel="after stage",
           ylabel="share correct", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def curve_plots(run_dir: Path) -> list[str]:
    """Training curves from metrics.jsonl: loss of pretrain / sft / dpo, GRPO's mean reward."""
    from ...metrics import read_metrics
    from ...runs.report import image, line_plot

    rows = read_metrics(run_dir / "metrics.jsonl")
    series = lambda stage, key: ([r["step"] for r in rows if r.get("stage") == stage and key in r],  # noqa: E731
                                 [r[key] for r in rows if r.get("stage") == stage and key in r])
    loss = {s: series(s, "train/loss") for s in ("pretrain", "sft", "dpo")}
    reward = {"grpo: mean reward": series("grpo", "rollout/reward")}
    out = []
    if any(xs for xs, _ in loss.values()):
        out.append(image(line_plot(run_dir / "pipeline_loss.png", {k: v for k, v in loss.items() if v[0]},
                                   "training loss per stage", "step", "loss", styles=dict.fromkeys(loss, "-")),
                         "training loss"))
    if reward["grpo: mean reward"][0]:
        out.append(image(line_plot(run_dir / "pipeline_reward.png", reward, "GRPO: mean exact-match reward", "step",
                                   "reward", (0, 1.02), styles=dict.fromkeys(reward, "-")), "GRPO reward"))
    return out


def not_rising(results: dict, config: Config) -> list[str]:
    """One line per (stage, metric) that did not rise, with its numbers: how many answers moved, and
    the level it started from (near the ceiling a few problems decide)."""
    out, previous = [], "base"
    for name, deltas in rises(results).items():
        for m, d in deltas.items():
            if d > 0:
                continue
            n = config.n_eval * (1 if "greedy" in m else config.eval_samples)
            before = results[previous]["eval"][m]
            out.append(f"{name}: {m.replace('_', ' ')} {before:.1%} -> {before + d:.1%} ({round(abs(d) * n)} of {n} "
                       f"answers {'fewer' if d < 0 else 'more'} right)")
        previous = name
    return out


def write_pipeline_report(run_dir: Path, config: Config, results: dict) -> Path:
    from ...runs.report import image, write_report

    flat = not_rising(results, config)
    summary = ("Every training stage raised its held-out metrics." if not flat else
               "Did not rise: " + "; ".join(flat) + ".")
    base = results["base"]
    pairs = results["pairs"]
    intro = (f"A {base['params']:,}-parameter Llama built from a config, with a {base['vocab']}-token BPE trained "
             f"here, learns 2-digit addition. Each model is scored on the same {config.n_eval} held-out problems "
             "(pairs never in any training file), loaded from its `<stage>/model` with AutoModelForCausalLM. "
             "Chat pass@1 asks `What is a+b?` through the chat template (greedy, and sampled at temperature 1: "
             f"the mean over {config.eval_samples} samples); completion pass@1 asks `a+b=`, the form of "
             f"{1 - config.chat_share:.0%} of the pretraining corpus (the rest: conversations in the chat "
             "template). Answer NLL: the mean negative log-likelihood of the right answer's tokens.")
    shown = "\n".join(f"    {q} -> {a!r}" for q, a in results["grpo"]["eval"]["examples"])
    sections = [intro, table(results, config), f"**{summary}**",
                image(stage_plot(run_dir / "pipeline_pass_at_1.png", results, config), "pass@1 per stage"),
                *curve_plots(run_dir),
                f"DPO pairs: {pairs['pairs']} of {pairs['problems']} fresh problems had a wrong sample among "
                f"{pairs['samples_per_problem']} from the SFT model ({pairs['wrong_share']:.1%} of samples wrong).",
                "The final model on the first held-out problems (greedy):\n\n" + shown,
                "Try it: `trajtune chat --model " + results["grpo"]["model"] + " --temperature 0`"]
    return write_report(run_dir, "HF pipeline: pretrain -> SFT -> DPO -> GRPO on 2-digit addition", sections)
