"""Everything a Hugging Face run checks before the model loads (the tokenizer only, seconds).

    the options        the method's config dataclasses (at construction)
    every row          `trajtune.sources.data`: file, line, field
    every length       a sample longer than --max-length (sft/rm/dpo), or a prompt whose tokens +
                       --max-new-tokens exceed it (grpo/rft), is an error naming file, line, field and
                       lengths; --drop-long skips such rows instead (counted on stderr). --max-length is
                       capped at the model's context (`max_position_embeddings` of its config.json).
    --eval-data        the held-out rows (sft/rm/dpo), checked like the training rows
    LoRA targets       without --lora-target-modules, peft must know the architecture's default
    the schedule       --num-train-epochs / --warmup-ratio / --lr-scheduler-type resolved against the
                       rows that fit, and printed (`planned`, trajtune.experiments.hf.schedule)

Each `*_data` function returns a `Prepared`: the tokenizer, the renderer and the items in
the shape the method's loop takes (trajectories, pairs, prompt tasks).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from ...sources import data as D, reward_data as RD
from ...config import ConfigError
from ...engine.distributed import is_main
from .options import flag


@dataclass
class Prepared:
    """What a method's stage trains on, checked."""

    tokenizer: Any
    items: list
    """trajectories (sft), (chosen, rejected) pairs (rm, dpo) or prompt tasks (grpo, rft)"""
    limit: int
    """the length budget in tokens: --max-length, or the model's context where smaller"""
    eval_items: list = field(default_factory=list)
    """the held-out items of --eval-data, in the shape of `items` (empty without it)"""
    overrides: dict = field(default_factory=dict)
    """config sections the data resolved (`planned`: the loop section with its steps, optim with its
    warm-up and decay, the schedule section spent): the stage runs `dataclasses.replace(config, **overrides)`"""
    template_kwargs: dict = field(default_factory=dict)
    """extra chat-template variables (`template_kwargs`: reasoning on / off, effort), for rendering and sampling
    alike"""

    @cached_property
    def renderer(self):
        from ...text.chat import ChatRenderer

        return ChatRenderer(self.tokenizer, template_kwargs=self.template_kwargs)

    @cached_property
    def pad_id(self) -> int:
        return self.renderer.pad_id


def budget(model) -> tuple[int, str]:
    """(tokens, how to say it): --max-length, or the model's context where that is smaller."""
    context = model_context(model.path)
    if context is not None and context < model.max_length:
        return context, (f"the model's context ({context} tokens, max_position_embeddings; "
                         f"--max-length {model.max_length})")
    return model.max_length, f"--max-length {model.max_length}"


def template_kwargs(model) -> dict:
    """The chat-template variables a run sets (RLHF book ch.7.3, toggleable reasoning): `enable_thinking`
    (true / false; Qwen3-style templates) and `reasoning_effort` ('low', 'medium', 'high'; gpt-oss-style) where
    the model section has them and they are set. The renderer refuses a variable its template never reads."""
    out: dict = {}
    if getattr(model, "enable_thinking", None) is not None:
        out["enable_thinking"] = bool(model.enable_thinking)
    if getattr(model, "reasoning_effort", ""):
        out["reasoning_effort"] = model.reasoning_effort
    return out


def _start(config):
    """The tokenizer, renderer, rows and length budget of a run (the first checks: paths, rows)."""
    from ...models.hf import load_tokenizer
    from ...text.chat import ChatRenderer, TemplateError

    check_lora_targets(config.model)
    tokenizer = load_tokenizer(config.model.path)
    kwargs = template_kwargs(config.model)
    try:
        renderer = ChatRenderer(tokenizer, template_kwargs=kwargs)
    except TemplateError as e:  # "--enable-thinking (DIR): ..." where a template variable is refused, else "DIR: ..."
        flags = ", ".join(flag("model." + k) for k in kwargs)
        raise ConfigError(f"{flags} ({config.model.path}): {e}" if flags else f"{config.model.path}: {e}") from None
    return tokenizer, renderer, D.read_rows(config.data), *budget(config.model)


def check_lora_targets(model) -> None:
    """With --lora-r and no --lora-target-modules, peft picks the architecture's default layers; refuse
    an architecture peft has no default for, before the model loads."""
    if not model.lora_r or model.lora_target_modules:
        return
    try:
        kind = json.loads((Path(model.path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return  # the model's own checks say what is wrong with its directory
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if kind not in DEFAULTS:
        raise ConfigError(f"--lora-r {model.lora_r}: peft has no default LoRA layers for model_type {kind!r} "
                          f"({model.path}); name them with {flag('model.lora_target_modules')} (e.g. q_proj v_proj, "
                          "or all-linear)")


def sft_data(config) -> Prepared:
    """'messages' / 'prompt'+'completion' rows -> SFT trajectories that fit the budget (and --eval-data's)."""
    tokenizer, renderer, rows, limit, said = _start(config)

    def trajectories(rows, noun):
        field_of = {r.where: "messages" if "messages" in r.data else "prompt+completion" for r in rows}

        def too_long(t):
            where = t.info["source"]
            return f"{where}: field {field_of.get(where, 'messages')!r}: {len(t)} tokens" if len(t) > limit else None

        return fit(D.sft_trajectories(rows, renderer, config.sft.train_on), said, config.model.drop_long, too_long,
                   noun)

    held_out = trajectories(D.read_rows(config.eval_data), "evaluation samples") if config.eval_data else []
    return Prepared(tokenizer, trajectories(rows, "samples"), limit, held_out, template_kwargs=renderer.template_kwargs)


def pair_data(config) -> Prepared:
    """Preference rows -> (chosen, rejected) pairs whose longer side fits the budget (and --eval-data's)."""
    tokenizer, renderer, rows, limit, said = _start(config)

    def too_long(pair):
        (chosen, rejected), n = pair, max(len(pair[0]), len(pair[1]))
        side = "chosen" if len(chosen) >= len(rejected) else "rejected"
        return (f"{chosen.info['source']}: field {side!r}: {n} tokens (chosen {len(chosen)}, rejected "
                f"{len(rejected)}, prompt included)" if n > limit else None)

    def pairs(rows, noun):
        kept = fit(D.preference_pairs(rows, renderer), said, config.model.drop_long, too_long, noun)
        warn_identical(kept, "pairs" if noun == "samples" else noun)
        return kept

    held_out = pairs(D.read_rows(config.eval_data), "evaluation pairs") if config.eval_data else []
    return Prepared(tokenizer, pairs(rows, "samples"), limit, held_out, template_kwargs=renderer.template_kwargs)


def kto_data(config) -> Prepared:
    """KTO's rows (`trajtune dpo --loss kto`): 'prompt'/'completion'/'label' rows, or preference rows unpaired
    (chosen desirable, rejected undesirable) -> (episode, desirable) examples that fit the budget (and
    --eval-data's)."""
    tokenizer, renderer, rows, limit, said = _start(config)

    def too_long(example):
        t = example[0]
        return f"{t.info['source']}: field 'completion': {len(t)} tokens (prompt included)" if len(t) > limit else None

    def examples(rows, noun):
        kept = fit(RD.kto_examples(rows, renderer), said, config.model.drop_long, too_long, noun)
        if len(kept) < 2:
            raise D.DataError(f"KTO needs at least 2 {noun} (a completion is compared with another row's prompt: "
                              f"the reference point), got {len(kept)}")
        return kept

    held_out = examples(D.read_rows(config.eval_data), "evaluation samples") if config.eval_data else []
    return Prepared(tokenizer, examples(rows, "samples"), limit, held_out, template_kwargs=renderer.template_kwargs)


def held_out_pairs(config, prepared: Prepared) -> list:
    """--eval-data's preference pairs for a run whose --data is not pairs (online DPO), checked like pair_data's."""
    limit, said = budget(config.model)

    def too_long(pair):
        n = max(len(pair[0]), len(pair[1]))
        return (f"{pair[0].info['source']}: field 'chosen'/'rejected': {n} tokens (prompt included)" if n > limit
                else None)

    pairs = fit(D.preference_pairs(D.read_rows(config.eval_data), prepared.renderer), said, config.model.drop_long,
                too_long, "evaluation pairs")
    warn_identical(pairs, "evaluation pairs")
    return pairs


def split_rows(rows: list, share: float, seed: int, swap: bool = False) -> tuple[list, list]:
    """(train, held-out) rows: a `share` of the rows held out, chosen by a shuffle seeded with `seed` (the same
    rows for the same seed); `swap` trains on the held-out share and holds out the rest (the other half of
    --eval-split 0.5: a second, "gold" reward model on data the first never saw)."""
    import random

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    k = round(share * len(rows))
    if share and not 0 < k < len(rows):
        raise D.DataError(f"--eval-split {share} of {len(rows)} rows leaves "
                          f"{'no held-out' if k == 0 else 'no training'} rows")
    held, train = sorted(order[:k]), sorted(order[k:])
    train_rows, held_rows = [rows[i] for i in train], [rows[i] for i in held]
    return (held_rows, train_rows) if swap else (train_rows, held_rows)


def reward_model_data(config) -> Prepared:
    """`trajtune rm`'s rows -> what its objective trains on, each fitting the budget (and the held-out rows of
    --eval-data or --eval-split):

        bt              preference rows -> (chosen, rejected) pairs; ranked rows ('completions') -> ranked lists
        plackett-luce   ranked rows (and preference rows, as K = 2) -> ranked lists, best first
        orm             labelled rows ('label') -> (episode, per-token labels: the label on every completion token)
        prm             stepwise rows ('completions' steps, 'labels') -> (episode, a label on each step's last token)
    """
    from ...algorithms.reward_model import outcome_labels, process_labels

    tokenizer, renderer, rows, limit, said = _start(config)
    objective = config.rm.objective
    if config.eval_split:
        rows, held_rows = split_rows(rows, config.eval_split, config.split_seed, config.split_swap)
    else:
        held_rows = D.read_rows(config.eval_data) if config.eval_data else []
    ranked = objective == "plackett-luce" or (objective == "bt" and any("completions" in r.data for r in rows))
    if (ranked or objective in ("orm", "prm")) and config.rm.margin:
        raise ConfigError(f"--margin {config.rm.margin}: the Bradley-Terry margin applies to pairs (--objective bt on "
                          f"preference rows), not to {'ranked lists' if ranked else objective + ' rows'}")
    if ranked:
        with_margin = next((r for r in rows + held_rows if r.data.get("margin") is not None), None)
        if with_margin is not None:
            raise D.DataError(f"{with_margin.where}: field 'margin': a per-pair margin applies to pairs trained as "
                              "pairs, "
                              "but this file has ranked rows (trained as lists); drop the column or the ranked rows")

    def convert(rows: list, noun: str) -> list:
        if objective == "orm":
            items = [(t, outcome_labels(t, y)) for t, y in RD.labelled_examples(rows, renderer)]
            length = lambda x: (len(x[0]), x[0].info["source"], "completion")  # noqa: E731
        elif objective == "prm":
            items = [(t, process_labels(t, y)) for t, y in RD.stepwise_examples(rows, renderer, config.step_separator)]
            length = lambda x: (len(x[0]), x[0].info["source"], "completions")  # noqa: E731
        elif ranked:
            items = RD.ranked_lists(rows, renderer)
            length = lambda x: (max(len(t) for t in x), x[0].info["source"], "completions")  # noqa: E731
        else:
            items = D.preference_pairs(rows, renderer)
            length = lambda x: (max(len(x[0]), len(x[1])), x[0].info["source"], "chosen/rejected")  # noqa: E731

        def too_long(item):
            n, where, name = length(item)
            return f"{where}: field {name!r}: {n} tokens (prompt included)" if n > limit else None

        kept = fit(items, said, config.model.drop_long, too_long, noun)
        if objective == "bt" and not ranked:
            warn_identical(kept, "pairs" if noun == "samples" else noun)
        return kept

    held_out = convert(held_rows, "evaluation samples") if held_rows else []
    return Prepared(tokenizer, convert(rows, "samples"), limit, held_out, template_kwargs=renderer.template_kwargs)


def warn_identical(pairs: list, noun: str = "pairs", show: int = 3) -> None:
    """Say on stderr (rank 0) how many pairs have the same tokens on both sides: a pair whose chosen and
    rejected are one sequence has no preference, so its preference term gives no gradient (DPO, IPO, SimPO,
    a reward model; ORPO's and DPO + NLL's likelihood term still trains on it). Usually a data bug (a join
    that copied one column twice), so it is said before any step, not an error."""
    same = [c.info.get("source", "?") for c, r in pairs if c.ids == r.ids and c.owners == r.owners]
    if same and is_main():
        more = f" ... and {len(same) - show} more" if len(same) > show else ""
        print(f"trajtune: warning: {len(same)} of {len(pairs)} {noun} have identical 'chosen' and "
              f"'rejected' ({', '.join(same[:show])}{more}): they carry no preference", file=sys.stderr)


def planned(config, prepared: Prepared, loop: str, per_step: int, noun: str) -> Prepared:
    """Resolve the schedule section against the rows that fit (`schedule.resolve`), print what it amounts
    to (rank 0), and record the resolved sections in `prepared.overrides`."""
    from .schedule import ScheduleConfig, resolve

    section, optim, line = resolve(config, loop, len(prepared.items), per_step, noun)
    prepared.overrides = {loop: section, "optim": optim, "schedule": ScheduleConfig()}
    if is_main():
        print(f"trajtune {config.METHOD}: {line}", flush=True)
    return prepared


def prompt_data(config) -> Prepared:
    """Prompt rows -> tasks whose prompt + --max-new-tokens fits the budget (the reward functions are
    checked against them by grpo / rft's own prepare: trajtune.experiments.hf.graders.check_grader_inputs)."""
    tokenizer, renderer, rows, limit, said = _start(config)
    new = config.sampling.max_new_tokens
    lengths = prompt_lengths(D.prompt_tasks(rows), renderer)

    def too_long(task):
        n = lengths[task] + new
        if n <= limit:
            return None
        return f"{task.where}: field 'prompt': {lengths[task]} tokens + --max-new-tokens {new} = {n}"

    return Prepared(tokenizer, fit(list(lengths), said, config.model.drop_long, too_long, noun="prompts"), limit,
                    template_kwargs=renderer.template_kwargs)


def model_context(model_dir: str | Path) -> int | None:
    """The model's context length (`max_position_embeddings` in its config.json, also under
    `text_config`), or None where the file does not say."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        n = c.get("max_position_embeddings") if isinstance(c, dict) else None
        if isinstance(n, int) and n > 0:
            return n
    return None


def prompt_lengths(tasks: list, renderer) -> dict:
    """task -> tokens the sampler is given for its first turn (the rollout's own measure:
    the opening messages plus the generation prompt); a prompt the template cannot start
    from (e.g. one ending in an assistant turn) is a DataError naming its row."""
    from ...text.chat import TemplateError

    out = {}
    for t in tasks:
        opening = [{"role": "user", "content": t.prompt}] if isinstance(t.prompt, str) else t.prompt
        try:
            out[t] = len(renderer.prompt_ids(renderer.start(opening)))
        except TemplateError as e:
            raise D.DataError(f"{t.where}: field 'prompt': {e}") from e
    return out


def fit(items: list, budget: str, drop_long: bool, too_long: Callable, noun: str = "samples", show: int = 5) -> list:
    """Check every item against the length budget before any work (never truncate: the end carries
    the answer). `too_long(item)` is None, or 'file:line: field ...: lengths' for an item that does not
    fit. Any such item is an error listing the first `show`, unless `drop_long` skips them."""
    verdicts = [(x, too_long(x)) for x in items]
    bad = [m for _, m in verdicts if m]
    if bad and not drop_long:
        more = f"\n  ... and {len(bad) - show} more" if len(bad) > show else ""
        raise D.DataError(f"{len(bad)} of {len(items)} {noun} do not fit {budget}:\n  " + "\n  ".join(bad[:show])
                          + more + "\nshorten or remove these rows, raise --max-length (up to the model's context), "
                          "or pass --drop-long to skip them")
    kept = [x for x, m in verdicts if not m]
    if bad and is_main():
        print(f"trajtune: skipped {len(bad)} of {len(items)} {noun} longer than {budget} (--drop-long)",
              file=sys.stderr)
    if not kept:
        raise D.DataError(f"no {noun[:-1]} fits {budget}")
    return kept
