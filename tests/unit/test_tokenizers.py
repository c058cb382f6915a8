import pytest

from trajtune.text.tokenizers import ASSISTANT, CharTokenizer, Tokenizer, UnknownSymbolError, WordTokenizer

CORPUS = ["def f(n):\n    return n + 1\n", "Q: 23+45\nA: 68"]


@pytest.mark.parametrize("cls", [CharTokenizer, WordTokenizer])
def test_round_trip_and_specials(cls, tmp_path):
    tok = cls.from_corpus(CORPUS)
    for text in CORPUS:
        ids = tok.encode(text)
        assert tok.encode(tok.decode(ids)) == ids
        assert all(i >= len(tok.specials) for i in ids)  # text never produces special tokens
    assert len({tok.pad_id, tok.bos_id, tok.eos_id, tok.special_id(ASSISTANT)}) == 4
    tok.save(tmp_path / "tok.json")
    again = Tokenizer.load(tmp_path / "tok.json")
    assert type(again) is cls and again.itos == tok.itos
    assert cls.from_corpus(CORPUS).itos == tok.itos  # deterministic vocabulary


def test_char_round_trip_is_exact():
    tok = CharTokenizer.from_corpus(CORPUS)
    assert tok.decode(tok.encode(CORPUS[0])) == CORPUS[0]


def test_word_tokenizer_splits_code():
    tok = WordTokenizer.from_corpus(CORPUS)
    assert [tok.itos[i] for i in tok.encode("return n + 1")] == ["return", "n", "+", "1"]
    assert tok.decode(tok.encode("def f(n):")) == "def f ( n ):"


def test_unknown_symbol_is_named():
    with pytest.raises(UnknownSymbolError, match=r"'é' \(U\+00E9\)"):
        CharTokenizer.from_corpus(CORPUS).encode("deé")
    with pytest.raises(UnknownSymbolError, match="'while'"):
        WordTokenizer.from_corpus(CORPUS).encode("while n")
    with pytest.raises(UnknownSymbolError, match="outside the vocabulary"):
        CharTokenizer.from_corpus(CORPUS).decode([10_000])
    with pytest.raises(KeyError, match="not a special token"):
        CharTokenizer.from_corpus(CORPUS).special_id("<|nope|>")
