"""Reward functions the TRL way (trajtune.sources.rewards) and as `trajtune grpo|rft` use them: several, weighted,
one call per batch, concurrent, cut after --reward-timeout; every failure names the function, the row
(file:line) and, for an exception, the user's own traceback; a trained reward model is a reward."""

import contextlib
import json
import math
import time
import types

import pytest

from trajtune.sources.data import PromptTask
from trajtune.sources.graders import check_faults, grade_all
from trajtune.sources.rewards import (RewardBatch, RewardError, RewardFunction, RewardState, check_columns, combine,
                              load_reward_function, source_metrics)


def _tasks(n=4, where="prompts.jsonl", conversational=False, **columns):
    prompt = [{"role": "user", "content": "q"}] if conversational else "q"
    return [PromptTask(f"row{i}", prompt, {k: v[i] if isinstance(v, list) else v for k, v in columns.items()},
                       f"{where}:{i + 1}") for i in range(n)]


def _batch(replies, **kw):
    return RewardBatch.of(_tasks(len(replies), **kw), replies, [[7, i] for i in range(len(replies))])


@contextlib.contextmanager
def graded(*functions, timeout=60.0):
    """`score(batch, state)` -> the functions' values [K][N], the failed rows and their metrics, the functions
    started together as `Scored` starts its graders; their workers stopped after."""
    for f in functions:
        f.timeout = timeout

    def score(batch, state=None):
        grades = grade_all(functions, batch, state or RewardState())
        return types.SimpleNamespace(values=[list(g.scores) for g in grades], failed=check_faults(grades, batch, 0.5),
                                     metrics={k: v for g in grades for k, v in g.metrics.items()})

    try:
        yield score
    finally:
        for f in functions:
            f.close()


# --- the library -------------------------------------------------------------------------------
def test_each_function_is_called_once_per_batch_with_trls_keywords_and_concurrently(tmp_path):
    """Two functions in worker processes; each waits for the other to have started (a barrier through files),
    which only returns if the two calls run at the same time; each records the keywords it got."""
    (tmp_path / "r.py").write_text(f"""
import json, os, time
D = {str(tmp_path)!r}
def _meet(me, other):
    open(os.path.join(D, me), "w").close()
    end = time.time() + 10
    while not os.path.exists(os.path.join(D, other)):
        if time.time() > end:
            raise RuntimeError("the other function never started: calls are not concurrent")
        time.sleep(0.01)
def exact(prompts, completions, completion_ids, answer, trainer_state, **kw):
    _meet("a", "b")
    with open(os.path.join(D, "exact.log"), "a") as f:
        f.write(json.dumps({{"keys": sorted(kw), "n": len(prompts), "completions": completions, "ids": completion_ids,
                            "step": [trainer_state.global_step, trainer_state.max_steps]}}) + "\\n")
    kw["log_metric"]("hits", 2.0)
    return [float(c[-1]["content"] == a) for c, a in zip(completions, answer)]
def short(completions, **kw):
    _meet("b", "a")
    return [None if c[-1]["content"] == "skip" else -len(c[-1]["content"]) / 10 for c in completions]
""")
    batch = _batch(["5", "6", "skip", "5"], conversational=True, answer="5", level=[1, 2, 3, 4])
    with graded(RewardFunction(spec=f"{tmp_path / 'r.py'}:exact"), RewardFunction(spec=f"{tmp_path / 'r.py'}:short"),
                timeout=30) as score:
        scores = score(batch, RewardState(3, 10))
    assert scores.values == [[1.0, 0.0, 0.0, 1.0], [-0.1, -0.1, None, -0.1]] and not scores.failed
    assert scores.metrics == {"reward/exact/hits": 2.0}
    (call,) = [json.loads(line) for line in (tmp_path / "exact.log").read_text().splitlines()]  # ONE call, whole batch
    assert call["n"] == 4 and call["step"] == [3, 10] and call["ids"] == [[7, 0], [7, 1], [7, 2], [7, 3]]
    assert call["keys"] == ["level", "log_extra", "log_metric"]  # the other columns and TRL's hooks
    assert call["completions"][0] == [{"role": "assistant", "content": "5"}]  # conversational prompt: messages


def test_the_weighted_sum_leaves_none_out_and_logs_each_source():
    values = [[1.0, None, 0.5, None], [2.0, 3.0, None, None]]  # [K=2][N=4]
    assert combine(values, [1.0, 0.5]) == [2.0, 1.5, 0.5, None]  # None: that source does not apply (TRL)
    m = source_metrics(["exact", "short"], values)
    assert m["reward/exact/mean"] == 0.75 and m["reward/short/mean"] == 2.5
    assert math.isclose(m["reward/short/std"], math.sqrt(0.5))


def test_a_function_that_raises_shows_the_users_traceback_once_and_names_the_rows(tmp_path):
    (tmp_path / "r.py").write_text("def boom(prompts, completions, **kw):\n"
                                   "    out = []\n"
                                   "    for c in completions:\n"
                                   "        out.append(1 / len(c.strip()))\n"
                                   "    return out\n")
    with pytest.raises(RewardError) as e, graded(RewardFunction(spec=f"{tmp_path / 'r.py'}:boom")) as score:
        score(_batch(["a", " ", "b", ""], where="data/prompts.jsonl"))
    msg = str(e.value)
    assert msg.startswith(f"reward function boom ({tmp_path / 'r.py'}:boom) raised on 2 of 4 completions "
                          "(data/prompts.jsonl:2, data/prompts.jsonl:4)"), msg
    assert f'File "{tmp_path / "r.py"}", line 4, in boom' in msg and "ZeroDivisionError" in msg
    assert msg.count("Traceback") == 1 and "rewards.py" not in msg and "environment" not in msg


@pytest.mark.parametrize("returned, says", [
    ("[1.0, float('nan'), 0.0]", "prompts.jsonl:2: nan"),
    ("[1.0, 0.0, float('inf')]", "prompts.jsonl:3: inf"),
    ("[1.0, '1.0', 0.0]", "prompts.jsonl:2: '1.0' (str)"),
    ("[1.0, [0.5], 0.0]", "prompts.jsonl:2: [0.5] (list)"),
    ("[1.0, 0.0]", "returned 2 rewards for 3 completions"),
    ("0.5", "returned float 0.5; a reward function returns a list"),
    ("None", "returned NoneType None"),
])
def test_what_is_not_a_reward_is_an_error_naming_the_function_the_row_and_the_value(returned, says):
    fn = eval(f"lambda prompts, completions, **kw: {returned}")  # a callable: runs in a thread of this process
    with pytest.raises(RewardError, match="reward function <lambda>") as e:
        with graded(RewardFunction(fn)) as score:
            score(_batch(["a", "b", "c"]))
    assert says in str(e.value), str(e.value)


def test_none_numbers_of_numpy_and_bools_are_rewards():
    np = pytest.importorskip("numpy")
    def fn(completions, **kw):
        return np.array([1, 0, 1]) if completions[0] == "x" else [None, True, np.float32(0.5)]
    with graded(RewardFunction(fn, name="f")) as score:
        assert score(_batch(["x", "b", "c"])).values == [[1.0, 0.0, 1.0]]
        assert score(_batch(["y", "b", "c"])).values == [[None, 1.0, 0.5]]


def test_a_column_the_function_needs_is_checked_in_every_row(tmp_path):
    def exact(prompts, completions, answer, **kw):
        return [0.0] * len(prompts)

    def lenient(prompts, completions, answer=None, **kw):
        return [0.0] * len(prompts)

    tasks = _tasks(3, where="data/p.jsonl", answer="5", level=1)
    del tasks[1].columns["answer"]
    check_columns([RewardFunction(lenient)], tasks)  # a default: not required
    with pytest.raises(RewardError) as e:
        check_columns([RewardFunction(exact)], tasks)
    assert str(e.value).startswith("reward function exact needs column 'answer', but data/p.jsonl:2 has no 'answer'")
    assert "its columns: ['level']" in str(e.value)


def test_a_hanging_row_is_cut_after_the_timeout_and_fails_alone(tmp_path):
    (tmp_path / "r.py").write_text("import os, time\n"
                                   "def f(prompts, completions, **kw):\n"
                                   "    if 'slow' in completions:\n"
                                   "        time.sleep(600)  # a hang: only killing the worker process stops it\n"
                                   "    return [float(len(c)) for c in completions]\n"
                                   "def pid(prompts, completions, **kw):\n"
                                   "    return [float(os.getpid())] * len(completions)\n")
    f = RewardFunction(spec=f"{tmp_path / 'r.py'}:f")
    with graded(f, timeout=0.5) as score:
        t0 = time.monotonic()
        scores = score(_batch(["a", "bb", "slow", "c", "dd"]))
        took = time.monotonic() - t0
        assert scores.values == [[1.0, 2.0, None, 1.0, 2.0]]  # the others scored row by row
        assert scores.failed == {2: f"reward function f ({tmp_path / 'r.py'}:f) ran past its time limit (0.5 s) "
                                    "on prompts.jsonl:3"}
        assert took < 6, took  # the batch call (0.5 s) + one wave of per-row calls (0.5 s), not 600 s
        assert score(_batch(["a", "b"])).values == [[1.0, 1.0]]  # the killed worker was replaced
        with pytest.raises(RewardError, match=r"3 of 4 completions got no reward \(limit 50%\)"):
            score(_batch(["slow", "slow", "slow", "a"]))


def test_a_slow_import_is_not_counted_in_the_time_limit(tmp_path):
    (tmp_path / "r.py").write_text("import time\ntime.sleep(0.8)  # e.g. importing torch\n"
                                   "def f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    with graded(RewardFunction(spec=f"{tmp_path / 'r.py'}:f"), timeout=0.5) as score:
        assert score(_batch(["a", "b"])).values == [[1.0, 1.0]]


def test_a_hanging_callable_stops_the_waiting(tmp_path):
    """A plain callable runs in a thread: its call cannot be killed, but the batch does not wait for it."""
    import threading

    release = threading.Event()
    def fn(completions, **kw):
        return [0.0 if release.wait(30) else 0.0] if "slow" in completions else [1.0] * len(completions)
    try:
        with graded(RewardFunction(fn, name="f"), timeout=0.3) as score:
            scores = score(_batch(["a", "slow", "b"]))
        assert scores.values == [[1.0, None, 1.0]] and list(scores.failed) == [1]
    finally:
        release.set()


@pytest.mark.parametrize("source, spec, says", [
    ("def f(prompts, completions, **kw)\n    return []\n", "r.py:f", "r.py\", line 1"),
    ("import not_a_module_xyz\n", "r.py:f", "No module named 'not_a_module_xyz'"),
    ("def g(prompts, completions, **kw):\n    return []\n", "r.py:f", "has no callable 'f' (its functions: g)"),
    ("", "r.py", "expected 'module:function'"),
    ("", "missing.py:f", "no such file"),
])
def test_a_reward_file_that_does_not_load_is_a_clear_error(tmp_path, source, spec, says):
    (tmp_path / "r.py").write_text(source)
    with pytest.raises(RewardError, match="reward function") as e:
        load_reward_function(str(tmp_path / spec))
    assert says in str(e.value), str(e.value)


# --- trajtune grpo / rft ------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    from trajtune.models.hf_random import make_random_model

    d = tmp_path_factory.mktemp("rewards")
    make_random_model(d / "model", "qwen2", "tiny")
    with open(d / "prompts.jsonl", "w") as f:
        for i in range(4):
            row = {"prompt": [{"role": "user", "content": f"what is {i}+5?"}], "answer": str(i + 5)}
            f.write(json.dumps(row) + "\n")
    with open(d / "pairs.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": f"what is {i}+5?", "chosen": f"{i + 5}", "rejected": "hello world"}) + "\n")
    (d / "r.py").write_text(
        "def digits(prompts, completions, answer, **kw):\n"
        "    return [sum(ch.isdigit() for ch in c[-1]['content']) / 4 for c in completions]\n"
        "def length(completions, **kw):\n"
        "    return [len(c[-1]['content']) / 10 for c in completions]\n"
        "def broken(prompts, completions, **kw):\n"
        "    return [float('nan')] + [0.0] * (len(completions) - 1)\n"
        "def crash(prompts, completions, answer, **kw):\n"
        "    return [int(answer[0]) / 0 for c in completions]\n"
        "def needs(prompts, completions, solution, **kw):\n"
        "    return [0.0] * len(completions)\n")
    return d


def test_episodes_no_source_scored_or_whose_call_hung_are_left_out_of_the_update(tmp_path):
    """Scored: rewards set in order, group ids kept; an all-None row is unscorable (TRL) and a row whose call
    overran failed: neither is trained on (a made-up 0 would be a training signal), both are counted and marked."""
    import types

    import torch

    from trajtune.sources.base import Draw
    from trajtune.sources.graders import weighted
    from trajtune.sources.scoring import Scored

    from test_sources import Scripted

    def Fixed(trajs):
        return Scripted(lambda draw: list(trajs))

    from trajtune.trajectory import Outcome, Owner, Trajectory

    (tmp_path / "r.py").write_text("import time\n"
                                   "def a(completions, **kw):\n"
                                   "    if 'hang' in completions:\n"
                                   "        time.sleep(600)\n"
                                   "    return [None if c in ('none', 'hang') else 1.0 for c in completions]\n"
                                   "def b(completions, **kw):\n"
                                   "    return [None if c in ('none', 'b0') else 2.0 for c in completions]\n")
    functions = [RewardFunction(spec=f"{tmp_path / 'r.py'}:{f}", timeout=0.5) for f in "ab"]
    engine = types.SimpleNamespace(step=0, is_main=True)
    replies = ["ok", "none", "b0", "hang", "ok2"]
    trajs = [Trajectory([1, 2], [Owner.PROMPT, Owner.POLICY], [0, 0], group=i // 2, info={"actions": [r]})
             for i, r in enumerate(replies)]
    with Scored(Fixed(trajs), engine, weighted(functions, [1.0, 0.5]), max_steps=1) as source:
        episodes = source.take(Draw(_tasks(5), 1, torch.Generator()))
        kept = episodes.trainable
        assert [t.info["actions"][0] for t in kept] == ["ok", "b0", "ok2"] and [t.group for t in kept] == [0, 1, 2]
        assert [t.reward for t in kept] == [2.0, 1.0, 2.0]  # 1 + 0.5 * 2; b0: b is None, a alone
        assert [t.outcome for t in trajs] == [Outcome.OK, Outcome.UNSCORED, Outcome.OK, Outcome.REWARD_ERROR,
                                              Outcome.OK]
        assert "ran past its time limit" in trajs[3].info["reward_error"]
        assert trajs[2].info["rewards"] == {"a": 1.0, "b": None}
        assert episodes.metrics["reward/unscored"] == 1 and episodes.metrics["reward/failed"] == 1
        assert episodes.metrics["time/reward_s"] > 0
        with pytest.raises(RewardError, match="no reward source scored any of the batch's 2 completions"):
            none = [Trajectory([1, 2], [Owner.PROMPT, Owner.POLICY], [0, 0], info={"actions": ["none"]}) for _ in "ab"]
            Scored(Fixed(none), engine, weighted(functions)).take(Draw(_tasks(2), 1, torch.Generator()))


def _grpo(work, out, *flags):
    from trajtune.cli import main

    return main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--steps", "1",
                 "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--out", str(out), *flags])


def test_reward_flags_repeat_as_trl_users_write_them():
    from trajtune.cli import build_parser

    args = vars(build_parser().parse_args(["grpo", "--model", "m", "--data", "d", "--reward", "a.py:f", "--reward",
                                           "b.py:g", "--reward-weights", "1", "0.5"]))
    assert args["reward"] == ["a.py:f", "b.py:g"] and args["reward_weights"] == [1.0, 0.5]


def test_grpo_sums_weighted_rewards_and_logs_each(work, tmp_path):
    from trajtune.metrics import is_documented, read_metrics

    r = work / "r.py"
    assert _grpo(work, tmp_path / "g", "--reward", f"{r}:digits", f"{r}:length", "--reward-weights", "1", "0.5") == 0
    (row,) = read_metrics(tmp_path / "g")
    assert math.isclose(row["rollout/reward"], row["reward/digits/mean"] + 0.5 * row["reward/length/mean"])
    assert row["reward/length/mean"] > 0 and row["reward/failed"] == 0 and row["reward/unscored"] == 0
    assert all(is_documented(k) for k in row if k not in ("step", "time", "stage"))


@pytest.mark.parametrize("fn, says", [
    ("broken", "reward function broken ({r}:broken) returned 1 values that are not rewards: {p}:"),
    ("crash", "reward function crash ({r}:crash) raised on 4 of 4 completions"),
    ("needs", "reward function needs ({r}:needs) needs column 'solution', but {p}:1 has no 'solution'"),
])
def test_a_bad_reward_stops_the_command_with_a_clear_message(work, tmp_path, capsys, fn, says):
    assert _grpo(work, tmp_path / "g", "--reward", f"{work / 'r.py'}:{fn}") == 2  # was: NaN skipped every step, exit 0
    err = capsys.readouterr().err
    assert says.format(r=work / "r.py", p=work / "prompts.jsonl") in err, err
    assert "environment" not in err and not (tmp_path / "g" / "model").exists()
    if fn == "crash":
        assert f'File "{work / "r.py"}", line 8, in crash' in err and err.count("Traceback") == 1


def test_a_trained_reward_model_is_a_reward(work, tmp_path, capsys):
    """`trajtune rm`'s model scores completions as the sequence classifier it saves: the logged
    reward/reward_model/mean is the mean of AutoModelForSequenceClassification's logits on the rendered
    prompt + completion; it sums with a function through the weights."""
    import torch

    from trajtune.cli import main
    from trajtune.experiments.hf.graders import reward_model
    from trajtune.metrics import read_metrics

    assert main(["rm", "--model", str(work / "model"), "--data", str(work / "pairs.jsonl"), "--steps", "2",
                 "--lr", "1e-2", "--out", str(tmp_path / "rm")]) == 0
    rm = tmp_path / "rm" / "model"
    assert _grpo(work, tmp_path / "g", "--reward", f"{work / 'r.py'}:length", "--reward-model", str(rm),
                 "--reward-weights", "1", "2") == 0  # the weights: the functions', then the reward model's
    (row,) = read_metrics(tmp_path / "g")
    assert math.isclose(row["rollout/reward"], 2 * row["reward/reward_model/mean"] + row["reward/length/mean"])

    class Ctx:
        engine = staticmethod(lambda model, optim=None, **kw: __import__("trajtune.engine").engine.make_engine(
            model, optim, **kw))

    from trajtune.experiments.hf.model import ModelConfig

    batch = _batch(["the answer is 5", "hello"], conversational=True)
    ours = reward_model(Ctx(), str(rm), ModelConfig(path=str(rm)))(batch)
    tok = transformers.AutoTokenizer.from_pretrained(rm)
    clf = transformers.AutoModelForSequenceClassification.from_pretrained(rm)
    texts = [tok.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": c}],
                                     tokenize=False) for c in ("the answer is 5", "hello")]
    with torch.no_grad():
        theirs = [clf(**tok(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item() for t in texts]
    assert ours == pytest.approx(theirs, abs=1e-4) and ours[0] != ours[1]
    assert _grpo(work, tmp_path / "x", "--reward-model", str(work / "model")) == 2  # a policy, not a reward model
    assert "not a reward model saved by `trajtune rm`" in capsys.readouterr().err


def test_rft_takes_several_rewards(work, tmp_path):
    from trajtune.cli import main
    from trajtune.metrics import read_metrics

    r = work / "r.py"
    assert main(["rft", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--rounds", "1",
                 "--steps", "1", "--group-size", "2", "--max-new-tokens", "4", "--threshold", "0.0",
                 "--reward", f"{r}:digits", f"{r}:length", "--reward-weights", "0", "1",
                 "--out", str(tmp_path / "rft")]) == 0
    (row,) = read_metrics(tmp_path / "rft")
    assert row["rft/sampled"] == 8 and math.isclose(row["rollout/reward"], row["reward/length/mean"])


@pytest.mark.parametrize("flags, says", [
    (["--reward", "r.py:f", "--reward-weights", "1", "2"], "--reward-weights has 2 numbers for 1 reward sources "
                                                           "(--reward r.py:f); give one weight per source"),
    (["--reward", "r.py:f", "--reward-timeout", "-1"], "--reward-timeout must be >= 0"),
    (["--reward-weights", "1"], "needs a reward source: --reward module:function, --reward-model DIR, --reward-judge"),
])
def test_reward_options_are_checked_before_anything_loads(tmp_path, capsys, flags, says):
    from trajtune.cli import main

    assert main(["grpo", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o"), *flags]) == 2
    assert says in capsys.readouterr().err
