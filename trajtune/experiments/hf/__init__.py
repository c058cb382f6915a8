"""Hugging Face runs as recipes: post-train a local `transformers` causal LM with one method.

    method  experiment  module   config           stage  loop
    sft     hf_sft      sft.py   SFTRun           sft    train_sft           (model/)
    rm      hf_rm       rm.py    RewardModelRun   rm     train_reward_model, train_ranked_reward_model,
                                                         train_token_reward_model by --objective
                                                         (model/ + value_head.safetensors + reward_model.json)
    dpo     hf_dpo      dpo.py   DPORun           dpo    train_dpo
    grpo    hf_grpo     grpo.py  GRPORun          grpo   train_rl            (a reward function)
    rft     hf_rft      rft.py   RFTRun           rft    train_rft           (a reward function)

`trajtune rm-eval` (rm_eval.py) scores a saved reward model on held-out pairs without a run directory.
grpo / rft / online dpo score with the graders their options name (graders.py: the registry `GRADERS`, option ->
grader kind; sampling.py: how they sample).

What the methods share: model.py (the model section: LoRA, precision, memory, lengths), sampling.py (grpo / rft:
the sampling section, the rewards, the source), schedule.py (epochs or steps, the learning-rate schedule),
options.py (one flag per config field), prepare.py (every check before the model loads), recipe.py (the recipe
path: `run_method`, `preflight`), common.py (the stage's plumbing: snapshots, the final save, `weight_change`).

Each config is a model section (`ModelConfig`: path, LoRA, precision, checkpointing,
device, lengths), the data file, the loop's own dataclass nested whole (`sft: SFTConfig`,
`rl: RLConfig` ...), `optim: OptimConfig` and `output: OutputConfig` -- so every loop setting is
reachable and validated once, from a TOML recipe

    experiment = "hf_grpo"
    [config]
    data = "prompts.jsonl"
    reward = "my_rewards.py:exact"
    [config.model]
    path = "runs/sft/model"
    [config.rl]
    kl_coef = 0.05

and from the command line, `trajtune grpo --model runs/sft/model --data prompts.jsonl
--reward my_rewards.py:exact --kl-coef 0.05` (trajtune/cli/hf.py generates one flag per
leaf field, `options.py`): the same config, the same run.

The recipe path (`recipe.run_method`): the run directory's policy (`trajtune.runs.rundir`: a
changed option on resume refused, naming it), every check before the model loads (`prepare.py`:
the rows with file:line:field, every length against --max-length and the model's context,
--drop-long; each method's `dry_run` makes them alone), config.json, then one stage through
`trajtune.runs.stages.run_stages` (engines through `ctx.engine`: DDP under torchrun, samples
sharded). The run directory:

    metrics.jsonl, config.json
    report.md, report.html, report-*.png   first the reward sources and settings (`recipe.settings_text`) and how
                           far the weights moved (`common.weight_change`), a line for each way the run learned nothing
                           (no reward variance in any group, most completions cut at --max-new-tokens, a loss that
                           never moved, gradient norm 0, the saved model equal to its input:
                           `runs.metrics_report.run_warnings`; the command's terminal output ends with the same lines
                           on stderr), a few sampled
                           completions of the first and last recorded steps, the key metrics; then the curves (loss,
                           reward, KL, accuracy, lr, eval; a metric that never changed written as its value)
    view.html              grpo, rft: the recorded episodes token by token (`runs.view`), linked from the report
    model/                 AutoModelForCausalLM.from_pretrained loads it (LoRA merged; adapter in model/adapter;
                           a reward model also loads with AutoModelForSequenceClassification)
    checkpoints/step-N/    the same, every output.save_every steps (the newest output.save_total_limit kept)
    <method>/resume/       the resume state of a run cut short (Ctrl-C / SIGTERM, or every output.save_every)
    <method>/results.json  the finished stage (its weight_change against the input model included)
    .lock                  held by the run while it lives (a second run here is refused, naming the holder)
    tb/, wandb/            --report-to tensorboard / wandb
"""

METHODS = {
    "sft": "trajtune.experiments.hf.sft",
    "rm": "trajtune.experiments.hf.rm",
    "dpo": "trajtune.experiments.hf.dpo",
    "grpo": "trajtune.experiments.hf.grpo",
    "rft": "trajtune.experiments.hf.rft",
}
"""method (the command) -> the module with its `Config` and `run(config, run_dir)` (experiment 'hf_<method>')"""
