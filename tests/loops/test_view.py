"""Recording episodes while training (trajtune/runs/recorder.py, Run.record_episodes) and `trajtune view`
(trajtune/runs/view.py, trajtune/cli/view.py).

The page is checked with an HTML parser: every token is a span coloured by its owner, every policy
token's numbers are in its tooltip and in the side table, the filters are there, and nothing is
loaded from the network.
"""

import json
import math
from dataclasses import dataclass
from html.parser import HTMLParser

import pytest
import torch

from trajtune.algorithms.rft import RFTConfig, train_rft
from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.cli import main
from trajtune.sources.episodes import EpisodeSource
from trajtune.engine import OptimConfig, make_engine
from trajtune.envs.base import SingleTurnEnv
from trajtune.runs.recorder import EpisodeRecorder, read_episodes
from trajtune.runs.loop import Run
from trajtune.models.tiny import TinyConfig, TinyTransformer, save_model
from trajtune.objectives.advantages import group_advantages
from trajtune.runs.resume import Checkpointer
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner, Trajectory
from trajtune.runs.view import flags, write_view
from trajtune.sources.sampler import Decoder, SamplerSettings

TOK = CharTokenizer.from_corpus("Q: pickabcdef")
RENDER = Renderer(TOK)


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str = "Q: pick"


def verifier(task, reply):
    ok = reply == "a"
    info = {"correct": ok}
    if task.name == "pick1":  # a "hack": public checks pass, hidden ones do not
        info.update(public_pass=True, hidden_pass=False)
    return float(ok), info


def engine(seed=0):
    torch.manual_seed(seed)
    model = TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=1, n_heads=2, max_len=32))
    return make_engine(model, OptimConfig(lr=1e-2))


def collect_for(e):
    return EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=3)), lambda: SingleTurnEnv(verifier), RENDER,
                         max_turns=1, max_tokens=32)


TASKS = [Task(f"pick{i}") for i in range(4)]


def rl_run(tmp_path, steps=4, **kw):
    e = engine()
    run = Run("rl", checkpointer=Checkpointer(tmp_path / "rl" / "resume"))
    run.hooks[0].every = 2  # the Run's episode recorder
    config = RLConfig(steps=steps, tasks_per_step=3, group_size=4, advantage="grpo", **kw)
    train_rl(e, TASKS, collect_for(e), config, TOK.pad_id, run)
    save_model(tmp_path / "rl" / "checkpoint", e.model, TOK)
    return read_episodes(tmp_path / "rl" / "episodes.jsonl")


# --- recording -------------------------------------------------------------------------------------
def test_rl_records_a_few_episodes_of_the_due_steps_with_their_numbers(tmp_path):
    rows = rl_run(tmp_path)
    assert sorted({r["step"] for r in rows}) == [1, 2, 4]  # step 1, then every 2
    for step in (1, 2, 4):
        at = [r for r in rows if r["step"] == step]
        assert len(at) == 6 and [r["index"] for r in at] == [0, 1, 4, 5, 8, 9]  # 2 per group, 3 groups
    for r in rows:
        n = len(r["ids"])
        assert all(len(r[k]) == n for k in ("owners", "turns", "sampler_logp", "trainer_logp", "advantage"))
        policy = [i for i, o in enumerate(r["owners"]) if o == Owner.POLICY]
        assert policy and all(r["trainer_logp"][i] == 0.0 and r["advantage"][i] == 0.0
                              for i in range(n) if i not in policy)
        # on-policy: the trainer's weights before the update are the sampler's -> ratio 1
        assert all(abs(r["trainer_logp"][i] - r["sampler_logp"][i]) < 1e-3 for i in policy)
        assert all(r["sampler_logp"][i] < 0 for i in policy)
    assert all(r["task"] == r["info"]["task"] and r["reward"] in (0.0, 1.0) for r in rows)


def test_recorded_advantage_is_the_group_advantage(tmp_path):
    rec = EpisodeRecorder(tmp_path / "e.jsonl", every=1, k=8, per_group=4)
    e = engine()
    trajs = collect_for(e).run(TASKS[:2], 4, torch.Generator().manual_seed(0))
    for t, r in zip(trajs, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], strict=True):
        t.reward = r
    from dataclasses import replace

    from trajtune.objectives.inputs import PGInputs
    from trajtune.trajectory import collate

    batch = collate(trajs, TOK.pad_id)
    adv = group_advantages(batch.rewards, batch.groups, baseline="mean", std_normalize=True)
    rec.record(e, "rl", 1, trajs, replace(batch, pg=PGInputs(adv)))
    rows = read_episodes(tmp_path / "e.jsonl")
    for r, a in zip(rows, adv.tolist(), strict=True):
        got = {v for v, o in zip(r["advantage"], r["owners"], strict=True) if o == Owner.POLICY}
        assert got == {round(a, 4)}


def test_recorder_bounds_resume_and_rft(tmp_path):
    path = tmp_path / "e.jsonl"
    rec = EpisodeRecorder(path, every=3, k=2, per_group=1)
    assert [s for s in range(1, 10) if rec.due(s)] == [1, 3, 6, 9]
    trajs = [Trajectory(ids=[1, 2, 3], owners=[1, 2, 2], turns=[0, 0, 0], logprobs=[0.0, -1.0, -2.0], group=g)
             for g in (0, 0, 1, 1)]
    assert rec.rows(trajs) == [0, 2]
    e = engine()
    for step in (1, 3, 6):
        rec.record(e, "rft", step, trajs, pad_id=0, kept=[trajs[2]])
    rows = read_episodes(path)
    assert [(r["step"], r["index"], r["kept"]) for r in rows] == [(1, 0, False), (1, 2, True), (3, 0, False),
                                                                 (3, 2, True), (6, 0, False), (6, 2, True)]
    assert rows[1]["advantage"] == [0.0, 1.0, 1.0] and rows[0]["advantage"] == [0.0, 0.0, 0.0]
    rec.drop_after(3)  # a stage resumed from step 3
    assert sorted({r["step"] for r in read_episodes(path)}) == [1, 3]
    small = EpisodeRecorder(path, every=1, max_bytes=10)  # the file is already past 10 bytes: nothing more
    small.record(e, "rft", 7, trajs, pad_id=0)
    assert not small.due(8) and sorted({r["step"] for r in read_episodes(path)}) == [1, 3]


def test_rft_records_every_round_with_the_selection(tmp_path):
    e = engine()
    run = Run("rft", checkpointer=Checkpointer(tmp_path / "rft" / "resume"))
    train_rft(e, TASKS[:2], collect_for(e), RFTConfig(rounds=2, samples_per_task=4, steps_per_round=1, batch_size=4),
              TOK.pad_id, run)
    rows = read_episodes(tmp_path / "rft" / "episodes.jsonl")
    assert sorted({r["step"] for r in rows}) == [1, 2]
    assert all(r["kept"] == (r["reward"] >= 1.0) for r in rows)  # select='accepted', threshold 1


def test_a_bare_run_records_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    e = engine()
    train_rl(e, TASKS, collect_for(e), RLConfig(steps=1, tasks_per_step=2, group_size=2), TOK.pad_id, Run("rl"))
    assert not list(tmp_path.rglob("episodes.jsonl"))


# --- the page ----------------------------------------------------------------------------------------
class Page(HTMLParser):
    """Collects the episodes' sections, token spans (class, tooltip, text), side-table rows and filters."""

    def __init__(self):
        super().__init__()
        self.sections, self.ids, self.external = [], set(), []
        self._span = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("src", "href"):
            if key in a and "//" in a[key]:
                self.external.append(a[key])
        if tag == "link" or (tag == "script" and "src" in a):
            self.external.append(str(a))
        if tag == "section" and "episode" in a.get("class", ""):
            self.sections.append({"data": {k[5:]: v for k, v in a.items() if k.startswith("data-")},
                                  "tokens": [], "rows": []})
        elif tag == "span" and a.get("class", "").startswith("t ") and self.sections:
            self._span = {"class": a["class"].split(), "title": a.get("title", ""), "text": ""}
        elif tag == "tr" and self.sections:
            self.sections[-1]["rows"].append([])
        elif tag == "td":
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "span" and self._span is not None:
            self.sections[-1]["tokens"].append(self._span)
            self._span = None
        elif tag == "td" and self._cell is not None:
            self.sections[-1]["rows"][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._span is not None:
            self._span["text"] += data
        if self._cell is not None:
            self._cell += data


def test_view_page_shows_every_token_by_owner_with_its_numbers(tmp_path, capsys):
    rows = rl_run(tmp_path)
    assert main(["view", str(tmp_path)]) == 0
    out = tmp_path / "view.html"
    assert capsys.readouterr().out.strip() == str(out)
    page = Page()
    page.feed(out.read_text())
    assert not page.external  # offline: no CDN, no remote script or style
    assert {"f-stage", "f-step", "f-task", "f-rmin", "f-rmax", "f-hacked", "f-failed", "count", "panel"} <= page.ids
    assert len(page.sections) == len(rows)
    names = {int(o): o.name.lower() for o in Owner}
    for section, row in zip(page.sections, sorted(rows, key=lambda r: (r["step"], r["index"])), strict=True):
        assert section["data"]["step"] == str(row["step"]) and section["data"]["task"] == row["task"]
        assert float(section["data"]["reward"]) == row["reward"]
        assert section["data"]["hacked"] == str(int(row["task"] == "pick1"))
        assert [t["class"][1] for t in section["tokens"]] == [names[o] for o in row["owners"]]
        assert "".join(t["text"] for t in section["tokens"]) == "".join(TOK.itos[i] for i in row["ids"])
        policy = [i for i, o in enumerate(row["owners"]) if o == Owner.POLICY]
        table = [r for r in section["rows"] if r]  # the side table: one row per policy token
        assert [int(r[0]) for r in table] == policy
        for i, cells in zip(policy, table, strict=True):
            tip = section["tokens"][i]["title"]
            ratio = math.exp(row["trainer_logp"][i] - row["sampler_logp"][i])
            for label, v in (("sampler logp", row["sampler_logp"][i]), ("trainer logp", row["trainer_logp"][i]),
                             ("advantage", row["advantage"][i]), ("ratio", ratio)):
                assert f"{label} {v:.3f}" in tip
            assert cells[2:] == [f"{v:.3f}" for v in (row["sampler_logp"][i], row["trainer_logp"][i],
                                                      row["advantage"][i], ratio)]
        assert all("ratio" not in section["tokens"][i]["title"] for i in range(len(row["ids"])) if i not in policy)


def test_view_chosen_steps_and_errors(tmp_path, capsys):
    rl_run(tmp_path)
    out = write_view(tmp_path, tmp_path / "v.html", steps=[2])
    page = Page()
    page.feed(out.read_text())
    assert {s["data"]["step"] for s in page.sections} == {"2"}
    assert main(["view", str(tmp_path / "nowhere")]) == 2
    assert "no run directory" in capsys.readouterr().err
    assert main(["view", str(tmp_path), "--steps", "3"]) == 2
    assert "no recorded episode" in capsys.readouterr().err
    assert main(["view", str(tmp_path), "--steps", "x"]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty")]) == 2
    assert "has no episodes.jsonl" in capsys.readouterr().err


def test_flags():
    assert flags({"info": {"public_pass": True, "hidden_pass": False}}) == {"hacked": True, "failed": False}
    assert flags({"info": {"public_pass": True, "hidden_pass": True}}) == {"hacked": False, "failed": False}
    assert flags({"info": {"env_error": "ValueError: x", "stop_reason": "env_error"}})["failed"]


@pytest.mark.parametrize("bad", ["{not json", '{"step": 1'])
def test_a_broken_episodes_file_names_its_line(tmp_path, bad):
    f = tmp_path / "episodes.jsonl"
    f.write_text(json.dumps({"step": 1, "index": 0}) + "\n" + bad + "\n")
    with pytest.raises(ValueError, match="episodes.jsonl:2"):
        read_episodes(f)
    assert main(["view", str(f)]) == 2  # said in one line, no traceback


def test_hf_grpo_records_and_the_page_decodes_with_the_models_tokenizer(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import make_random_model

    make_random_model(tmp_path / "model", "qwen2", "tiny")
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for i in range(2):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i}+5?"}],
                                "answer": str(i + 5)}) + "\n")
    (tmp_path / "rewards.py").write_text("def digit(prompts, completions, **kw):\n"
                                         "    return [float(any(ch.isdigit() for ch in c[-1]['content'])) "
                                         "for c in completions]\n")
    out = tmp_path / "grpo"
    assert main(["grpo", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "prompts.jsonl"), "--reward",
                 f"{tmp_path / 'rewards.py'}:digit", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                 "--max-new-tokens", "3", "--out", str(out)]) == 0
    rows = [r for f in out.rglob("episodes.jsonl") for r in read_episodes(f)]
    assert rows and {r["step"] for r in rows} == {1}
    # the data row's answer is recorded, and a completion cut at --max-new-tokens stops on "length", not "done"
    assert all(r["info"]["expected"] == str(int(r["task"][3:]) + 5) for r in rows)
    assert all(r["info"]["stop_reason"] == ("length" if r["info"]["n_unterminated"] else "done") for r in rows)
    assert any(r["info"]["stop_reason"] == "length" for r in rows)  # 3 tokens: a random model's replies are cut
    page = Page()
    text = write_view(out).read_text()
    assert (text.split('<main>')[1].count('class="badge length"')
            == sum(r["info"]["stop_reason"] == "length" for r in rows))
    page.feed(text)  # the tokenizer found in the run (its saved model)
    text = "".join(t["text"] for t in page.sections[0]["tokens"])
    assert "what is" in text and "#" not in text  # decoded by the model's own tokenizer, not shown as ids


def test_each_stage_is_decoded_with_its_own_tokenizer(tmp_path):
    from trajtune.runs.recorder import episode_row

    for stage, letters in (("chars", "xyz"), ("other", "pqr")):
        tok = CharTokenizer.from_corpus(letters)
        (tmp_path / stage / "checkpoint").mkdir(parents=True)
        tok.save(tmp_path / stage / "checkpoint" / "tokenizer.json")
        t = Trajectory(ids=tok.encode(letters), owners=[1, 2, 2], turns=[0, 0, 0], logprobs=[0.0, -1.0, -1.0])
        row = episode_row(stage, 1, 0, t, torch.zeros(2), torch.tensor(0.5), None)
        (tmp_path / stage / "episodes.jsonl").write_text(json.dumps(row) + "\n")
    page = Page()
    page.feed(write_view(tmp_path).read_text())
    assert ["".join(t["text"] for t in s["tokens"]) for s in page.sections] == ["xyz", "pqr"]


# --- what happened: the stop reason, whole tokens, the expected answer, runs with nothing to show -----------------
class FixedReplies:
    """A fake sampler: episode i replies `replies[i]` (token ids), with the stop token when it fits the budget."""

    def __init__(self, replies):
        self.replies = replies

    def __call__(self, prompts, max_new_tokens, generator, *, stop_ids=(), **kw):
        from trajtune.engine.decoding import Samples

        tokens = [(r + [stop_ids[0]])[:max_new_tokens] for r in self.replies[: len(prompts)]]
        return Samples(tokens, [[-0.5] * len(t) for t in tokens], [t[-1] in stop_ids for t in tokens])


def rows_of(trajs, stage="grpo"):
    from trajtune.runs.recorder import episode_row

    return [json.loads(json.dumps(episode_row(stage, 1, i, t, torch.zeros(len(t) - 1), torch.tensor(0.0), None),
                                  default=str)) for i, t in enumerate(trajs)]


def test_a_reply_cut_at_the_token_budget_stops_on_length_and_the_page_marks_and_filters_it(tmp_path):
    from trajtune.runs.view import stop_reason
    from trajtune.sources.rollout import rollout_batch

    tasks = [Task("pick0"), Task("pick1"), Task("pick2")]
    replies = [TOK.encode("a"), TOK.encode("abc"), TOK.encode("ab")]  # budget 3: "abc" is cut, "ab<|end|>" just fits
    trajs = rollout_batch(Decoder(FixedReplies(replies), SamplerSettings(max_new_tokens=3)),
                          [SingleTurnEnv(verifier) for _ in tasks], tasks, RENDER, None,
                          max_turns=1, max_tokens=32)
    assert [t.info["stop_reason"] for t in trajs] == ["done", "length", "done"]  # the env said done on all three
    assert [t.unterminated for t in trajs] == [0, 1, 0]
    rows = rows_of(trajs)
    assert [r["info"]["stop_reason"] for r in rows] == ["done", "length", "done"]  # recorded as it happened
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_view(tmp_path).read_text()
    page = Page()
    page.feed(text)
    assert [s["data"]["stop"] for s in page.sections] == ["done", "length", "done"]
    assert text.split('<main>')[1].count('class="badge length"') == 1  # the cut episode's, besides the legend's
    stop_filter = text[text.index('id="f-stop"'):text.index("</select>", text.index('id="f-stop"'))]
    assert [v for v in ("done", "length") if f'value="{v}"' in stop_filter] == ["done", "length"]
    assert "d.stop===so" in text  # the filter reads each episode's data-stop
    # rows recorded before the rollout said "length": done, with every turn unterminated
    assert stop_reason({"info": {"stop_reason": "done", "n_turns": 1, "n_unterminated": 1}}) == "length"
    assert stop_reason({"info": {"stop_reason": "done", "n_turns": 2, "n_unterminated": 1}}) == "done"
    assert stop_reason({"info": {"stop_reason": "max_turns", "n_turns": 3, "n_unterminated": 3}}) == "max_turns"


def css_rules(text):
    import re

    css = text[text.index("<style>") + 7:text.index("</style>")]
    return {sel.strip(): body for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}


def test_tokens_are_never_split_across_lines(tmp_path):
    from trajtune.runs.recorder import episode_row

    tok = CharTokenizer.from_corpus("ab\n")
    t = Trajectory(ids=tok.encode("ab\nab"), owners=[1, 2, 2, 2, 2], turns=[0] * 5, logprobs=[0.0] + [-1.0] * 4)
    (tmp_path / "episodes.jsonl").write_text(json.dumps(episode_row("rl", 1, 0, t, torch.zeros(4), torch.tensor(0.0),
                                                                    None)) + "\n")
    tok.save(tmp_path / "tokenizer.json")
    text = write_view(tmp_path).read_text()
    rules = css_rules(text)
    # lines wrap between tokens
    assert "break-all" not in rules[".tokens"] and "white-space:pre-wrap" in rules[".tokens"]
    assert "display:inline-block" in rules[".t"] and "white-space:pre" in rules[".t"]  # never inside one
    assert "display:inline" in rules[".t.nl"]  # a token holding a line break breaks the line where it says
    page = Page()
    page.feed(text)
    spans = page.sections[0]["tokens"]
    assert [s["text"] for s in spans] == ["a", "b", "\n", "a", "b"]
    assert ["nl" in s["class"] for s in spans] == [False, False, True, False, False]


def test_the_expected_answer_is_recorded_and_shown(tmp_path):
    from trajtune.envs.arithmetic import ArithmeticTask
    from trajtune.sources.data import PromptTask
    from trajtune.sources.rollout import expected_answer, rollout_batch

    rows_with = [PromptTask("row4", "Q: pick", {"answer": "a"}), PromptTask("row5", "Q: pick", {"reference": ["a"]})]
    assert [expected_answer(t) for t in rows_with] == ["a", ["a"]]
    assert expected_answer(ArithmeticTask(12, 30)) == "42" and expected_answer(Task("pick0")) is None
    tasks = [*rows_with, Task("pick0")]
    trajs = rollout_batch(Decoder(FixedReplies([TOK.encode("b")] * 3), SamplerSettings(max_new_tokens=3)),
                          [SingleTurnEnv(verifier) for _ in tasks], tasks, RENDER,
                          None, max_turns=1, max_tokens=32)
    assert [t.info.get("expected") for t in trajs] == ["a", ["a"], None]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_of(trajs)))
    text = write_view(tmp_path).read_text()
    sections = text.split('<section class="episode"')[1:]
    assert "expected <code class='expected'>a</code>" in sections[0]
    assert "expected <code class='expected'>[&quot;a&quot;]</code>" in sections[1]
    assert "expected <code" not in sections[2]  # nothing to check against: nothing shown


def test_view_of_an_sft_run_says_sft_samples_no_episodes(tmp_path, capsys):
    run = tmp_path / "sft-run"
    (run / "sft").mkdir(parents=True)
    (run / "sft" / "results.json").write_text("{}")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "stage": "sft", "train/loss": 2.0}) + "\n")
    assert main(["view", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "SFT samples no episodes" in err and "stage sft" in err and len(err.splitlines()) == 1
    assert err.startswith("trajtune: error: trajtune view:") and "Traceback" not in err
    (run / "metrics.jsonl").unlink()  # the stage directories say it too
    assert main(["view", str(run)]) == 2 and "SFT samples no episodes" in capsys.readouterr().err
    (run / "rl").mkdir()  # a run with an RL stage and no episodes is another story
    (run / "rl" / "results.json").write_text("{}")
    assert main(["view", str(run)]) == 2
    err = capsys.readouterr().err
    assert "has no episodes.jsonl" in err and "samples no episodes" not in err
