"""AI feedback as data: preference labels and SFT data made by a model (RLHF book ch.12 "AI Feedback" and
"Constitutional AI", ch.11 "Rankings vs. Ratings", ch.5 margins; checklist 12.11-12.13, 11.1-11.2).

    RLAIF labels        `rlaif_pairs`: a judge's pairwise labels, each pair judged in both positions
                        (`Judge.compare`); ties -- a [[C]] verdict or two verdicts that disagree -- and
                        unparseable verdicts are dropped and counted (`label_pairs`, pure)
    CAI, SFT data       `constitutional_revisions`: sample a principle c_i from the constitution, ask the model
                        to critique its latest response y^i by it and to revise: y^i -> y^{i+1}; n rounds;
                        keep (x, y^n) (ch.12 "Constitutional AI")
    CAI, preferences    `choice_logprobs` + `soft_labels`: the feedback model sees x, principles and completions
                        labelled (A) / (B); the label is P(A) vs P(B) as next-token probabilities after the
                        feedback prompt (the original "The answer is: " form) -- a soft label, not just a choice
    constraint pairs    `constraint_pairs` (ch.11.4, IFEval style): chosen generated with the constraint in the prompt,
                        rejected generated without it; the stored prompt holds the constraint
    ratings -> pairs    `likert_label` (5- and 8-point Likert scales, binarized, with the preference's strength)
                        and `ultrafeedback_pairs` (the highest-rated completion vs a random lower-rated one; the
                        rating difference is Llama 2's margin m(y_c, y_r), e.g. 5 - 2 = 3)

The judge and the generating model are duck-typed (an object with `compare`, a `generate(conversations)`
callable) so this module sees no source or model (tests/unit/test_layout.py); `choice_logprobs` uses the engine
through its Protocol. Every stochastic step takes a `torch.Generator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch

from ..engine import Engine
from ..trajectory import Owner, Trajectory, collate

Conversation = list[dict[str, str]]


# --- RLAIF: pairwise labels from a judge -------------------------------------------------------
@dataclass
class AILabels:
    """What a judge's pairwise labels give: the kept pairs and what was dropped."""

    pairs: list[tuple[int, str, str]] = field(default_factory=list)
    """(index of the item, chosen, rejected) for every item with a winner"""
    ties: int = 0
    """items dropped as ties ([[C]], or swapped verdicts that disagreed)"""
    unparseable: int = 0
    """items dropped because a verdict could not be read"""

    @property
    def n(self) -> int:
        return len(self.pairs) + self.ties + self.unparseable


def label_pairs(verdicts: Sequence[str | None], answers_a: Sequence[str], answers_b: Sequence[str]) -> AILabels:
    """Pairs from swap-consistent verdicts ("A", "B", "tie", None), ties and unparseable ones dropped and counted.
    label_pairs(["A", "tie", "B", None], ["a1", "a2", "a3", "a4"], ["b1", "b2", "b3", "b4"]) keeps
    [(0, "a1", "b1"), (2, "b3", "a3")] with ties 1 and unparseable 1."""
    out = AILabels()
    for i, (v, a, b) in enumerate(zip(verdicts, answers_a, answers_b, strict=True)):
        if v is None:
            out.unparseable += 1
        elif v == "tie":
            out.ties += 1
        elif v in ("A", "B"):
            out.pairs.append((i, a, b) if v == "A" else (i, b, a))
        else:
            raise ValueError(f"label_pairs: item {i}: verdict {v!r} is not A, B, tie or None")
    return out


def rlaif_pairs(judge, questions: Sequence[str], answers_a: Sequence[str], answers_b: Sequence[str]) -> AILabels:
    """RLAIF labels: `judge.compare` (both positions, greedy; `trajtune.sources.judge.Judge`), then `label_pairs`.
    The judge's `metrics` keep its inconsistent and unparseable shares."""
    return label_pairs(judge.compare(questions, answers_a, answers_b), answers_a, answers_b)


# --- Constitutional AI: critique -> revise ----------------------------------------------------
CRITIQUE_REQUEST = ("Critique your last response according to this principle: {principle}\n"
                    "Point out, briefly, where it falls short of it.")
"""the critique turn (our wording; Bai et al. 2022 write one critique request per principle)"""
REVISION_REQUEST = "Now rewrite your response so that it follows the principle. Reply with the new response only."
"""the revision turn"""


@dataclass
class Revision:
    """One prompt's critique -> revise chain: (x, y^n) is the SFT example."""

    prompt: str
    response: str
    """y^n, the last revision"""
    history: list[dict] = field(default_factory=list)
    """per round: principle, critique, revision (y^0 is `first`)"""
    first: str = ""
    """y^0"""


def constitutional_revisions(generate: Callable[[list[Conversation]], list[str]], prompts: Sequence[str],
                             responses: Sequence[str], constitution: Sequence[str], rounds: int,
                             generator: torch.Generator) -> list[Revision]:
    """Constitutional AI's SFT data (book ch.12): for each of `rounds` rounds and each prompt x with its latest
    response y^i, sample a principle c_i uniformly from `constitution` (with `generator`: one draw per prompt and
    round), ask for a critique of y^i by c_i, then for a revision y^{i+1}. `generate(conversations) -> replies`
    answers a batch of conversations (the model under critique, e.g. greedy `engine.sample`); every round is
    two batched calls. Returns one `Revision` per prompt; its (prompt, response) is the SFT example (x, y^n)."""
    if not constitution:
        raise ValueError("constitutional_revisions: the constitution has no principles")
    if rounds < 1:
        raise ValueError(f"constitutional_revisions: rounds must be >= 1, got {rounds}")
    out = [Revision(x, y, [], y) for x, y in zip(prompts, responses, strict=True)]
    for _ in range(rounds):
        picks = torch.randint(len(constitution), (len(out),), generator=generator).tolist()  # [N] c_i per prompt
        base = [[{"role": "user", "content": r.prompt}, {"role": "assistant", "content": r.response}] for r in out]
        asks = [b + [{"role": "user", "content": CRITIQUE_REQUEST.format(principle=constitution[k])}]
                for b, k in zip(base, picks, strict=True)]
        critiques = generate(asks)
        revised = generate([a + [{"role": "assistant", "content": c}, {"role": "user", "content": REVISION_REQUEST}]
                            for a, c in zip(asks, critiques, strict=True)])
        for r, k, c, y in zip(out, picks, critiques, revised, strict=True):
            r.history.append({"principle": constitution[k], "critique": c, "revision": y})
            r.response = y
    return out


# --- Constitutional AI: preference labels from next-token probabilities -------------------------------
def feedback_messages(question: str, answer_a: str, answer_b: str, principles: Sequence[str]) -> Conversation:
    """The feedback model's conversation (book ch.12: x, a subset of principles, completions labelled (A) and
    (B)); continue the generation prompt with "The answer is: " and read P(A) vs P(B) (`choice_logprobs`)."""
    rules = "\n".join(f"- {p}" for p in principles)
    return [{"role": "user", "content": f"Consider this conversation:\nHuman: {question}\n\nWhich response is better "
                                        f"and follows these principles more closely?\n{rules}\n\n(A) {answer_a}\n"
                                        f"(B) {answer_b}\n\nAnswer with (A) or (B)."}]


@torch.no_grad()
def choice_logprobs(engine: Engine, prompts: Sequence[Sequence[int]], choice_ids: Sequence[int],
                    pad_id: int) -> torch.Tensor:
    """Next-token log-probs of each choice token after each prompt: [N] prompts, [K] choice token ids ->
    [N, K] log pi(choice_k | prompt_n) (over the whole vocabulary, so the K need not sum to 1)."""
    if not prompts or not choice_ids:
        raise ValueError("choice_logprobs: needs prompts and choice tokens")
    trajs = []
    for p in prompts:
        t = Trajectory()
        t.append(list(p), Owner.PROMPT, 0)
        trajs.append(t)
    batch = collate(trajs, pad_id)
    logits = engine.forward(batch, logits=True).logits  # [N, T, V]
    last = batch.attention_mask.long().sum(-1) - 1  # [N] each prompt's last real position
    logp = torch.log_softmax(logits[torch.arange(len(prompts)), last].float(), -1)  # [N, V]
    out = logp[:, list(choice_ids)]  # [N, K]
    assert out.shape == (len(prompts), len(choice_ids))
    return out


def soft_labels(logp: torch.Tensor) -> torch.Tensor:
    """[N, 2] log-probs of "A" and "B" -> [N] P(A) renormalised over the two = sigmoid(logp_A - logp_B) (a soft
    preference label; > 0.5 prefers A). Worked: P(A) = 0.3, P(B) = 0.1 -> 0.3 / 0.4 = 0.75."""
    if logp.dim() != 2 or logp.shape[1] != 2:
        raise ValueError(f"soft_labels: logp must be [N, 2], got {tuple(logp.shape)}")
    return torch.sigmoid(logp[:, 0] - logp[:, 1])


# --- ratings -> pairs (UltraFeedback, Likert) -----------------------------------------------------
Winner = Literal["A", "B"]
LIKERT = {5: "1 A>>B, 2 A>B, 3 tie, 4 B>A, 5 B>>A", 8: "1 A>>>B ... 4 A>B, 5 B>A ... 8 B>>>A (no tie)"}
"""the book's Likert scales (ch.11), point value -> meaning"""


def likert_label(score: int, points: int = 5) -> tuple[Winner | None, int]:
    """A Likert rating between A and B, binarized: (winner, strength); a tie is (None, 0). Strength counts the
    steps from the middle: 5-point 1 -> ("A", 2), 2 -> ("A", 1), 3 -> (None, 0), 5 -> ("B", 2); 8-point 1 ->
    ("A", 4), 4 -> ("A", 1), 5 -> ("B", 1), 8 -> ("B", 4). The strength can feed a margin (book ch.5)."""
    if points not in LIKERT:
        raise ValueError(f"likert_label: points must be 5 or 8, got {points}")
    if isinstance(score, bool) or int(score) != score or not 1 <= score <= points:
        raise ValueError(f"likert_label: a {points}-point score is an integer 1..{points}, got {score!r}")
    middle = (points + 1) / 2  # 3 (5-point) or 4.5 (8-point)
    if score == middle:
        return None, 0
    strength = math.ceil(abs(score - middle))
    return ("A" if score < middle else "B"), strength


def ultrafeedback_pairs(ratings: Sequence[Sequence[float]], generator: torch.Generator
                        ) -> list[tuple[int, int, int, float]]:
    """UltraFeedback's pairs (book ch.11): per prompt, the highest-rated completion (the first of equals) against
    one completion drawn uniformly from those rated strictly lower. ratings [P][n_p] -> [(prompt, chosen,
    rejected, margin)] with margin = r_chosen - r_rejected (Llama 2's m(y_c, y_r)); a prompt whose completions
    are all rated the same gives no pair. One draw of `generator` per prompt with a pair."""
    out = []
    for p, r in enumerate(ratings):
        if not r:
            continue
        best = max(range(len(r)), key=lambda i: (r[i], -i))  # highest rating, first of equals
        lower = [i for i in range(len(r)) if r[i] < r[best]]
        if not lower:
            continue
        j = lower[int(torch.randint(len(lower), (1,), generator=generator))]
        out.append((p, best, j, float(r[best] - r[j])))
    return out


# --- structured preferences: constraint following (ch.11.4) -----------------------------------
def constraint_pairs(generate: Callable[[list[Conversation]], list[str]], prompts: Sequence[str],
                     constraints: Sequence[str], check: Callable[[str, str], bool] | None = None
                     ) -> list[tuple[str, str, str]]:
    """Synthetic preference pairs for constraint following (book ch.11.4, IFEval style): for prompt x and
    constraint c, chosen = a generation for "x\n\nc", rejected = a generation for x alone; the stored prompt
    **includes** the constraint (the book: otherwise the pair teaches nothing about it). With `check(constraint,
    reply) -> bool`, a pair is kept only where the chosen reply meets the constraint and the rejected one does not.

    generate(conversations) -> one reply each (greedy or seeded by the caller). -> [(prompt with constraint,
    chosen, rejected)], in prompt order."""
    if len(prompts) != len(constraints):
        raise ValueError(f"constraint_pairs: {len(prompts)} prompts for {len(constraints)} constraints")
    asked = [f"{x}\n\n{c}" for x, c in zip(prompts, constraints)]
    replies = generate([[{"role": "user", "content": q}] for q in asked] + [[{"role": "user", "content": x}]
                                                                          for x in prompts])
    n = len(prompts)
    if len(replies) != 2 * n:
        raise ValueError(f"constraint_pairs: generate returned {len(replies)} replies for {2 * n} conversations")
    out = []
    for i in range(n):
        chosen, rejected = replies[i], replies[n + i]
        if check is None or (check(constraints[i], chosen) and not check(constraints[i], rejected)):
            out.append((asked[i], chosen, rejected))
    return out
