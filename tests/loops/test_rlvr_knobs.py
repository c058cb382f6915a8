"""RLVR's data and reward knobs (RLHF book ch.7.3): format reward, partial credit, length penalty, the offline
difficulty filter, and toggleable reasoning through the chat template."""

import pytest

from trajtune.sources.base import Episodes
from trajtune.sources.difficulty import filter_by_difficulty, solve_rates
from trajtune.sources.rewards import rlvr
from trajtune.trajectory import Outcome, Trajectory
from trajtune.sources.sampler import Decoder, SamplerSettings


@pytest.mark.parametrize("text, score", [
    ("<think>2 and 2</think><answer>4</answer>", 1.0),
    ("<think>2 and 2</think> 4", 0.5),
    ("<answer>4</answer>", 0.5),
    ("<think>a<think></think><answer>4</answer>", 0.75),  # two <think>: that tag is out of place
    ("</think>a<think>", 0.25),  # the closing tag before the opening one
    ("<answer>4</answer><think>late</think>", 0.5),  # the answer before the thinking: only one pair in place
    ("4", 0.0),
])
def test_format_reward_quarter_per_tag(text, score):
    assert rlvr.tag_score(text) == score
    assert rlvr.format_reward([[{"role": "assistant", "content": text}]]) == [score]


def test_length_penalty_linear_beyond_budget():
    assert [rlvr.length_score(n, 100, 0.01) for n in (80, 100, 150, 400)] == [0.0, 0.0, pytest.approx(-0.5),
                                                                             pytest.approx(-3.0)]
    assert rlvr.length_score(400, 100, 0.01, cap=1.0) == -1.0
    fn = rlvr.make_length_penalty(budget=3, per_token=0.5)
    assert fn(completion_ids=[[1, 2], [1, 2, 3, 4, 5]]) == [0.0, -1.0]
    assert rlvr.length_penalty(completion_ids=[[1] * 1500, [1] * 10], length_budget=[1000, 10]) == [
        pytest.approx(-0.5), 0.0]
    with pytest.raises(ValueError, match="row 0: column 'length_budget'"):
        rlvr.length_penalty(completion_ids=[[1]], length_budget=["long"])


def test_partial_credit_share_of_tests_passed():
    code = "```python\ndef add(a, b):\n    return a + b if a < 3 else 0\n```"
    tests = [[[1, 2], 3], [[2, 2], 4], [[3, 1], 4], [[5, 5], 10]]
    assert rlvr.tests_passed([code], tests=[tests], entry_point=["add"]) == [0.5]
    assert rlvr.all_tests_passed([code], tests=[tests], entry_point=["add"]) == [0.0]
    assert rlvr.all_tests_passed([code], tests=[tests[:2]], entry_point=["add"]) == [1.0]
    assert rlvr.tests_passed(["no code here"], tests=[tests], entry_point=["add"]) == [0.0]
    with pytest.raises(ValueError, match="row 0: column 'tests'"):
        rlvr.tests_passed([code], tests=[[]], entry_point=["add"])

    def words(text, required):  # an instruction-following checker: which required words appear
        return [w in text for w in required]

    reward = rlvr.partial_credit(words)
    assert reward(["a red fox", "blue"], required=[["red", "fox", "dog"], ["blue"]]) == [pytest.approx(2 / 3), 1.0]


class FixedRewards:
    """A source whose episode j of task t has reward 1 when j < solved[t] (n episodes per task)."""

    def __init__(self, solved, fail=()):
        self.solved, self.fail, self.draws = solved, set(fail), []

    def take(self, draw, ahead=None):
        self.draws.append([t for t in draw.tasks])
        trajs = []
        for task in draw.tasks:
            for j in range(draw.n):
                bad = (task, j) in self.fail
                trajs.append(Trajectory([1], [0], [0], reward=float(j < self.solved[task]),
                                        outcome=Outcome.REWARD_ERROR if bad else Outcome.OK))
        return Episodes(trajs, {}, draw.generator, draw.step)


def test_difficulty_filter_keeps_20_to_80_percent():
    solved = {"t0": 0, "t1": 3, "t2": 4, "t3": 8, "t4": 13, "t5": 16, "t6": 2}
    source = FixedRewards(solved, fail={("t6", 15), ("t6", 14), ("t6", 13), ("t6", 12), ("t6", 11), ("t6", 10)})
    kept, rates = filter_by_difficulty(source, list(solved), n=16, seed=3, chunk=3)
    # 3/16 = 0.1875 out, 4/16 = 0.25 in, 13/16 = 0.8125 out; t6: 2 of the 10 that were scored = 0.2, in
    assert kept == ["t2", "t3", "t6"]
    assert rates == {"t0": 0.0, "t1": 3 / 16, "t2": 0.25, "t3": 0.5, "t4": 13 / 16, "t5": 1.0, "t6": 0.2}
    assert source.draws == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6"]]
    d = solve_rates(FixedRewards({"x": 1}, fail={("x", j) for j in range(4)}), ["x"], n=4)
    assert d[0].scored == 0 and d[0].rate is None
    with pytest.raises(ValueError, match="low <= high"):
        filter_by_difficulty(source, ["t0"], low=0.9, high=0.1)


def test_difficulty_filter_on_a_real_source_is_seeded():
    """A tiny policy sampling the arithmetic gym: the same seed keeps the same tasks and rates."""
    import torch

    from trajtune.engine import OptimConfig, make_engine
    from trajtune.envs.arithmetic import arithmetic_env, arithmetic_tokenizer, make_tasks
    from trajtune.models.tiny import TinyConfig, TinyTransformer
    from trajtune.sources.episodes import EpisodeSource
    from trajtune.text.render import Renderer

    tok, tasks = arithmetic_tokenizer(), make_tasks("train", n=4, seed=0)
    torch.manual_seed(0)
    e = make_engine(TinyTransformer(TinyConfig(tok.vocab_size, dim=16, n_layers=1, n_heads=2, max_len=48)),
                    OptimConfig(lr=1e-3))
    source = EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=3)), arithmetic_env, Renderer(tok),
                           max_turns=1, max_tokens=48)
    first = filter_by_difficulty(source, tasks, n=4, low=0.0, high=1.0, seed=1)
    assert first == filter_by_difficulty(source, tasks, n=4, low=0.0, high=1.0, seed=1)
    assert first[0] == tasks and len(first[1]) == len(tasks)


OFF = "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}" + OFF +
                  "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n" + OFF + "{% endif %}")
"""Qwen3's switch, cut down: with enable_thinking false every assistant turn opens with an empty think block"""


def test_reasoning_toggle_reaches_the_template():
    pytest.importorskip("transformers")
    from trajtune.experiments.hf.prepare import template_kwargs
    from trajtune.models.hf_random import train_tokenizer
    from trajtune.text.chat import ChatRenderer, TemplateError
    from trajtune.trajectory import Owner

    tok = train_tokenizer()
    tok.chat_template = THINK_TEMPLATE
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    on, off = ChatRenderer(tok), ChatRenderer(tok, template_kwargs={"enable_thinking": False})
    assert "<think>" not in tok.decode(on.generation_prompt(msgs[:1]))
    assert tok.decode(off.generation_prompt(msgs[:1])).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert off.prompt_ids(off.start(msgs[:1])) == off.generation_prompt(msgs[:1])  # the rollout path sees it too
    # a demonstration renders with the empty think block as TEMPLATE and trains the answer only
    traj = off.render(msgs)
    policy = tok.decode([i for i, o in zip(traj.ids, traj.owners, strict=True) if o == Owner.POLICY])
    assert policy == "4<|im_end|>"
    with pytest.raises(TemplateError, match="never reads 'reasoning_effort'"):
        ChatRenderer(tok, template_kwargs={"reasoning_effort": "low"})

    class Model:
        enable_thinking, reasoning_effort = False, ""

    assert template_kwargs(Model()) == {"enable_thinking": False}
    assert template_kwargs(object()) == {}
