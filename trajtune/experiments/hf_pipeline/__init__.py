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
the command's own checks (`hf/recipe.check`: device, rows, lengths, reward functions, schedule); it
writes `<stage>/model` (AutoModelForCausalLM loads it). One run directory, one metrics.jsonl, one runner:
Ctrl-C saves the running stage in `<stage>/resume` and the same command continues it exactly; finished
stages are read back.

The package: config.py (the `Config`), task.py (the problems, corpora, tokenizer and model), stages.py (the
stages and `heldout_eval`), report.py (the table and plots).

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

from pathlib import Path

from ...runs.stages import Stage, run_stages
from .config import Config
from .report import write_pipeline_report
from .stages import stage_base, stage_dpo, stage_grpo, stage_pairs, stage_pretrain, stage_sft

__all__ = ["Config", "dry_run", "parse_options", "run", "run_over_seeds", "stages"]


def stages() -> list[Stage]:
    evaluation = ("seed", "model", "n_eval", "eval_samples")  # every stage's held-out scores
    return [Stage("base", stage_base, reads=(*evaluation, "llama", "chat_share", "n_pretrain", "n_sft", "n_grpo")),
            Stage("pretrain", stage_pretrain, after=("base",),
                  reads=(*evaluation, "output", "pretrain", "pretrain_optim", "pretrain_schedule")),
            Stage("sft", stage_sft, after=("pretrain",),
                  reads=(*evaluation, "output", "sft", "sft_optim", "sft_schedule")),
            Stage("pairs", stage_pairs, after=("sft",), reads=("seed", "n_pair_prompts", "pair_samples", "sampling")),
            Stage("dpo", stage_dpo, after=("pairs",),
                  reads=(*evaluation, "output", "dpo", "dpo_optim", "dpo_schedule")),
            Stage("grpo", stage_grpo, after=("dpo",), reads=(*evaluation, "output", "grpo", "grpo_optim", "sampling"))]


def run(config: Config, run_dir: Path) -> Path:
    """Run (or resume) every stage; write report.md / report.html with the per-stage table and plots."""
    from ...engine.distributed import init_distributed, is_main

    run_dir = Path(run_dir)
    init_distributed()
    results = run_stages(stages(), config, run_dir, config.runner)
    if not is_main():
        return run_dir / "report.md"
    from ...runs.report import claims_summary

    report, claims = write_pipeline_report(run_dir, config, results)
    print(claims_summary(claims))
    return report


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
