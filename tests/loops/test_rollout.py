"""Lockstep rollouts: one renderer for scripted and sampled episodes, limits, logprobs, the protocol."""

import functools

import pytest
import torch

from trajtune.envs.arithmetic import arithmetic_env, arithmetic_tokenizer, make_tasks as arithmetic_tasks
from trajtune.envs.base import Env, SingleTurnEnv
from trajtune.envs.bugfix import BugFixEnv, build_tokenizer
from trajtune.envs.bugfix_tasks import make_tasks
from trajtune.envs.scripted import ArithmeticOracle, bugfix_policy
from trajtune.logprobs import sequence_log_probs
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.sources.episodes import EpisodeSource
from trajtune.sources.rollout import rollout_batch, scripted_rollout, task_groups
from trajtune.engine.decoding import Samples, sample
from trajtune.text.render import Renderer
from trajtune.trajectory import Owner, collate
from trajtune.sources.sampler import Decoder, SamplerSettings

TOK = build_tokenizer()
TASKS = make_tasks("train")


class ReplaySampler:
    """A fake model: replays fixed action texts. Which episode a prompt belongs to is read off the prompt
    (its first user message); which turn, off the number of assistant headers in it."""

    def __init__(self, renderer, scripts, stop=True):
        self.renderer, self.stop, self.calls = renderer, stop, []
        self.scripts = {self._key(renderer.generation_prompt([{"role": "user", "content": issue}])): acts
                        for issue, acts in scripts.items()}

    def _key(self, prompt):
        return tuple(prompt[: prompt.index(self.renderer.end_id)])

    def __call__(self, prompts, max_new_tokens, generator, *, stop_ids=(), **kw):
        self.calls.append(len(prompts))
        tokens = []
        for p in prompts:
            turn = p.count(self.renderer.header_ids["assistant"]) - 1
            ids = self.renderer.tokenizer.encode(self.scripts[self._key(p)][turn])
            tokens.append((ids + [stop_ids[0]] if self.stop else ids)[:max_new_tokens])
        logprobs = [[-0.25] * len(t) for t in tokens]
        return Samples(tokens, logprobs, [self.stop and t[-1] in stop_ids for t in tokens])


def same_tokens(a, b):
    return (a.ids, a.owners, a.turns) == (b.ids, b.owners, b.turns)


def test_one_episode_renders_identically_through_both_paths():
    r = Renderer(TOK)
    task = TASKS[0]
    scripted = scripted_rollout(bugfix_policy("oracle"), BugFixEnv(), task, r)
    sampler = ReplaySampler(r, {task.issue: scripted.info["actions"]})
    sampled = rollout_batch(Decoder(sampler), [BugFixEnv()], [task], r, None)[0]
    assert scripted.info["actions"] == ["read", "edit swap_minmax", "submit"]
    assert same_tokens(scripted, sampled)
    assert scripted.reward == sampled.reward == 1.0
    assert (sampled.info, sampled.unterminated) == (scripted.info, scripted.unterminated)
    # sampled POLICY tokens carry the sampler's logprobs; everything else 0
    assert scripted.logprobs is None
    for lp, owner in zip(sampled.logprobs, sampled.owners, strict=True):
        assert lp == (-0.25 if owner == Owner.POLICY else 0.0)


def test_lockstep_batch_matches_scripted_episodes_and_samples_once_per_turn():
    r = Renderer(TOK)
    policies = [bugfix_policy("oracle"), bugfix_policy("blind", seed=1), bugfix_policy("random", seed=2)]
    tasks = TASKS[::4]  # one task per family
    scripted = [scripted_rollout(p, BugFixEnv(), t, r) for p in policies for t in tasks]
    # one batch per policy, so every prompt's first user message identifies its episode
    for k in range(len(policies)):
        batch = scripted[k * len(tasks) : (k + 1) * len(tasks)]
        sampler = ReplaySampler(r, {t.issue: tr.info["actions"] for t, tr in zip(tasks, batch, strict=True)})
        sampled = rollout_batch(Decoder(sampler), [BugFixEnv() for _ in tasks], tasks, r, None)
        for a, b in zip(batch, sampled, strict=True):
            assert same_tokens(a, b) and a.reward == b.reward and a.info == b.info
            assert a.unterminated == b.unterminated
        n_turns = [len(tr.info["actions"]) for tr in batch]
        # one sampler call per turn, on exactly the episodes still running
        assert sampler.calls == [sum(n > t for n in n_turns) for t in range(max(n_turns))]


def test_rollouts_with_a_tiny_transformer_are_seeded_and_score_consistently():
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(vocab_size=TOK.vocab_size, dim=32, n_layers=2, n_heads=4, max_len=256)).eval()
    policy = functools.partial(sample, model, pad_id=TOK.pad_id)
    r = Renderer(TOK)
    tasks = TASKS[:3] * 2

    def run(seed):
        return rollout_batch(Decoder(policy, SamplerSettings(max_new_tokens=6)), [BugFixEnv() for _ in tasks], tasks, r,
                             torch.Generator().manual_seed(seed),
                             max_turns=3, max_tokens=200)

    a, b, c = run(0), run(0), run(1)
    assert all(same_tokens(x, y) and x.logprobs == y.logprobs for x, y in zip(a, b, strict=True))
    assert any(not same_tokens(x, y) for x, y in zip(a, c, strict=True))
    assert [t.group for t in a] == [0, 1, 2, 0, 1, 2]
    for t in a:
        assert t.info["n_turns"] == 3 and t.info["stop_reason"] in ("max_turns", "done")
        assert t.info["n_invalid"] >= 1  # an untrained model does not speak the action language
        assert len(t.tokens_of(Owner.POLICY)) <= 3 * 6
    # the rendered tokens are what was sampled: teacher-forced log-probs equal the sampler's
    batch = collate(a, TOK.pad_id)
    with torch.no_grad():
        logp = sequence_log_probs(model, batch.ids, batch.attention_mask)  # [B, T-1]
    mask = batch.action_mask.bool()
    torch.testing.assert_close(logp[mask], batch.old_logprobs[mask], atol=1e-4, rtol=1e-4)


def test_unterminated_actions_are_counted_and_given_to_the_env():
    r = Renderer(TOK)
    task = TASKS[0]
    sampler = ReplaySampler(r, {task.issue: ["read read read"] * 2}, stop=False)
    traj = rollout_batch(Decoder(sampler, SamplerSettings(max_new_tokens=2)), [BugFixEnv()], [task], r, None,
                         max_turns=2)[0]
    assert traj.unterminated == 2 and traj.info["n_invalid"] == 2
    assert traj.info["actions"] == ["read read", "read read"]
    assert r.end_id not in traj.tokens_of(Owner.POLICY)  # no stop token was sampled, none is invented


def test_episodes_end_on_turn_limit_and_token_budget():
    r = Renderer(TOK)
    task = TASKS[0]
    script = {task.issue: ["read"] * 10}
    traj = rollout_batch(Decoder(ReplaySampler(r, script)), [BugFixEnv()], [task], r, None, max_turns=4)[0]
    assert traj.info["stop_reason"] == "max_turns" and traj.info["n_turns"] == 4 and traj.n_turns == 4
    # budget: a turn is sampled only if history + header + max_action_tokens fits
    budget = 80
    traj = rollout_batch(Decoder(ReplaySampler(r, script), SamplerSettings(max_new_tokens=4)), [BugFixEnv()], [task], r,
                         None, max_turns=10,
                         max_tokens=budget)[0]
    assert traj.info["stop_reason"] == "token_budget"
    last_policy = max(i for i, o in enumerate(traj.owners) if o == Owner.POLICY)
    assert last_policy < budget
    scripted = scripted_rollout(bugfix_policy("random", seed=3), BugFixEnv(), task, r, max_turns=10,
                                max_tokens=budget, max_action_tokens=4)
    assert scripted.info["stop_reason"] in ("token_budget", "done")


def test_single_turn_task_is_the_one_step_case():
    tok = arithmetic_tokenizer()
    r = Renderer(tok)
    tasks = arithmetic_tasks("heldout")[:4]
    scripted = [scripted_rollout(ArithmeticOracle(), arithmetic_env(), t, r) for t in tasks]
    sampler = ReplaySampler(r, {t.prompt: [t.answer] for t in tasks})
    sampled = rollout_batch(Decoder(sampler, SamplerSettings(max_new_tokens=4)), [arithmetic_env() for _ in tasks],
                            tasks, r, None)
    for a, b, t in zip(scripted, sampled, tasks, strict=True):
        assert same_tokens(a, b) and a.reward == b.reward == 1.0
        assert b.info["stop_reason"] == "done" and b.info["n_turns"] == 1 and b.n_turns == 1
        assert tok.decode(b.tokens_of(Owner.POLICY)) == t.answer + "<|end|>"
    assert sampler.calls == [4]


def test_env_protocol_and_groups():
    assert isinstance(BugFixEnv(), Env) and isinstance(arithmetic_env(), Env)
    assert task_groups(["a", "b", "a", "c", "b"]) == [0, 1, 0, 2, 1]
    assert task_groups([{"x": 1}, {"x": 1}, {"x": 2}]) == [0, 0, 1]  # unhashable tasks work too
    with pytest.raises(ValueError, match="envs"):
        rollout_batch(Decoder(None), [BugFixEnv()], TASKS[:2], Renderer(TOK), None)
    env = SingleTurnEnv(lambda task, reply: (1.0, {}))
    with pytest.raises(RuntimeError):
        env.step("too early")


def test_an_episode_source_runs_every_task_n_times_with_one_group_per_task_instance():
    r = Renderer(TOK)
    tasks = [TASKS[0], TASKS[4], TASKS[0]]  # the same task twice: two groups
    sampler = ReplaySampler(r, {t.issue: ["read", "submit"] for t in tasks})
    collect = EpisodeSource(Decoder(sampler), BugFixEnv, r, max_turns=3)
    trajs = collect.run(tasks, 2, None)
    assert [t.info["task"] for t in trajs] == ["minmax/clamp"] * 2 + ["range/sum_to"] * 2 + ["minmax/clamp"] * 2
    assert [t.group for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert sampler.calls == [6, 6]
    assert all(t.info["actions"] == ["read", "submit"] for t in trajs)


class CountingSampler:
    """A fake model for one episode: turn k replays `actions[k]` (encoded by `encode`), then the stop token."""

    def __init__(self, encode, actions):
        self.encode, self.actions, self.turn = encode, actions, 0

    def __call__(self, prompts, max_new_tokens, generator, *, stop_ids=(), **kw):
        assert len(prompts) == 1
        tokens = (self.encode(self.actions[self.turn]) + [stop_ids[0]])[:max_new_tokens]
        self.turn += 1
        return Samples([tokens], [[-0.5] * len(tokens)], [tokens[-1] in stop_ids])


@pytest.mark.parametrize("kind", ["toy", "chat"])
def test_finished_trajectories_carry_no_renderer_bookkeeping(kind):
    """The renderer's per-episode state (messages so far, the stopped flag) lives in its Transcript:
    a finished trajectory's info is the episode's info only, on both paths and with both renderers."""
    if kind == "chat":
        pytest.importorskip("transformers")
        from trajtune.models.hf_random import train_tokenizer
        from trajtune.text.chat import ChatRenderer

        hf_tok = train_tokenizer()
        r, encode, max_tokens = ChatRenderer(hf_tok), lambda s: hf_tok(s, add_special_tokens=False)["input_ids"], 4000
    else:
        r, encode, max_tokens = Renderer(TOK), TOK.encode, 512
    task = TASKS[0]
    scripted = scripted_rollout(bugfix_policy("oracle"), BugFixEnv(), task, r, max_tokens=max_tokens)
    sampler = CountingSampler(encode, scripted.info["actions"])
    sampled = rollout_batch(Decoder(sampler, SamplerSettings(max_new_tokens=32)), [BugFixEnv()], [task], r, None,
                            max_tokens=max_tokens)[0]
    assert scripted.info["actions"] == ["read", "edit swap_minmax", "submit"]
    assert same_tokens(scripted, sampled)
    assert (sampled.info, sampled.unterminated) == (scripted.info, scripted.unterminated)
    for traj in (scripted, sampled):
        assert not {"messages", "_stopped"} & set(traj.info)
        assert {"task", "stop_reason", "n_turns"} <= set(traj.info) and traj.unterminated is not None
    collect = EpisodeSource(Decoder(CountingSampler(encode, scripted.info["actions"]),
                                    SamplerSettings(max_new_tokens=32)), BugFixEnv, r, max_tokens=max_tokens)
    (collected,) = collect.run([task], 1, None)
    assert same_tokens(collected, sampled) and collected.info == sampled.info
    assert collected.unterminated == sampled.unterminated
