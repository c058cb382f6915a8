"""`trajtune dpo` / experiment "hf_dpo": direct preference optimisation (and ipo / simpo / orpo / kto / odpo / rebel,
online DPO).

    trajtune dpo --model runs/sft/model --data pairs.jsonl --beta 0.1 --lora-r 16 --out runs/dpo
    trajtune dpo --loss kto --model M --data thumbs.jsonl --undesirable-weight 1.33 --out runs/kto
    trajtune dpo --model M --data prompts.jsonl --reward my_rewards.py:score --regenerate-every 1 --out runs/online
    trajtune dpo --loss odpo --model M --data scored_pairs.jsonl --odpo-alpha 1.0 --out runs/odpo
    trajtune dpo --loss rebel --model M --data scored_pairs.jsonl --beta 0.1 --out runs/rebel

Data: 'prompt'/'chosen'/'rejected' rows or implicit-prompt 'chosen'/'rejected' (trajtune.sources.data);
only the completions are scored (assistant turns inside the prompt are context, as in TRL).
One stage, "dpo": `train_dpo` against the starting policy (with LoRA: the base model, adapters off).
With --eval-data, held-out pairs give eval/dpo_loss, eval/dpo_margin and eval/dpo_accuracy every
--eval-steps steps, against the same reference (the starting policy's sums on the held-out
pairs, taken before the loop starts). Dropout is off by default (--disable-dropout, TRL's DPOConfig
default). --loss ipo uses summed log-probs (trajtune.algorithms.dpo), not TRL's per-token average.

--loss kto (RLHF book ch.8.2, 11.5): unpaired thumbs-up / down rows, 'prompt'/'completion'/'label' (true / false;
TRL's unpaired preference format; preference rows are unpaired, chosen true and rejected false), trained by
`trajtune.algorithms.kto.train_kto` (--desirable-weight, --undesirable-weight); --eval-data gives eval/kto_loss
and eval/kto_accuracy.

--loss odpo / rebel (RLHF book ch.8.2) read each pair's score difference d: 'score_chosen' - 'score_rejected'
(UltraFeedback-binarized's columns), or a 'margin' column; a pair without either is an error naming its row.
ODPO: -log sigma(beta h - Delta), Delta = --odpo-alpha f(d), f = --odpo-scale log or identity. REBEL: (beta h - d)^2
(beta = 1/eta). Online, d is the two completions' reward difference.

Online DPO (RLHF book ch.8.2): with a reward source -- --reward file.py:fn (TRL's signature), --reward-model DIR,
--reward-judge DIR (--judge-template mt_bench_pair compares the two completions), --rubric FILE, weighted as in
grpo -- --data is prompt rows, and every --regenerate-every steps the current policy samples 2 completions of
--pair-prompts prompts (the sampling section: --max-new-tokens, --temperature ...), the reward source scores them,
the better becomes chosen and the worse rejected (ties skipped: online/ties), and the reference is reset to the
policy of that moment (`trajtune.algorithms.dpo.OnlinePairs`). --eval-data may hold held-out preference pairs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

from ...algorithms.dpo import SCORED_LOSSES, DPOConfig, MissingScores, NoPairs, OnlinePairs, pair_score_diffs, train_dpo
from ...config import ConfigError
from ...algorithms.kto import eval_kto, kto_batches, train_kto
from ...engine import OptimConfig
from ...metrics import register
from .common import announce, check_run, finish, hf_optim, OutputConfig, stage_run
from .recipe import preflight, run_method
from .model import ModelConfig, load_engine
from .options import flag
from .prepare import Prepared, held_out_pairs, kto_data, pair_data, planned, prompt_data
from ...sources.sampling import SamplingConfig
from .graders import check_grader_inputs
from .sampling import PromptRewardRun, check_sampling, prompt_source
from .schedule import ScheduleConfig, check_schedule

register("eval/dpo_loss", "the preference loss (--loss: dpo, dpo_norm, ipo, odpo, rebel, simpo or orpo) on held-out "
                          "pairs (--eval-data)")
register("eval/dpo_margin", "chosen minus rejected implicit reward on held-out pairs: beta (log-ratio chosen - "
                            "log-ratio rejected) for dpo / ipo / odpo / rebel, the SimPO margin for simpo, the log "
                            "odds ratio for orpo")
register("eval/dpo_accuracy", "share of held-out pairs whose chosen completion has the larger implicit reward")


@dataclass
class DPORun(PromptRewardRun):
    METHOD: ClassVar[str] = "dpo"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("dpo.steps", "dpo.eval_every", "schedule.num_train_epochs",
                                            "output.save_every", "model.device", "model.micro_batch_size",
                                            "reward_timeout")
    """options a resumed run may change (more steps, where it runs); any other change is a different run"""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(disable_dropout=True))
    """the model and how it trains (LoRA, precision, lengths; dropout off as in TRL's DPOConfig)"""
    data: str = ""
    """preference rows (--loss kto: labelled rows; online DPO: prompt rows): .jsonl, .json, .parquet or a
    save_to_disk directory (trajtune.sources.data)"""
    eval_data: str = ""
    """held-out preference rows (--loss kto: labelled rows): eval/dpo_loss, eval/dpo_margin, eval/dpo_accuracy
    (eval/kto_loss, eval/kto_accuracy) every --eval-steps steps"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, batch_size=8))
    """the preference loop (steps, batch_size: pairs per step, loss, beta, seed ...)"""
    pair_prompts: int = 8
    """online DPO (a reward source given): prompts sampled each --regenerate-every steps, 2 completions each,
    labelled into at most this many pairs"""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """online DPO: how the completions are sampled (--backend sampler or generate)"""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """epochs instead of steps, warm-up ratio, learning-rate schedule (TRL's names)"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every steps ...)"""

    @property
    def online(self) -> bool:
        """Online DPO: a reward source labels pairs sampled from the policy during training."""
        return bool(self.reward or self.reward_model or self.reward_judge or self.rubric)

    def __post_init__(self) -> None:
        check_run(self, "dpo")
        check_schedule(self, "dpo")
        if isinstance(self.reward_model, str):
            self.reward_model = [self.reward_model] if self.reward_model else []
        every = flag("dpo.regenerate_every")
        if not self.online:
            if self.dpo.regenerate_every:
                raise ValueError(f"dpo: {every} needs a pair generator: a reward source that labels pairs sampled "
                                 "from the policy (online DPO: --reward file.py:fn, --reward-model DIR, --reward-judge "
                                 "DIR or --rubric FILE, with prompt rows in --data); without one, set it to 0")
            return
        check_sampling(self, "dpo", backends=("sampler", "generate"))
        if self.dpo.loss == "kto":
            raise ValueError("dpo: --loss kto trains on labelled rows; online DPO (a reward source) makes pairs: "
                             "choose one")
        if not self.dpo.regenerate_every:
            raise ValueError(f"dpo: online DPO (a reward source: {self._sources()}) samples fresh pairs every "
                             f"{every} steps; give it (1: new pairs every step, as TRL's OnlineDPOTrainer)")
        if self.pair_prompts < 1:
            raise ValueError(f"dpo: {flag('pair_prompts')} must be >= 1, got {self.pair_prompts}")

    def _sources(self) -> str:
        return " ".join([f"--reward {r}" for r in self.reward] + [f"--reward-model {m}" for m in self.reward_model]
                        + ([f"--reward-judge {self.reward_judge}"] if self.reward_judge else [])
                        + ([f"--rubric {self.rubric}"] if self.rubric else []))


Config = DPORun


def prepare(config: DPORun, run_dir: Path) -> Prepared:
    if config.online:  # prompt rows, the reward sources checked; held-out pairs for evaluation
        prepared = prompt_data(config)
        check_grader_inputs(config, prepared.items)
        prepared.eval_items = held_out_pairs(config, prepared) if config.eval_data else []
        return planned(config, prepared, "dpo", config.dpo.batch_size, "prompts")
    if config.dpo.loss == "kto":
        return planned(config, kto_data(config), "dpo", config.dpo.batch_size, "examples")
    prepared = pair_data(config)
    if config.dpo.loss in SCORED_LOSSES:  # every pair (held-out ones too) has its score difference, named if not
        try:
            for pairs in (prepared.items, prepared.eval_items):
                pair_score_diffs(pairs, f"--loss {config.dpo.loss}")
        except MissingScores as e:
            raise ConfigError(str(e)) from None
    return planned(config, prepared, "dpo", config.dpo.batch_size, "pairs")


def _chunks(P: int, size: int):
    """Row indices of a `pair_batch` of P pairs, `size` pairs at a time: chosen rows, then their rejected rows."""
    import torch

    for start in range(0, P, size):
        rows = torch.arange(start, min(start + size, P))
        yield torch.cat([rows, rows + P])


def eval_reference(engine, pairs: Sequence, pad_id: int, size: int) -> list[float]:
    """[2P] summed reference log-probs of the held-out pairs (chosen, then rejected) under the engine's
    policy now. Called before the loop starts, when the engine holds the starting policy -- on a resume
    too: the loop loads the checkpoint (`Run.start`) -- so it is the reference train_dpo uses."""
    import torch

    from ...algorithms.dpo import summed_logps
    from ...trajectory import pair_batch

    full, reference = pair_batch(list(pairs), pad_id), engine.reference_engine()
    sums_2P = torch.zeros(full.size)
    for rows in _chunks(len(pairs), size):
        part = full.select(rows).to(engine.device)
        sums_2P[rows] = summed_logps(reference.forward(part).logprobs, part.action_mask).cpu()
    return sums_2P.tolist()


def eval_pairs(engine, pairs: Sequence, ref_sums: list[float], config: DPOConfig, pad_id: int, size: int) -> dict:
    """The preference loss and its implicit-reward margin and accuracy on held-out pairs (no gradient)."""
    import torch

    from ...algorithms.dpo import pair_set, preference_loss_fn, with_ref_sums

    loss_fn, P = preference_loss_fn(config), len(pairs)
    full = with_ref_sums(pair_set(list(pairs), pad_id, config), torch.tensor(ref_sums))
    ns = {"dpo": "dpo", "dpo_norm": "dpo", "ipo": "dpo", "odpo": "dpo", "simpo": "simpo", "orpo": "orpo",
          "rebel": "rebel"}[config.loss]
    keys = {"loss": "eval/dpo_loss", f"{ns}/accuracy": "eval/dpo_accuracy",
            ("orpo/log_odds_ratio" if ns == "orpo" else f"{ns}/margin"): "eval/dpo_margin"}
    out = dict.fromkeys(keys.values(), 0.0)
    for rows in _chunks(P, size):
        part = full.select(rows).to(engine.device)
        loss, metrics = loss_fn(engine.forward(part), part)
        for key, name in keys.items():
            out[name] += float(loss if key == "loss" else metrics[key]) * len(rows) / (2 * P)  # a mean over pairs
    return out


def train(ctx, c: DPORun, data: Prepared, home: str = "") -> dict:
    """The stage: load the model behind ctx.engine, train_dpo, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    c = dataclasses.replace(c, **data.overrides)  # the steps and lr schedule the data resolved (prepare)
    policy, engine = load_engine(ctx, c.model, c.optim, seed=c.dpo.seed)
    kto = c.dpo.loss == "kto"
    announce(ctx, c, policy, len(data.items), "prompts" if c.online else "examples" if kto else "pairs")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home, config=c)
    if data.eval_items and kto:
        _, _, ref_kto = kto_batches(engine, data.eval_items, data.pad_id)  # before the loop: the starting policy
        run.evaluate = lambda step: eval_kto(engine, data.eval_items, ref_kto, c.dpo, data.pad_id)
    elif data.eval_items:
        size = c.dpo.batch_size or 8
        ref = eval_reference(engine, data.eval_items, data.pad_id, size)  # before the loop: the starting policy
        run.evaluate = lambda step: eval_pairs(engine, data.eval_items, ref, c.dpo, data.pad_id, size)
    if kto:
        history = train_kto(engine, data.items, c.dpo, data.pad_id, run)
    elif c.online:
        from ...runs.stages import RunFailed

        with prompt_source(ctx, engine, data, c, c.dpo.steps) as source:
            pairs = OnlinePairs(source, data.items, c.pair_prompts)
            try:
                history = train_dpo(engine, [], c.dpo, data.pad_id, run, make_pairs=pairs)
            except NoPairs as e:
                raise RunFailed(f"{e} (--pair-prompts, --temperature, --max-new-tokens)") from None
    else:
        history = train_dpo(engine, data.items, c.dpo, data.pad_id, run)
    return finish(ctx, engine, policy, data.tokenizer, history, home, start=c.model.path)


def dry_run(config: DPORun, run_dir: Path) -> str:
    """Every check `run` makes before the model loads, nothing written (`--dry-run`, `trajtune run --dry-run`)."""
    return preflight(config, run_dir, prepare)


def run(config: DPORun, run_dir: Path) -> Path:
    """Check, train, save model/ in the Hugging Face format; returns the report."""
    return run_method(config, run_dir, train, prepare)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
parse_options = None  # no options of its own
