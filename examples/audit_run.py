"""Audit what a policy learned to say: the RLHF book's over-optimization signatures (ch.14.5) and a verbosity check
(ch.11.7) over the episodes a run recorded, first recorded step against last.

    python examples/audit_run.py RUN_DIR          # every RUN_DIR/<stage>/episodes.jsonl (the RL and RFT stages')

A reward can rise while the policy learns the grader's weak spots instead of the task. For each stage and for its
first and last recorded step this prints, over the recorded completions (`trajtune.audits`): the share showing
each of the book's qualitative signs (`signature_shares`: "As an AI language model", "Certainly!", apologies,
hedging, refusals, sycophancy), the mean share of repeated word 3-grams (`repetition`: a loop the grader likes),
the mean largest share of one token id (`max_token_share`: rare-token spam), the share formatted as lists
(`list_share`), and the Spearman correlation of reward with completion length (`length_bias`: a grader that pays
for length). A sign that grows from the first step to the last while the held-out score does not is the
over-optimization the book describes; the numbers alone judge nothing.

A completion's text is what the environment saw (the episode's `info["actions"]`, one per turn), else its POLICY
tokens decoded by the stage's tokenizer (`trajtune.runs.decoders`), else the token ids as numbers.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from trajtune.audits import SIGNATURES, length_bias, list_share, max_token_share, repetition, signature_shares
from trajtune.runs.decoders import stage_decoders
from trajtune.runs.recorder import FILE, read_episodes
from trajtune.trajectory import Owner


def completion(row: dict, decoder) -> tuple[str, list[int]]:
    """(text, POLICY token ids) of one recorded episode."""
    ids = [i for i, o in zip(row.get("ids") or [], row.get("owners") or []) if o == int(Owner.POLICY)]
    actions = (row.get("info") or {}).get("actions")
    if actions:
        return "\n".join(map(str, actions)), ids
    return ("".join(decoder.texts(ids)[0]) if decoder is not None else " ".join(map(str, ids))), ids


def audit(rows: list[dict], decoder) -> dict[str, float]:
    """The audit of one step's recorded episodes."""
    said = [completion(r, decoder) for r in rows]
    texts = [t for t, _ in said]
    out: dict[str, float] = dict(signature_shares(texts))
    out["repetition"] = sum(repetition(t) for t in texts) / len(texts)
    out["max_token_share"] = sum(max_token_share(ids) for _, ids in said if ids) / max(1, sum(bool(ids) for _, ids in
                                                                                              said))
    out["list_share"] = list_share(texts)
    rewards = [r.get("reward") for r in rows]
    if len(rows) > 1 and all(isinstance(x, (int, float)) for x in rewards):
        out["reward_length_spearman"] = length_bias(rewards, [len(t) for t in texts])["spearman"]
    return out


def main(run_dir: str | Path, verbose: bool = True) -> dict[tuple[str, int], dict[str, float]]:
    """{(stage, step): audit} for the first and last recorded step of every stage of `run_dir`."""
    run_dir = Path(run_dir)
    rows = [r for f in sorted(run_dir.glob(f"*/{FILE}")) for r in read_episodes(f)]
    if not rows:
        raise SystemExit(f"{run_dir}: no */{FILE} (only the RL and RFT stages record episodes)")
    stages = list(dict.fromkeys(str(r.get("stage")) for r in rows))
    ids = {s: [r["ids"] for r in rows if str(r.get("stage")) == s] for s in stages}
    decoders = stage_decoders(run_dir, stages, None, ids)
    out = {}
    for stage in stages:
        mine = [r for r in rows if str(r.get("stage")) == stage]
        steps = sorted({int(r.get("step", 0)) for r in mine})
        for step in dict.fromkeys([steps[0], steps[-1]]):
            out[(stage, step)] = audit([r for r in mine if int(r.get("step", 0)) == step], decoders[stage][0])
    if verbose:
        keys = [*SIGNATURES, "repetition", "max_token_share", "list_share", "reward_length_spearman"]
        print(f"{'':24}" + "".join(f"{stage} step {step}".rjust(18) for stage, step in out))
        for key in keys:
            cells = [a.get(key, math.nan) for a in out.values()]
            print(f"{key:24}" + "".join(f"{v:18.3f}" for v in cells))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a run directory with recorded episodes (<stage>/episodes.jsonl)")
    main(ap.parse_args().run_dir)
