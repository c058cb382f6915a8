"""Reward-model and KTO data: ranked lists, outcome labels, step labels (book ch.5, ch.11.5).

The row formats (`sources.data` reads the rows and checks their fields):

    ranked     prompt, completions: [K >= 2 strings or assistant messages], best first, or with
               scores: [K numbers] (higher is better)   -> `ranked_lists` (plackett-luce; bt: all pairs);
               a preference row is a list of K = 2
    labelled   prompt, completion, label: 0/1 or bool (TRL's unpaired format)
                                                -> (episode, label): an outcome reward model (orm, `labelled_examples`),
                                                   or KTO's thumbs up / down (`kto_examples`)
    stepwise   prompt, completions: [steps], labels: [one 0/1 or bool per step] (TRL's stepwise format)
                                                -> (episode, step labels): a process reward model (prm,
                                                   `stepwise_examples`); the steps are joined by a separator into one
                                                   assistant message and each step's label sits on its last token
                                                   (`step_trajectory`)
"""

from __future__ import annotations

from typing import Any, Sequence

from ..text.chat import ChatRenderer
from ..trajectory import Owner, Trajectory
from .data import (DataError, Row, conversation, preference_pairs, render_row, row_field, row_messages,
                   row_number)


def _binary(row: Row, name: str, value: Any, index: int | None = None) -> int:
    """A 0/1 label: true, false, 0 or 1."""
    where = f"{name!r}" if index is None else f"{name!r}[{index}]"
    if isinstance(value, bool) or value in (0, 1):
        return int(value)
    raise DataError(f"{row.where}: field {where} must be 0, 1, true or false, got {value!r}")


def ranked_lists(rows: Sequence[Row], renderer: ChatRenderer) -> list[list[Trajectory]]:
    """Ranked rows (and preference rows, as K = 2 lists) -> each prompt's completions rendered, best first.

    A ranked row: 'prompt' and 'completions' (K >= 2), best first, or with 'scores' (K numbers, higher is
    better; equal scores keep the row's order)."""
    out = []
    for row in rows:
        if "chosen" in row.data or "rejected" in row.data:
            out.append(list(preference_pairs([row], renderer)[0]))
            continue
        prompt = row_messages(row, "prompt", row_field(row, "prompt"), "user")
        completions = row_field(row, "completions")
        if not isinstance(completions, list) or len(completions) < 2:
            raise DataError(f"{row.where}: field 'completions' must be a list of at least 2 completions (a ranked "
                            f"list, best first), got {type(completions).__name__}"
                            + (f" of {len(completions)}" if isinstance(completions, list) else ""))
        order = list(range(len(completions)))
        if row.data.get("scores") is not None:
            scores = row.data["scores"]
            if not isinstance(scores, list) or len(scores) != len(completions):
                raise DataError(f"{row.where}: field 'scores' must be a list of {len(completions)} numbers (one per "
                                "completion)")
            values = [row_number(row, "scores", v, i) for i, v in enumerate(scores)]
            order.sort(key=lambda i: -values[i])
        ranked = []
        for i in order:
            samples = render_row(renderer, row, prompt + row_messages(row, f"completions[{i}]", completions[i],
                                                                      "assistant"),
                              len(prompt))
            if not samples:
                raise DataError(f"{row.where}: field 'completions'[{i}] has no assistant message to score")
            ranked.append(samples[-1])
        out.append(ranked)
    return out


def labelled_examples(rows: Sequence[Row], renderer: ChatRenderer) -> list[tuple[Trajectory, int]]:
    """'prompt'/'completion' (or 'messages') rows with a 0/1 'label' -> (episode, label): an outcome reward
    model's data (the label is the completion's correctness, copied onto its tokens by the loop)."""
    out = []
    for row in rows:
        if "label" not in row.data or row.data["label"] is None:
            raise DataError(f"{row.where}: missing field 'label' (0/1 or true/false: is the completion correct?)")
        label = _binary(row, "label", row.data["label"])
        samples = render_row(renderer, row, *conversation(row))
        if not samples:
            raise DataError(f"{row.where}: no assistant message to score")
        out.append((samples[-1], label))
    return out


def kto_examples(rows: Sequence[Row], renderer: ChatRenderer) -> list[tuple[Trajectory, bool]]:
    """KTO's data (RLHF book ch.11.5, thumbs up / down; TRL's unpaired preference format) -> (episode, desirable):
    'prompt' / 'completion' (or 'messages') rows with a 'label' (true / false, 1 / 0), each its own example; a
    preference row gives two, its 'chosen' desirable and its 'rejected' undesirable (how TRL unpairs pairs)."""
    out: list[tuple[Trajectory, bool]] = []
    for row in rows:
        if "chosen" in row.data or "rejected" in row.data:
            chosen, rejected = preference_pairs([row], renderer)[0]
            out += [(chosen, True), (rejected, False)]
        elif "label" not in row.data or row.data["label"] is None:
            raise DataError(f"{row.where}: missing field 'label' (true: a thumbs-up completion, false: thumbs-down); "
                            "KTO reads 'prompt'/'completion'/'label' rows or 'prompt'/'chosen'/'rejected' pairs")
        else:
            out += [(t, bool(y)) for t, y in labelled_examples([row], renderer)]
    return out


def _encode(renderer, text: str) -> list[int]:
    """`text`'s token ids without special tokens (a Hugging Face tokenizer, or a toy tokenizer's encode)."""
    tok = renderer.tokenizer
    if hasattr(tok, "encode") and not callable(getattr(tok, "apply_chat_template", None)):
        return list(tok.encode(text))
    return list(tok(text, add_special_tokens=False)["input_ids"])


def step_trajectory(renderer, prompt: list[dict], steps: Sequence[str], separator: str, where: str = "") -> Trajectory:
    """One assistant message of `steps` joined by `separator`, rendered after `prompt`, with
    info['step_ends']: the position of the last token of each step (the separator that follows it; the last
    step's: the turn's last POLICY token, its end). A DataError (naming `where`) when the tokenizer merges a
    step's separator with the text after it, so that no token ends the step."""
    content = separator.join(steps)
    samples = renderer.render_samples(prompt + [{"role": "assistant", "content": content}],
                                      info={"source": where}, context=len(prompt))
    if not samples:
        raise DataError(f"{where}: no assistant message to score")
    traj = samples[-1]
    policy = [i for i, o in enumerate(traj.owners) if o == Owner.POLICY]
    ids = [traj.ids[i] for i in policy]
    whole = _encode(renderer, content)
    at = next((j for j in range(len(ids) - len(whole) + 1) if ids[j : j + len(whole)] == whole), None)
    if at is None:
        raise DataError(f"{where}: the steps' tokens differ inside the rendered conversation (the chat template "
                        "changes the completion's text); cannot place the step labels")
    ends = []
    for k in range(len(steps) - 1):
        prefix = _encode(renderer, separator.join(steps[: k + 1]) + separator)
        if whole[: len(prefix)] != prefix:
            raise DataError(f"{where}: step {k}'s last token is merged with the next step's text by the tokenizer "
                            f"(separator {separator!r}); choose a separator the tokenizer ends a token on, e.g. '\\n'")
        ends.append(policy[at + len(prefix) - 1])
    ends.append(policy[-1])
    traj.info["step_ends"] = ends
    return traj


def split_steps(text: str, separator: str) -> list[str]:
    """A completion's steps: its text cut at `separator` (empty pieces dropped; at least the whole text)."""
    steps = [s for s in text.split(separator) if s.strip()]
    return steps or [text]


def stepwise_examples(rows: Sequence[Row], renderer, separator: str = "\n") -> list[tuple[Trajectory, list[int]]]:
    """Stepwise rows ('prompt', 'completions': steps, 'labels': one 0/1 per step) -> (episode with
    info['step_ends'], step labels): a process reward model's data (`step_trajectory`)."""
    if not separator:
        raise DataError("the step separator must not be empty")
    out = []
    for row in rows:
        prompt = row_messages(row, "prompt", row_field(row, "prompt"), "user")
        steps, labels = row_field(row, "completions"), row_field(row, "labels")
        if not isinstance(steps, list) or not steps:
            raise DataError(f"{row.where}: field 'completions' must be a non-empty list of step strings")
        for i, step in enumerate(steps):
            if not isinstance(step, str) or not step.strip():
                raise DataError(f"{row.where}: field 'completions'[{i}] must be a non-empty string (one step)")
            if separator in step:
                raise DataError(f"{row.where}: field 'completions'[{i}] contains the step separator {separator!r}")
        if not isinstance(labels, list) or len(labels) != len(steps):
            raise DataError(f"{row.where}: field 'labels' must be a list of {len(steps)} labels (one per step), got "
                            f"{labels!r}")
        y = [_binary(row, "labels", v, i) for i, v in enumerate(labels)]
        out.append((step_trajectory(renderer, prompt, steps, separator, row.where), y))
    return out
