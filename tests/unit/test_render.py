"""The renderer: token-exact format, owners, turns, the no-wrapper option, both tokenizers."""

import inspect

import pytest

from trajtune.text.chat import ChatRenderer
from trajtune.text.render import Renderer, RendererProtocol, Transcript, format_owners, owner_counts
from trajtune.text.tokenizers import CharTokenizer, WordTokenizer
from trajtune.trajectory import Owner

T, P, A, X = Owner.TEMPLATE, Owner.PROMPT, Owner.POLICY, Owner.TOOL
EPISODE = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "fix f"},
    {"role": "assistant", "content": "read"},
    {"role": "tool", "content": "def f"},
    {"role": "assistant", "content": "submit"},
    {"role": "tool", "content": "ok"},
]


@pytest.fixture
def tok():
    return WordTokenizer.from_corpus(["be brief fix f read def submit ok"])


def names(tok, traj):
    return [tok.itos[i] for i in traj.ids]


def test_render_is_token_exact(tok):
    traj = Renderer(tok).render(EPISODE)
    assert names(tok, traj) == [
        "<bos>", "<|system|>", "be", "brief", "<|end|>", "<|user|>", "fix", "f", "<|end|>",
        "<|assistant|>", "read", "<|end|>", "<|tool|>", "def", "f", "<|end|>",
        "<|assistant|>", "submit", "<|end|>", "<|tool|>", "ok", "<|end|>",
    ]
    assert traj.owners == [T, T, P, P, T, T, P, P, T, T, A, A, T, X, X, T, T, A, A, T, X, T]
    # turn k = assistant message k and the observation it caused; the prompt is turn 0
    assert traj.turns == [0] * 16 + [1] * 6
    assert traj.n_turns == 2


def test_only_the_assistant_end_token_is_policy(tok):
    r = Renderer(tok)
    traj = r.render(EPISODE)
    ends = [o for i, o in zip(traj.ids, traj.owners, strict=True) if i == r.end_id]
    assert ends == [T, T, A, T, A, T]
    assert r.stop_ids == (tok.special_id("<|end|>"),)
    assert traj.tokens_of(Owner.POLICY) == tok.encode("read") + [r.end_id] + tok.encode("submit") + [r.end_id]


def test_generation_prompt_is_history_plus_assistant_header(tok):
    r = Renderer(tok)
    prompt = r.generation_prompt(EPISODE[:4])
    assert prompt == r.render(EPISODE[:4]).ids + [tok.special_id("<|assistant|>")]
    assert r.generation_prompt(EPISODE[:2])[-1] == tok.special_id("<|assistant|>")


def test_incremental_building_matches_render(tok):
    r = Renderer(tok)
    transcript = r.start(EPISODE[:2])
    traj = transcript.traj
    sampled = tok.encode("read") + [r.end_id]
    assert r.prompt_ids(transcript) == r.generation_prompt(EPISODE[:2])
    r.append_sampled(transcript, sampled, [-0.5] * len(sampled), turn=0)
    r.append_message(transcript, EPISODE[3], turn=0)
    r.append_sampled(transcript, tok.encode("submit") + [r.end_id], [-0.1, -0.2], turn=1)
    r.append_message(transcript, EPISODE[5], turn=1)
    full = r.render(EPISODE)
    assert (traj.ids, traj.owners, traj.turns) == (full.ids, full.owners, full.turns)
    assert traj.logprobs[traj.owners.index(A)] == -0.5 and traj.logprobs[0] == 0.0
    assert r.action_text(sampled) == "read"


def test_no_wrappers_keeps_bos_and_policy_end(tok):
    r = Renderer(tok, wrappers=False)
    traj = r.render(EPISODE)
    assert names(tok, traj) == ["<bos>", "be", "brief", "fix", "f", "read", "<|end|>", "def", "f", "submit", "<|end|>",
                                "ok"]
    assert traj.owners == [T, P, P, P, P, A, A, X, X, A, A, X]
    # exactly the wrapped rendering with the TEMPLATE tokens (but <bos>) removed
    wrapped = Renderer(tok).render(EPISODE)
    keep = [i for i, o in enumerate(wrapped.owners) if o != T or i == 0]
    assert traj.ids == [wrapped.ids[i] for i in keep]
    assert r.generation_prompt(EPISODE[:2]) == traj.ids[:5]  # no assistant header to prompt with


def test_char_tokenizer_and_single_turn():
    tok = CharTokenizer.from_corpus("Q: 0123456789+A\n")
    traj = Renderer(tok).render([{"role": "user", "content": "Q: 23+45\nA: "}, {"role": "assistant", "content": "68"}])
    assert tok.decode(traj.tokens_of(Owner.PROMPT)) == "Q: 23+45\nA: "
    assert tok.decode(traj.tokens_of(Owner.POLICY)) == "68<|end|>"
    assert set(traj.turns) == {0}


def test_action_text_keeps_special_tokens_visible(tok):
    r = Renderer(tok)
    ids = tok.encode("read") + [tok.special_id("<|user|>")]  # no stop token: ran out of budget
    assert r.action_text(ids) == "read <|user|>"


def test_bad_roles_raise(tok):
    r = Renderer(tok)
    with pytest.raises(ValueError, match="role"):
        r.render([{"role": "narrator", "content": "f"}])
    with pytest.raises(ValueError, match="role"):
        r.append_message(r.start(), {"role": "assistant", "content": "read"}, 0)


def test_format_owners_and_counts(tok):
    traj = Renderer(tok).render(EPISODE)
    shown = format_owners(traj, tok).split("\n")
    assert shown[0] == "t0 template | <bos> <|system|>"
    assert "t1 policy   | submit <|end|>" in shown
    counts = owner_counts([traj])
    assert counts == {"template": 10, "prompt": 4, "policy": 4, "tool": 3}  # 11 TEMPLATE, but <bos> is never predicted
    assert sum(owner_counts([traj], predicted_only=False).values()) == len(traj)


@pytest.mark.parametrize("cls", [Renderer, ChatRenderer])
def test_both_renderers_implement_the_protocol(cls):
    """Every member of RendererProtocol exists on both renderers, with the same parameters."""
    members = [n for n in vars(RendererProtocol) if not n.startswith("_")]
    assert {"start", "prompt_ids", "append_sampled", "append_message", "action_text", "stop_ids"} <= set(members)
    for name in members:
        want, have = getattr(RendererProtocol, name), getattr(cls, name)
        if isinstance(want, property):
            assert isinstance(have, property), name
        else:
            assert list(inspect.signature(have).parameters) == list(inspect.signature(want).parameters), name


def test_a_transcript_holds_the_episode_state_not_the_trajectory(tok):
    r = Renderer(tok)
    transcript = r.start(EPISODE[:2])
    assert isinstance(transcript, Transcript) and transcript.messages == EPISODE[:2] and not transcript.stopped
    r.append_sampled(transcript, tok.encode("read") + [r.end_id], [-0.5, -0.5], turn=0)
    assert transcript.stopped and transcript.messages[-1] == {"role": "assistant", "content": "read"}
    r.append_message(transcript, EPISODE[3], turn=0)
    assert transcript.messages == EPISODE[:4] and r.prompt_ids(transcript) == r.generation_prompt(EPISODE[:4])
    assert transcript.traj.info == {}
