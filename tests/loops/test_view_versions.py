"""Policy versions in the episode records and `trajtune view` (trajtune/runs/recorder.py, trajtune/runs/view.py) and
through the resume module's episode JSON (trajtune/runs/resume.py): recorded only where an episode carries them,
every policy token coloured by how far behind the step that trained it its version is, and the page of a run
without versions as it was."""

import json

import torch
from test_view import TASKS, TOK, Page, collect_for, engine

from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.cli import main
from trajtune.models.tiny import save_model
from trajtune.runs.loop import Run
from trajtune.runs.recorder import EpisodeRecorder, episode_row, read_episodes
from trajtune.runs.resume import Checkpointer, trajectories_from_json, trajectories_to_json
from trajtune.runs.view import write_view
from trajtune.sources.base import Wrapper
from trajtune.trajectory import Owner, Trajectory

P, A, T, X = int(Owner.PROMPT), int(Owner.POLICY), int(Owner.TEMPLATE), int(Owner.TOOL)
OLD_KEYS = ["stage", "step", "index", "group", "task", "reward", "outcome", "info", "kept", "ids", "owners", "turns",
            "sampler_logp", "trainer_logp", "advantage"]


def episode(owners, versions=None, group=0):
    n = len(owners)
    ids = TOK.encode("Q: pickabcdef"[:n])
    return Trajectory(ids=ids, owners=owners, turns=[0] * n, logprobs=[0.0 if o != A else -1.0 for o in owners],
                      group=group, info={"task": f"pick{group}"}, versions=versions)


# a partial rollout trained at step 4 (recorded as step 4: the weights after 3 updates trained it): its policy tokens
# were sampled by versions 1, 1, 2 and 3 -> 3 - 1 = 2, 2, 3 - 2 = 1 and 3 - 3 = 0 updates behind
PARTIAL = ([P, A, A, X, A, A, T], [-1, 1, 1, -1, 2, 3, -1])


def test_versions_are_recorded_only_where_the_episode_carries_them(tmp_path):
    rec = EpisodeRecorder(tmp_path / "e.jsonl", every=1, k=8, per_group=1)
    trajs = [episode(PARTIAL[0], PARTIAL[1], group=0), episode([P, A, A], group=1)]
    rec.record(engine(), "rl", 4, trajs, pad_id=TOK.pad_id)
    with_versions, without = read_episodes(tmp_path / "e.jsonl")
    assert list(with_versions) == OLD_KEYS + ["versions"] and with_versions["versions"] == PARTIAL[1]
    assert list(without) == OLD_KEYS  # the row of an episode without versions: as before versions existed
    line = json.dumps(episode_row("rl", 1, 0, trajs[1], torch.zeros(2), torch.tensor(0.5), None))
    assert '"versions"' not in line


def test_the_resume_json_round_trips_versions():
    t = episode(PARTIAL[0], PARTIAL[1])
    (back,) = trajectories_from_json(json.loads(json.dumps(trajectories_to_json([t]))))
    assert back.versions == PARTIAL[1] and back.owners == t.owners
    (none,) = trajectories_from_json(json.loads(json.dumps(trajectories_to_json([episode([P, A])]))))
    assert none.versions is None
    row = trajectories_to_json([episode([P, A])])[0]
    del row["versions"]  # a file written before the field: no versions
    assert trajectories_from_json([row])[0].versions is None


def write_rows(tmp_path, trajs, step=4):
    rows = [episode_row("rl", step, i, t, torch.zeros(len(t) - 1), torch.tensor(0.5), None)
            for i, t in enumerate(trajs)]
    (tmp_path / "rl").mkdir(exist_ok=True)
    (tmp_path / "rl" / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    TOK.save(tmp_path / "rl" / "tokenizer.json")


def test_the_page_colours_policy_tokens_by_version(tmp_path, capsys):
    write_rows(tmp_path, [episode(*PARTIAL), episode([P, A, A], [-1, 3, 3], group=1), episode([P, A, A], group=2)])
    assert main(["view", str(tmp_path)]) == 0
    text = (tmp_path / "view.html").read_text()
    page = Page()
    page.feed(text)
    partial, fresh, plain = page.sections
    lags = [next((c for c in s["class"] if c.startswith("lag")), None) for s in partial["tokens"]]
    assert lags == [None, "lag2", "lag2", None, "lag1", "lag0", None]  # policy tokens only (hand-worked above)
    tips = [s["title"] for s in partial["tokens"]]
    assert "version 1 (2 behind the step that trained it)" in tips[1] and "version 3 (0 behind" in tips[5]
    assert all("version" not in tips[i] for i in (0, 3, 6))
    table = [r for r in partial["rows"] if r]  # the side table's last column
    assert [r[-1] for r in table] == ["version 1 (2 behind the step that trained it)",
                                      "version 1 (2 behind the step that trained it)",
                                      "version 2 (1 behind the step that trained it)",
                                      "version 3 (0 behind the step that trained it)"]
    # several versions: the partial rollout's "resumed" badge, and only its
    sections = text.split('<section class="episode"')[1:]
    assert ['class="badge resumed"' in s for s in sections] == [True, False, False]
    assert "policy versions 1, 2, 3" in sections[0]
    assert "sampled by versions 1 (2 behind), 2 (1 behind), 3 (0 behind) · stop" in sections[0]
    assert "sampled by version 3 (0 behind) · stop" in sections[1] and "sampled by" not in sections[2]
    assert [c for s in fresh["tokens"] for c in s["class"] if c.startswith("lag")] == ["lag0", "lag0"]
    # the episode without versions in the same page: owner colours, no version column
    assert not any(c.startswith("lag") for s in plain["tokens"] for c in s["class"])
    assert all(len(r) == 6 for r in plain["rows"] if r) and "<th>version</th>" not in sections[2]
    # the legend: the lags the page holds, and the switch back to owner colours
    assert "f-versions" in page.ids and "<body class=by-version>" in text
    legend = text[text.index('<div class="legend versions">'):text.index('<div id="panel">')]
    assert [c for c in ("lag0", "lag1", "lag2", "lag3", "lag4", "lag5", "lagx") if c in legend] == ["lag0", "lag1",
                                                                                                   "lag2"]
    assert "0 (on-policy)" in legend and ".by-version .t.policy.lag2{" in text


def test_a_page_without_versions_has_none_of_it(tmp_path):
    write_rows(tmp_path, [episode([P, A, A], group=g) for g in range(2)])
    text = write_view(tmp_path).read_text()
    for mark in ("class=by-version", "lag", "f-versions", "<th>version</th>", "behind the step", "badge resumed"):
        assert mark not in text, mark
    assert "<body>" in text


def test_a_token_without_a_version_in_a_row_with_versions_says_unknown(tmp_path):
    write_rows(tmp_path, [episode([P, A, A], [-1, 3, -1])])
    page = Page()
    text = write_view(tmp_path).read_text()
    page.feed(text)
    assert [c for s in page.sections[0]["tokens"] for c in s["class"] if c.startswith("lag")] == ["lag0", "lagx"]
    assert [r[-1] for r in page.sections[0]["rows"] if r] == ["version 3 (0 behind the step that trained it)",
                                                              "unknown"]
    assert '<span class="t policy lagx">unknown</span>' in text


class Stamped(Wrapper):
    """The episodes of step s stamped as sampled by the weights after max(0, s - behind) updates (what an overlapped
    source K = `behind` steps ahead stamps; the sampling itself stays on-policy: only the record is under test)."""

    def __init__(self, inner, behind):
        super().__init__(inner)
        self.behind = behind

    def take(self, draw, ahead=None):
        episodes = self.inner.take(draw, ahead)
        for t in episodes.trajs:
            t.stamp(max(0, draw.step - self.behind))
        return episodes


def test_an_rl_run_records_its_versions_and_the_page_shows_how_far_behind(tmp_path):
    e = engine()
    run = Run("rl", checkpointer=Checkpointer(tmp_path / "rl" / "resume"))
    run.hooks[0].every = 2  # the Run's episode recorder: steps 1, 2 and 4
    train_rl(e, TASKS, Stamped(collect_for(e), behind=1),
             RLConfig(steps=4, tasks_per_step=3, group_size=4, advantage="grpo"), TOK.pad_id, run)
    save_model(tmp_path / "rl" / "checkpoint", e.model, TOK)
    rows = read_episodes(tmp_path / "rl" / "episodes.jsonl")
    # loop step s (0-based) is recorded as step s + 1 and stamped max(0, s - 1): recorded 1 -> 0, 2 -> 0, 4 -> 2
    for r in rows:
        assert {v for v, o in zip(r["versions"], r["owners"], strict=True) if o == Owner.POLICY} == \
            {{1: 0, 2: 0, 4: 2}[r["step"]]}
        assert all(v == -1 for v, o in zip(r["versions"], r["owners"], strict=True) if o != Owner.POLICY)
    page = Page()
    page.feed(write_view(tmp_path).read_text())
    # how far behind the step that trained it: recorded step n trained with n - 1 updates -> 0, 1 and 1 behind
    for section in page.sections:
        lags = {c for s in section["tokens"] for c in s["class"] if c.startswith("lag")}
        assert lags == {{"1": "lag0", "2": "lag1", "4": "lag1"}[section["data"]["step"]]}
        tips = [s["title"] for s in section["tokens"] if "policy" in s["class"]]
        want = {"1": "version 0 (0 behind", "2": "version 0 (1 behind", "4": "version 2 (1 behind"}
        assert tips and all(want[section["data"]["step"]] in tip for tip in tips)
