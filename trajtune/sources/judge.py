"""LLM-as-a-judge: a language model grades completions from a template (RLHF book ch.5.9 "Generative Reward
Modeling", ch.16.3; checklist 5.9, 16.3).

A judge is any causal LM behind an `Engine` with its renderer: a local Hugging Face model (`load_judge`, its
own chat template), the policy itself, or a TinyTransformer trained to judge (the graders recipe). It is asked
with a `JudgeTemplate` and answers by **greedy decoding** (the book: "a sampling temperature of 0 to reduce
variance of ratings"). Templates (`TEMPLATES`):

    mt_bench_pair    the book's MT-Bench pairwise prompt, verbatim; verdict "[[A]]", "[[B]]" or "[[C]]" (tie)
    mt_bench_single  MT-Bench's single-answer grading in the same voice (the book does not print it; the
                     wording here is ours): a 1-10 rating written "Rating: [[5]]"
    yes_no           one criterion of a rubric: "[[YES]]" or "[[NO]]"
    compact_pair     for a tiny character model (no brackets or digits in its vocabulary): "Judge: q", "A: a",
                     "B: b"; the whole reply is "A", "B" or "C"
    compact_yes_no   "Check: criterion", "A: answer"; the whole reply is "Yes" or "No"

Parsing (`parse_verdict`): the last match of the template's pattern in the reply is the verdict; a reply
without one is **unparseable** -- not a reward of 0 -- and the scorer returns None for that completion (the
episode is UNSCORED and no loss or baseline sees it) and counts it (reward/<name>/unparseable). A judge prompt
its tokenizer cannot encode (a toy vocabulary) gets no reply: unparseable too, and counted as unreadable.

Position swap (`Judge.compare`): every pair is judged as (a, b) and as (b, a). Two verdicts that agree give
the label; verdicts that disagree are a tie, counted (reward/<name>/inconsistent: their share of the pairs).

As a grader (`trajtune.sources.graders.Grader`; `Judge.__call__`: `RewardBatch` -> list[float | None], its
`.metrics` those of the last call, so `Scored(..., [Weighted(judge)])` uses it):

    pointwise  the rating (mt_bench_single: 1-10; `scale` maps it to [0, 1] when set)
    pairwise   each completion against the row's `reference` column (AlpacaEval-style), or, without one, against
               every other completion of the same prompt (a round robin in the group): win 1, tie or
               inconsistent 0.5, loss 0, averaged over its comparisons (None when every comparison was
               unparseable)

Calls are batched (`batch_size` judge prompts per `engine.sample` call; under torchrun each rank answers its share,
gathered: `sharded_map`) and cached per judge prompt -- i.e. per
(prompt, completion), or (prompt, a, b) for pairs -- when `cache=True`. Cache only a FROZEN judge: the policy
judging itself changes with every update, and a cached verdict would be one from an older policy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from ..engine.distributed import sharded_map
from ..metrics import register
from ..text.tokenizers import UnknownSymbolError
from .graders import Grades
from .rewards import RewardBatch, RewardState

Kind = Literal["pairwise", "pointwise", "yes_no"]
Verdict = Literal["A", "B", "tie"]

MT_BENCH_PAIR_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants to "
    "the user question displayed below.\nYou should choose the assistant that follows the user's instructions and "
    "answers the user's question better.\nYour evaluation should consider factors such as the helpfulness, "
    "relevance, accuracy, depth, creativity, and level of detail of their responses.\nBegin your evaluation by "
    "comparing the two responses and provide a short explanation.\nAvoid any position biases and ensure that the "
    "order in which the responses were presented does not influence your decision.\nDo not allow the length of the "
    "responses to influence your evaluation.\nDo not favor certain names of the assistants.\nBe as objective as "
    "possible.\nAfter providing your explanation, output your final verdict by strictly following this format: "
    "\"[[A]]\" if assistant A is better, \"[[B]]\" if assistant B is better, and \"[[C]]\" for a tie.")
"""the book's MT-Bench pairwise system text (ch.5.9), verbatim"""
MT_BENCH_PAIR_USER = ("[User Question]\n{question}\n[The Start of Assistant A's Answer]\n{answer_a}\n"
                      "[The End of Assistant A's Answer]\n[The Start of Assistant B's Answer]\n{answer_b}\n"
                      "[The End of Assistant B's Answer]")
"""the book's MT-Bench pairwise question block (ch.5.9), verbatim"""


@dataclass(frozen=True)
class JudgeTemplate:
    """How to ask a judge and read its answer.

    Example, a template of your own (a 1-5 scale, the book's ch.11 rating rubric):

        five = JudgeTemplate("five", "pointwise", "Rate the answer from 1 (very poor) to 5 (excellent).",
                             "{question}\\n---\\n{answer}", r"Score: ([1-5])", scale=(1, 5))
    """

    name: str
    kind: Kind
    system: str
    """system message ('' for none)"""
    user: str
    """the user message: a format string with {question} and {answer} (pointwise), {answer_a} and {answer_b}
    (pairwise), {answer} and {criterion} (yes_no)"""
    verdict: str
    """a regex with one group; its last match in the reply is the verdict (pairwise: A, B or C; pointwise: a
    number; yes_no: a word in `yes`)"""
    scale: tuple[float, float] = (0.0, 1.0)
    """pointwise: the lowest and highest rating; a rating outside it is unparseable"""
    yes: tuple[str, ...] = ("YES", "Yes")
    """yes_no: the verdicts that mean yes (any other match means no)"""
    max_answer_chars: int = 0
    """> 0: an answer longer than this is shown with its middle cut out ('..'), for a judge with a short
    context (the compact templates); 0: as it is"""

    def messages(self, question: str, answer: str = "", answer_b: str = "", criterion: str = "") -> list[dict]:
        """The judge's conversation: [system], user (pairwise: `answer` is A, `answer_b` is B)."""
        cut = lambda s: shorten(s, self.max_answer_chars)  # noqa: E731
        fields = {"question": question, "answer": cut(answer), "answer_a": cut(answer), "answer_b": cut(answer_b),
                  "criterion": criterion}
        out = [{"role": "system", "content": self.system}] if self.system else []
        return out + [{"role": "user", "content": self.user.format(**fields)}]


TEMPLATES: dict[str, JudgeTemplate] = {t.name: t for t in [
    JudgeTemplate("mt_bench_pair", "pairwise", MT_BENCH_PAIR_SYSTEM, MT_BENCH_PAIR_USER, r"\[\[([ABC])\]\]"),
    JudgeTemplate(
        "mt_bench_single", "pointwise",
        "Please act as an impartial judge and evaluate the quality of the response provided by an AI assistant to the "
        "user question displayed below. Your evaluation should consider factors such as the helpfulness, relevance, "
        "accuracy, depth, creativity, and level of detail of the response. Begin your evaluation by providing a short "
        "explanation. Be as objective as possible. After providing your explanation, you must rate the response on a "
        "scale of 1 to 10 by strictly following this format: \"Rating: [[5]]\".",
        "[Question]\n{question}\n[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]",
        r"Rating: \[\[(\d+(?:\.\d+)?)\]\]", scale=(1.0, 10.0)),
    JudgeTemplate(
        "yes_no", "yes_no",
        "Please act as an impartial judge. Decide whether the response to the user question displayed below meets "
        "the criterion. Give a short explanation, then output your verdict by strictly following this format: "
        "\"[[YES]]\" if it meets the criterion, \"[[NO]]\" if it does not.",
        "[Criterion]\n{criterion}\n[Question]\n{question}\n[The Start of Assistant's Answer]\n{answer}\n"
        "[The End of Assistant's Answer]", r"\[\[(YES|NO)\]\]", yes=("YES",)),
    JudgeTemplate("compact_pair", "pairwise", "", "Judge: {question}\nA: {answer_a}\nB: {answer_b}",
                  r"^\s*([ABC])\s*$", max_answer_chars=50),
    JudgeTemplate("compact_yes_no", "yes_no", "", "Check: {criterion}\nA: {answer}", r"^\s*(Yes|No)\s*$",
                  yes=("Yes",), max_answer_chars=50),
]}
"""the built-in templates by name (module docstring)"""

for _key, _doc in [("unparseable", "share of the judge's replies in the last call with no verdict in them (those "
                                   "completions get None: unscored, not 0)"),
                   ("inconsistent", "share of the pairs in the last call whose two position-swapped verdicts "
                                    "disagreed (counted as ties)"),
                   ("cache_hits", "share of the judge prompts in the last call answered from the cache"),
                   ("unreadable", "share of the judge prompts in the last call the judge's tokenizer cannot encode "
                                  "(a character outside a toy vocabulary): no reply, so unparseable"),
                   ("ask_unparseable", "share of the judge's yes/no replies (rubric items) in the last call with no "
                                       "verdict in them")]:
    register(f"reward/judge/{_key}", f"LLM-as-a-judge (sources.judge): {_doc}; reward/<name>/{_key} for a judge "
                                     "named otherwise")


def shorten(text: str, max_chars: int) -> str:
    """`text` with its middle replaced by '..' so that it is `max_chars` long (0 or short enough: unchanged).
    shorten("abcdefghij", 6) == "ab..ij"."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    if max_chars < 4:
        raise ValueError(f"shorten: max_chars must be 0 or >= 4, got {max_chars}")
    head = (max_chars - 2 + 1) // 2
    return text[:head] + ".." + text[len(text) - (max_chars - 2 - head):]


def template_of(template: str | JudgeTemplate) -> JudgeTemplate:
    if isinstance(template, JudgeTemplate):
        return template
    if template not in TEMPLATES:
        raise ValueError(f"judge template {template!r}: choose one of {sorted(TEMPLATES)} or pass a JudgeTemplate")
    return TEMPLATES[template]


def parse_verdict(template: JudgeTemplate, reply: str) -> str | float | bool | None:
    """The verdict in a judge's reply, or None (unparseable): pairwise "A" / "B" / "tie" (from [[C]]), pointwise
    the rating (a float within `template.scale`), yes_no True / False. The last match counts (a judge explains
    first, then writes its verdict)."""
    found = re.findall(template.verdict, reply)
    if not found:
        return None
    last = found[-1]
    if template.kind == "pairwise":
        return {"A": "A", "B": "B", "C": "tie"}.get(last)
    if template.kind == "yes_no":
        return last in template.yes
    rating = float(last)
    lo, hi = template.scale
    return rating if lo <= rating <= hi else None


def swap_consistent(first: Verdict | None, swapped: Verdict | None) -> tuple[Verdict | None, bool]:
    """(the label of a pair judged as (a, b) -> `first` and as (b, a) -> `swapped`, whether the two disagreed).
    The swapped verdict is mapped back (its A is b); disagreeing verdicts are a tie; an unparseable one makes
    the pair unparseable (None, not inconsistent). swap_consistent("A", "B") == ("A", False),
    swap_consistent("A", "A") == ("tie", True)."""
    if first is None or swapped is None:
        return None, False
    back = {"A": "B", "B": "A", "tie": "tie"}[swapped]
    return (first, False) if first == back else ("tie", True)


class Judge:
    """A language model as a grader (module docstring).

    engine:          a frozen engine on the judge model (or the policy's own engine, with cache=False)
    renderer:        its renderer (a `ChatRenderer` for HF models: the judge's own chat template)
    template:        the template __call__ uses (a name in TEMPLATES or a JudgeTemplate)
    ask_template:    the yes_no template `ask` uses (rubric items graded by the judge)
    reference:       pairwise: the column holding each row's reference answer (None: round robin in the group)
    scale01:         pointwise: map the rating to [0, 1] with the template's scale
    max_new_tokens:  the judge's reply budget (an explanation and a verdict; 2-3 for the compact templates)
    batch_size:      judge prompts per sampler call
    cache:           keep every reply by judge prompt (a frozen judge only)
    """

    finished_only = True
    main_only = False

    def __init__(self, engine, renderer, template: str | JudgeTemplate = "mt_bench_single", *,
                 ask_template: str | JudgeTemplate = "yes_no", name: str = "judge", reference: str | None = None,
                 scale01: bool = False, max_new_tokens: int = 512, batch_size: int = 64, cache: bool = True):
        self.engine, self.renderer, self.name = engine, renderer, name
        self.template, self.ask_template = template_of(template), template_of(ask_template)
        if self.ask_template.kind != "yes_no":
            raise ValueError(f"Judge {name}: ask_template {self.ask_template.name!r} is {self.ask_template.kind}, "
                             "not yes_no")
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"Judge {name}: max_new_tokens and batch_size must be >= 1")
        self.reference, self.scale01 = reference, scale01
        self.max_new_tokens, self.batch_size, self.use_cache = max_new_tokens, batch_size, cache
        self.cache: dict[tuple, str] = {}
        self.metrics: dict[str, float] = {}
        """reward/<name>/* of the last rate or compare (each starts afresh) and of the asks after it"""
        pad = getattr(renderer, "pad_id", None)
        self.pad_id = renderer.tokenizer.pad_id if pad is None else pad

    # --- the model's replies -------------------------------------------------------------------
    def replies(self, conversations: Sequence[list[dict]]) -> list[str]:
        """The judge's greedy reply to each conversation, batched; cached by conversation when `cache`."""
        keys = [tuple((m["role"], m["content"]) for m in c) for c in conversations]
        todo = list(dict.fromkeys(k for k in keys if not (self.use_cache and k in self.cache)))
        fresh: dict[tuple, str] = {}
        readable: list[tuple[tuple, list[int]]] = []
        for k in todo:
            try:
                readable.append((k, self.renderer.generation_prompt([{"role": r, "content": c} for r, c in k])))
            except UnknownSymbolError:  # text the judge's tokenizer cannot encode: no verdict (unparseable)
                fresh[k] = ""
        texts = sharded_map(self.engine, [p for _, p in readable], self._generate)  # in shares over the ranks
        fresh.update(zip([k for k, _ in readable], texts, strict=True))
        hits = sum(1 for k in keys if k not in fresh)
        if self.use_cache:
            self.cache.update(fresh)
        self._note("cache_hits", hits / max(1, len(keys)))
        self._note("unreadable", (len(todo) - len(readable)) / max(1, len(keys)))
        return [fresh[k] if k in fresh else self.cache[k] for k in keys]

    def _generate(self, prompts: list[list[int]]) -> list[str]:
        """Greedy replies to token prompts, `batch_size` per sampler call."""
        out: list[str] = []
        for i in range(0, len(prompts), self.batch_size):
            samples = self.engine.sample(prompts[i : i + self.batch_size], self.max_new_tokens, greedy=True,
                                         stop_ids=self.renderer.stop_ids, pad_id=self.pad_id)
            out += [self.renderer.action_text(t) for t in samples.tokens]
        return out

    def _note(self, key: str, value: float) -> None:
        self.metrics[f"reward/{self.name}/{key}"] = value

    # --- three ways to ask ------------------------------------------------------------------
    def rate(self, questions: Sequence[str], answers: Sequence[str]) -> list[float | None]:
        """Pointwise ratings (None: unparseable), with the template's scale (or [0, 1] with `scale01`)."""
        t, self.metrics = self._needs("pointwise"), {}
        verdicts = [parse_verdict(t, r) for r in self.replies(
            [t.messages(q, a) for q, a in zip(questions, answers, strict=True)])]
        self._note("unparseable", _share(v is None for v in verdicts))
        lo, hi = t.scale
        return [None if v is None else (float(v) - lo) / (hi - lo) if self.scale01 else float(v) for v in verdicts]

    def compare(self, questions: Sequence[str], answers_a: Sequence[str],
                answers_b: Sequence[str]) -> list[Verdict | None]:
        """Swap-consistent pairwise labels: each pair judged as (a, b) and (b, a) in one batch (`swap_consistent`);
        None where a verdict was unparseable. Logs the unparseable share of the replies and the inconsistent
        share of the pairs."""
        t, self.metrics = self._needs("pairwise"), {}
        n = len(questions)
        convs = [t.messages(q, a, b) for q, a, b in zip(questions, answers_a, answers_b, strict=True)]
        convs += [t.messages(q, b, a) for q, a, b in zip(questions, answers_a, answers_b, strict=True)]
        verdicts = [parse_verdict(t, r) for r in self.replies(convs)]
        pairs = [swap_consistent(verdicts[i], verdicts[n + i]) for i in range(n)]  # type: ignore[arg-type]
        self._note("unparseable", _share(v is None for v in verdicts))
        self._note("inconsistent", _share(bad for _, bad in pairs))
        return [label for label, _ in pairs]

    def ask(self, questions: Sequence[str], answers: Sequence[str], criteria: Sequence[str]) -> list[bool | None]:
        """Does each answer meet its criterion? (the yes_no `ask_template`; None: unparseable)"""
        t = self.ask_template  # the metrics are kept: a rubric asks after the judge rated (both are logged)
        verdicts = [parse_verdict(t, r) for r in self.replies(
            [t.messages(q, a, criterion=c) for q, a, c in zip(questions, answers, criteria, strict=True)])]
        self._note("ask_unparseable", _share(v is None for v in verdicts))
        return verdicts  # type: ignore[return-value]

    def _needs(self, kind: str) -> JudgeTemplate:
        if self.template.kind != kind:
            raise ValueError(f"Judge {self.name}: template {self.template.name!r} is {self.template.kind}, not {kind}")
        return self.template

    # --- as a grader ---------------------------------------------------------------------------
    def start(self, batch: RewardBatch, state: RewardState) -> Callable[[], Grades]:
        """Its scores (`__call__`) computed in the wait; its grades' metrics are `metrics` itself, which a rubric's
        asks after it add to."""
        return lambda: Grades(self(batch), self.metrics)

    def close(self) -> None:
        pass

    def __call__(self, batch: RewardBatch) -> list[float | None]:
        questions = [question_text(p) for p in batch.prompts]
        answers = [batch.text(i) for i in range(len(batch))]
        if self.template.kind == "pointwise":
            return self.rate(questions, answers)
        if self.template.kind != "pairwise":
            raise ValueError(f"Judge {self.name}: a {self.template.kind} template grades rubric items (`ask`), "
                             "not completions; use a pairwise or pointwise template as a reward")
        if self.reference is not None:
            refs = batch.columns.get(self.reference)
            if refs is None or any(r is None for r in refs):
                raise ValueError(f"Judge {self.name}: pairwise against column {self.reference!r}, but "
                                 f"{batch.where[0] if refs is None else batch.where[refs.index(None)]} has none")
            games = [(i, str(r)) for i, r in enumerate(refs)]
            labels = self.compare([questions[i] for i, _ in games], [answers[i] for i, _ in games],
                                  [r for _, r in games])
            return [None if v is None else {"A": 1.0, "tie": 0.5, "B": 0.0}[v] for v in labels]
        return self._round_robin(batch, questions, answers)

    def _round_robin(self, batch: RewardBatch, questions: list[str], answers: list[str]) -> list[float | None]:
        """Every completion against each other completion of its prompt (both positions): mean of win 1 / tie 0.5."""
        groups: dict[tuple, list[int]] = {}
        for i in range(len(batch)):
            groups.setdefault((batch.where[i], repr(batch.prompts[i])), []).append(i)
        games = [(i, j) for rows in groups.values() for k, i in enumerate(rows) for j in rows[k + 1:]]
        labels = self.compare([questions[i] for i, _ in games], [answers[i] for i, _ in games],
                              [answers[j] for _, j in games])
        points: dict[int, list[float]] = {}
        for (i, j), v in zip(games, labels, strict=True):
            if v is not None:
                points.setdefault(i, []).append({"A": 1.0, "tie": 0.5, "B": 0.0}[v])
                points.setdefault(j, []).append({"A": 0.0, "tie": 0.5, "B": 1.0}[v])
        return [sum(points[i]) / len(points[i]) if i in points else None for i in range(len(batch))]


def question_text(prompt) -> str:
    """A prompt as the judge's {question}: a string as it is, a conversation as its last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    return users[-1] if users else str(prompt[-1]["content"])


def _share(flags) -> float:
    flags = list(flags)
    return sum(map(bool, flags)) / len(flags) if flags else 0.0


def load_judge(path, template: str | JudgeTemplate = "mt_bench_single", *, device: str | None = "cpu",
               precision: str = "fp32", max_new_tokens: int = 512, batch_size: int = 16, name: str = "judge",
               reference: str | None = None, scale01: bool = False) -> Judge:
    """A local Hugging Face model directory as a frozen judge: its weights on a frozen engine (`device`; None: the
    rank's GPU under torchrun,
    `precision` "fp32" / "bf16" / "fp16" autocast), its own chat template (`ChatRenderer`), greedy replies,
    cached (frozen). `--reward-judge MODEL_DIR` of grpo / rft."""
    from ..engine import make_engine
    from ..models import hf
    from ..text.chat import ChatRenderer

    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"load_judge: precision must be fp32, bf16 or fp16, got {precision!r}")
    renderer = ChatRenderer(hf.load_tokenizer(path))
    engine = make_engine(hf.load_policy(path), None, device=device, frozen=True,
                         autocast=None if precision == "fp32" else precision)
    return Judge(engine, renderer, template, name=name, reference=reference, scale01=scale01,
                 max_new_tokens=max_new_tokens, batch_size=batch_size, cache=True)
