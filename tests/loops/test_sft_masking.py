"""Multi-turn SFT masking (RLHF book ch.4.4): every assistant turn, the final one only, or one sample per turn
(unrolled), token-exact on a 3-turn conversation with both renderers, and through `trajtune sft`'s data path."""

import pytest

from trajtune.algorithms.sft import SFTConfig
from trajtune.text.render import Renderer, select_turns
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner

CONV = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"}, {"role": "assistant", "content": "f"}]
T, P, POL = int(Owner.TEMPLATE), int(Owner.PROMPT), int(Owner.POLICY)


@pytest.fixture(scope="module")
def toy():
    return Renderer(CharTokenizer("abcdef"))


def _owned(traj, tok):
    """(owner, text) per token, the text by name."""
    return [(o, tok.decode([i])) for i, o in zip(traj.ids, traj.owners, strict=True)]


def test_all_keeps_every_assistant_turn(toy):
    traj = toy.render(CONV)
    assert select_turns([traj], "all") == [traj]
    policy = [t for t, o in _owned(traj, toy.tokenizer) if t == POL]
    assert len(policy) == 6  # b <|end|>, d <|end|>, f <|end|>


def test_last_and_unroll_token_exact(toy):
    tok = toy.tokenizer
    full = toy.render(CONV)
    assert [tok.decode([i]) for i in full.ids[:5]] == ["<bos>", "<|user|>", "a", "<|end|>", "<|assistant|>"]
    owners_head = [T, T, P, T, T]
    # last: b and d (with their <|end|>) become PROMPT, only f <|end|> is trained
    (last,) = select_turns([full], "last")
    assert last.ids == full.ids and last.turns == full.turns
    assert last.owners == owners_head + [P, P, T, P, T, T, P, P, T, P, T, T, POL, POL]
    # unroll: three samples, each cut after its turn's <|end|>, earlier turns PROMPT
    samples = select_turns([full], "unroll")
    assert [len(s) for s in samples] == [7, 13, 19]
    assert samples[0].owners == owners_head + [POL, POL]
    assert samples[1].owners == owners_head + [P, P, T, P, T, T, POL, POL]
    assert samples[2].owners == last.owners
    assert [s.ids for s in samples] == [full.ids[:7], full.ids[:13], full.ids]
    # the unrolled sample k is exactly conversation[: k + 1] with turn k trained
    for k, s in enumerate(samples):
        assert s.ids == toy.render(CONV[: 2 * k + 2]).ids
        assert [tok.decode([i]) for i, o in zip(s.ids, s.owners, strict=True) if o == POL] == ["bdf"[k], "<|end|>"]
    # idempotent: a selection of a selection is itself
    assert select_turns(samples[1:2], "unroll") == samples[1:2] and select_turns([last], "last") == [last]


def test_bad_mode_is_refused(toy):
    with pytest.raises(ValueError, match="'all', 'last' or 'unroll'"):
        select_turns([toy.render(CONV)], "first")
    with pytest.raises(ValueError, match="train_on"):
        SFTConfig(train_on="first")


def test_chat_template_rows_and_train_sft(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import train_tokenizer
    from trajtune.sources.data import Row, sft_trajectories
    from trajtune.text.chat import ChatRenderer

    tok = train_tokenizer()
    r = ChatRenderer(tok)
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"},
            {"role": "user", "content": "and 4+4?"}, {"role": "assistant", "content": "8"}]
    rows = [Row({"messages": conv}, "chats.jsonl:1")]

    def trained(traj):
        return tok.decode([i for i, o in zip(traj.ids, traj.owners, strict=True) if o == POL])

    (every,) = sft_trajectories(rows, r)
    assert trained(every) == "4<|im_end|>6<|im_end|>8<|im_end|>"
    (last,) = sft_trajectories(rows, r, "last")
    assert last.ids == every.ids == r.template_ids(conv)
    assert trained(last) == "8<|im_end|>"
    prompt = tok.decode([i for i, o in zip(last.ids, last.owners, strict=True) if o == P])
    assert "4<|im_end|>" in prompt and "6<|im_end|>" in prompt  # earlier answers are context now
    unrolled = sft_trajectories(rows, r, "unroll")
    assert [trained(s) for s in unrolled] == ["4<|im_end|>", "6<|im_end|>", "8<|im_end|>"]
    for k, s in enumerate(unrolled):  # sample k: the template's rendering of the first k + 1 exchanges, to the stop
        ids = r.template_ids(conv[: 2 * k + 2])
        assert s.ids == ids[: len(s.ids)] and tok.decode(ids[len(s.ids):]).strip() == ""
