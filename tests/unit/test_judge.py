"""LLM-as-a-judge (trajtune.sources.judge): verdict parsing, position swap, batching, cache, as a reward."""

import re
import string
from pathlib import Path

import pytest

from trajtune.engine.decoding import Samples
from trajtune.sources.judge import (MT_BENCH_PAIR_SYSTEM, TEMPLATES, Judge, JudgeTemplate, load_judge, parse_verdict,
                                    shorten, swap_consistent)
from trajtune.sources.graders import Weighted
from trajtune.sources.rewards import RewardBatch
from trajtune.sources.scoring import Scored
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer


def test_the_mt_bench_prompt_is_the_books():
    book = Path("/work/shared/seeds/rlhf-book.md")
    if not book.exists():
        pytest.skip("the book is not on this machine")
    block = book.read_text().split("```text\n[System]\n", 1)[1].split("```", 1)[0]
    assert block == MT_BENCH_PAIR_SYSTEM + "\n" + TEMPLATES["mt_bench_pair"].user + "\n"


@pytest.mark.parametrize("name, reply, want", [
    ("mt_bench_pair", "Assistant A is terse. [[B]]", "B"),
    ("mt_bench_pair", "At first [[A]] but on reflection [[C]]", "tie"),  # the last verdict counts; C is a tie
    ("mt_bench_pair", "Both are fine. A", None),  # no bracketed verdict: unparseable
    ("mt_bench_single", "Clear and correct. Rating: [[7]]", 7.0),
    ("mt_bench_single", "Rating: [[8.5]]", 8.5),
    ("mt_bench_single", "Rating: [[11]]", None),  # outside 1-10
    ("mt_bench_single", "I give it 7", None),
    ("yes_no", "It does. [[YES]]", True),
    ("yes_no", "[[NO]]", False),
    ("compact_pair", "A", "A"),
    ("compact_pair", " C ", "tie"),
    ("compact_pair", "A fool", None),  # the whole reply must be the verdict
    ("compact_yes_no", "No", False),
    ("compact_yes_no", "Nope", None),
])
def test_parse_verdict(name, reply, want):
    assert parse_verdict(TEMPLATES[name], reply) == want


def test_swap_consistent():
    assert swap_consistent("A", "B") == ("A", False)  # (a, b) -> A; (b, a) -> B, i.e. a again
    assert swap_consistent("B", "A") == ("B", False)
    assert swap_consistent("A", "A") == ("tie", True)  # position bias: always the first answer
    assert swap_consistent("tie", "tie") == ("tie", False)
    assert swap_consistent("A", "tie") == ("tie", True)
    assert swap_consistent(None, "A") == (None, False)  # unparseable, not inconsistent


def test_shorten():
    assert shorten("abcdefghij", 6) == "ab..ij"  # 2 + '..' + 2
    assert shorten("abcdefghij", 7) == "abc..ij"  # head 3 = ceil(5 / 2), tail 2
    assert shorten("abc", 6) == "abc" and shorten("abcdefghij", 0) == "abcdefghij"
    assert len(TEMPLATES["compact_pair"].messages("q", "x" * 80, "y" * 10)[0]["content"]) == len(
        "Judge: q\nA: \nB: ") + 50 + 10


# --- a scripted judge model ---------------------------------------------------------------------------
TOK = CharTokenizer.from_corpus(string.printable)


class ScriptedEngine:
    """Reads each judge prompt back as text and answers with `rule(text)`; counts what it was asked."""

    def __init__(self, rule):
        self.rule, self.prompts, self.calls = rule, [], 0

    def sample(self, prompts, max_new_tokens, generator=None, *, greedy=False, stop_ids=(), pad_id=0, **kw):
        assert greedy, "a judge decodes greedily"
        self.calls += 1
        texts = [TOK.decode(p) for p in prompts]
        self.prompts += texts
        replies = [TOK.encode(self.rule(t)) + list(stop_ids[:1]) for t in texts]
        return Samples(replies, [[0.0] * len(r) for r in replies], [True] * len(replies))


def answers_of(text):
    return re.search(r"A: (.*)\nB: (.*?)<", text).groups()


def prefers_period(text):
    """A fair judge of 'ends with a period': A, B, or C when both or neither do."""
    a, b = (x.endswith(".") for x in answers_of(text))
    return "C" if a == b else "A" if a else "B"


def batch_of(prompts, completions, **columns):
    return RewardBatch(list(prompts), list(completions), [[] for _ in completions],
                       {k: list(v) for k, v in columns.items()}, [f"p.jsonl:{i + 1}" for i in range(len(prompts))])


def test_compare_is_swap_consistent_and_counts_inconsistency():
    fair = Judge(ScriptedEngine(prefers_period), Renderer(TOK), "compact_pair", max_new_tokens=2)
    assert fair.compare(["q"] * 3, ["Yes.", "no", "a."], ["no", "Yes.", "b."]) == ["A", "B", "tie"]
    assert fair.metrics["reward/judge/inconsistent"] == 0.0
    first = Judge(ScriptedEngine(lambda t: "A"), Renderer(TOK), "compact_pair", max_new_tokens=2)
    assert first.compare(["q"] * 2, ["Yes.", "no"], ["no", "Yes."]) == ["tie", "tie"]  # always A: position bias
    assert first.metrics["reward/judge/inconsistent"] == 1.0


def test_metrics_are_the_last_compare_and_the_asks_after_it():
    j = Judge(ScriptedEngine(lambda t: "Yes" if "Check:" in t else "A"), Renderer(TOK), "compact_pair",
              ask_template="compact_yes_no", max_new_tokens=3)
    j.compare(["q"], ["a"], ["b"])
    assert j.metrics["reward/judge/inconsistent"] == 1.0  # A both ways
    assert j.ask(["q"], ["a"], ["is short"]) == [True]  # a rubric asking after the judge rated: both logged
    assert j.metrics["reward/judge/inconsistent"] == 1.0 and j.metrics["reward/judge/ask_unparseable"] == 0.0
    j.compare(["q"], ["a"], ["b"])
    assert "reward/judge/ask_unparseable" not in j.metrics  # the next compare starts afresh


def test_unparseable_is_none_and_counted_not_zero():
    # the judge answers 'A' for the first answer 'x', gibberish otherwise
    j = Judge(ScriptedEngine(lambda t: "A" if answers_of(t)[0] == "x" else "hmm"), Renderer(TOK), "compact_pair",
              max_new_tokens=3)
    assert j.compare(["q", "q"], ["x", "y"], ["y", "z"]) == [None, None]  # (x,y) A but (y,x) unparseable; (y,z) both
    assert j.metrics["reward/judge/unparseable"] == 3 / 4  # 4 replies, one parsed
    assert j.metrics["reward/judge/inconsistent"] == 0.0


def test_text_the_judge_cannot_encode_is_unparseable():
    engine = ScriptedEngine(prefers_period)
    j = Judge(engine, Renderer(TOK), "compact_pair", max_new_tokens=2)
    assert j.compare(["q", "q"], ["caf\u00e9.", "x."], ["y", "y"]) == [None, "A"]  # 'é' is not in TOK
    assert j.metrics["reward/judge/unreadable"] == 2 / 4 and j.metrics["reward/judge/unparseable"] == 2 / 4
    assert len(engine.prompts) == 2  # only the readable prompts reach the model


def test_pointwise_reward_batches_caches_and_goes_through_scored():
    rule = lambda t: "Rating: [[9]]" if "Fine." in t else "Rating: [[3]]" if "meh" in t else "no idea"  # noqa: E731
    engine = ScriptedEngine(rule)
    judge = Judge(engine, Renderer(TOK), "mt_bench_single", max_new_tokens=20, batch_size=2)
    batch = batch_of(["Say hi"] * 3, ["Fine.", "meh", "???"])
    assert judge(batch) == [9.0, 3.0, None]
    assert engine.calls == 2 and len(engine.prompts) == 3  # batches of 2: 2 + 1
    assert judge.metrics["reward/judge/unparseable"] == pytest.approx(1 / 3)
    assert judge(batch) == [9.0, 3.0, None] and engine.calls == 2  # every prompt from the cache
    assert judge.metrics["reward/judge/cache_hits"] == 1.0
    assert "[Question]\nSay hi\n[The Start of Assistant's Answer]\nFine.\n" in engine.prompts[0]

    scaled = Judge(ScriptedEngine(rule), Renderer(TOK), "mt_bench_single", scale01=True, cache=False)
    assert scaled(batch) == [pytest.approx((9 - 1) / 9), pytest.approx((3 - 1) / 9), None]  # (r - 1) / (10 - 1)
    scaled(batch)
    assert scaled.metrics["reward/judge/cache_hits"] == 0.0  # cache off: asked again (a judge that trains)

    # Scored uses the judge as one of its graders
    from trajtune.sources.data import PromptTask
    from trajtune.trajectory import Owner, Trajectory

    trajs = []
    for reply in ["Fine.", "???"]:
        t = Trajectory(info={"actions": [reply]})
        t.append([1], Owner.POLICY, 0)
        trajs.append(t)

    class Eng:
        is_main, step = True, 0

    scored = Scored(None, Eng(), [Weighted(judge)])
    metrics = scored.score(trajs, [PromptTask("hi", "Say hi")] * 2)
    assert trajs[0].reward == 9.0 and trajs[1].outcome.name == "UNSCORED"
    assert metrics["reward/unscored"] == 1.0


def test_pairwise_round_robin_and_reference():
    judge = Judge(ScriptedEngine(prefers_period), Renderer(TOK), "compact_pair", max_new_tokens=2)
    # prompt p1 has three completions, p2 one (no opponent: None)
    batch = RewardBatch(["p1", "p1", "p1", "p2"], ["a.", "b", "c.", "d."], [[]] * 4, {},
                        ["r:1", "r:1", "r:1", "r:2"])
    # games: (a., b) a wins; (a., c.) tie; (b, c.) c wins -> a: (1 + .5) / 2, b: (0 + 0) / 2, c: (.5 + 1) / 2
    assert judge(batch) == [0.75, 0.0, 0.75, None]
    ref = Judge(ScriptedEngine(prefers_period), Renderer(TOK), "compact_pair", reference="gold", max_new_tokens=2)
    assert ref(batch_of(["q"] * 3, ["x.", "y", "z"], gold=["g", "g.", "g"])) == [1.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="column 'gold'.*p.jsonl:2"):
        ref(batch_of(["q"] * 2, ["x.", "y"], gold=["g", None]))


def test_template_kinds_are_checked():
    with pytest.raises(ValueError, match="choose one of"):
        Judge(ScriptedEngine(str), Renderer(TOK), "mt_bench")
    j = Judge(ScriptedEngine(lambda t: "Yes"), Renderer(TOK), "compact_yes_no", ask_template="compact_yes_no")
    with pytest.raises(ValueError, match="rubric items"):
        j(batch_of(["q"], ["a"]))
    assert j.ask(["q"], ["a"], ["is short"]) == [True]
    custom = JudgeTemplate("five", "pointwise", "", "{question}\n{answer}", r"Score: ([1-5])", scale=(1, 5))
    assert Judge(ScriptedEngine(lambda t: "Score: 4"), Renderer(TOK), custom).rate(["q"], ["a"]) == [4.0]


def test_load_judge_on_a_tiny_hf_model(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import make_random_model

    path = make_random_model(tmp_path / "judge", arch="llama", size="tiny", max_positions=2048)
    judge = load_judge(path, "mt_bench_pair", max_new_tokens=4, reference="ref")
    out = judge(batch_of(["What is 2 + 3?"] * 2, ["5", "6"], ref=["5", "5"]))
    # a random model writes no verdict: None for both (not 0), every reply counted unparseable
    assert out == [None, None] and judge.metrics["reward/judge/unparseable"] == 1.0
    assert "<|im_start|>system" in judge.renderer.text(TEMPLATES["mt_bench_pair"].messages("q", "a", "b"))
