"""WORD-KD / GKD (checklist 12.2, 12.5, 12.10): a student trained by forward KL against a frozen teacher's full
distribution on fixed text learns the teacher's distribution, not the text's tokens."""

import pytest
import torch

from trajtune.algorithms.distill import WordKDConfig, train_word_kd
from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.engine import OptimConfig, make_engine
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.objectives.distill import forward_kl_loss
from trajtune.trajectory import collate

from test_algorithms import TASKS, TOK, collect_for, demo, pass_rate


def tiny(seed, lr=1e-2, frozen=False):
    torch.manual_seed(seed)
    model = TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=1, n_heads=2, max_len=32))
    return make_engine(model, OptimConfig(lr=lr), frozen=frozen) if frozen else make_engine(model, OptimConfig(lr=lr))


@pytest.fixture(scope="module")
def teacher():
    t = tiny(0)
    train_sft(t, [demo("a")] * 8, SFTConfig(steps=15, batch_size=8), TOK.pad_id)  # the teacher answers "a"
    assert pass_rate(t) > 0.9
    return t


def test_the_first_step_is_the_forward_kl_of_the_batch(teacher):
    data = [demo("b"), demo("c")]
    student = tiny(1)
    batch = collate(data, TOK.pad_id)
    with torch.no_grad():
        want, _ = forward_kl_loss(student.forward(batch, logits=True).logits[:, :-1],
                                  teacher.forward(batch, logits=True).logits[:, :-1], batch.action_mask)
    hist = train_word_kd(student, teacher, data, WordKDConfig(steps=1, batch_size=2), TOK.pad_id)
    assert hist[0]["train/loss"] == pytest.approx(want.item(), rel=1e-5)
    assert hist[0]["distill/forward_kl"] == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(ValueError, match="no text"):
        train_word_kd(student, teacher, [], WordKDConfig(steps=1), TOK.pad_id)


def first_answer_prob(engine, letter="a"):
    """The probability the engine gives `letter` as the first token of its answer to "Q: pick"."""
    batch = collate([demo(letter)], TOK.pad_id)
    with torch.no_grad():
        logp = engine.forward(batch).logprobs  # [1, T-1]
    first = batch.action_mask[0].nonzero()[0, 0]
    return logp[0, first].exp().item()


def test_word_kd_on_static_text_learns_the_teachers_answer_not_the_texts(teacher):
    """The static text answers b..f, never a; SFT on it would not answer a. The teacher's soft labels at the
    answer position put their mass on a, so the student's first answer token becomes a. It still does not pass:
    the text never shows what follows an a (the stop token), so the student has not learned to stop there --
    exposure bias, which 12.5's teacher prefixes fix (next test)."""
    text = [demo(x) for x in "bcdef"]
    student = tiny(1)
    before = first_answer_prob(student)
    hist = train_word_kd(student, teacher, text, WordKDConfig(steps=30, batch_size=5), TOK.pad_id)
    assert hist[-1]["distill/forward_kl"] < 0.2 * hist[0]["distill/forward_kl"]
    assert before < 0.3 and first_answer_prob(student) > 0.9 and first_answer_prob(teacher) > 0.9
    assert pass_rate(student) < 0.5


def test_offline_kd_on_teacher_prefixes(teacher):
    """12.5: the text is the teacher's own samples (u ~ pi_T), drawn once; the forward KL on them falls."""
    samples = collect_for(teacher).run(TASKS, 4, torch.Generator().manual_seed(7))
    student = tiny(2)
    hist = train_word_kd(student, teacher, samples, WordKDConfig(steps=20, batch_size=8), TOK.pad_id)
    assert hist[-1]["distill/forward_kl"] < 0.2 * hist[0]["distill/forward_kl"]
    assert pass_rate(student) > 0.9  # on the teacher's own prefixes it also learns to stop after the a
