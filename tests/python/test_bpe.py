"""tools/bpe.py: pre-tokenisation rules, merge training, encoding and the file format. (The C++
encoder is checked against this one in tests/model/text_test.cc on fixtures.)"""
import json

import pytest

import bpe


def test_pre_tokenize_rules():
    assert bpe.pre_tokenize(b"Hello world") == [b"Hello", b" world"]
    assert bpe.pre_tokenize(b"a  b") == [b"a", b" ", b" b"]
    assert bpe.pre_tokenize(b"a\n\nb") == [b"a", b"\n\n", b"b"]
    assert bpe.pre_tokenize(b"in 1811, \"no\"") == [b"in", b" 1811", b",", b" \"", b"no", b"\""]
    assert bpe.pre_tokenize("caf\u00e9s".encode()) == ["caf\u00e9s".encode()]
    assert bpe.pre_tokenize(b" abcdefghij", max_piece_bytes=4) == [b" abc", b"defg", b"hij"]
    assert bpe.pre_tokenize(b"") == []


@pytest.mark.parametrize("data", [b"", b" ", b"\x00\xff\xfe", "na\u00efve \u2014 \U0001F600".encode(),
                                  b"x" * 200, b"  \t\n  a  b\r\n"])
def test_round_trip(data):
    tok = bpe.train([b"the cat sat on the mat with the other cat " * 20], vocab_size=300)
    assert tok.decode(tok.encode(data)) == data


def test_training_merges_the_most_frequent_pairs_first():
    tok = bpe.train([b"aaab aaab aaab cd"], vocab_size=260)
    # pieces: "aaab", " aaab" x2, " cd". (a, a) occurs 6 times; then (256, a) and (a, b) tie at 3
    # and the smaller pair wins; then (256, 257) at 3.
    a, b = ord("a"), ord("b")
    assert tok.merges == [(a, a), (a, b), (256, 257)]
    assert tok.vocab_size == 260 and tok.eot_id == 259
    assert tok.encode(b"aaab") == [258] and tok.encode(b" aaab") == [32, 258]


def test_encoding_applies_merges_by_rank():
    tok = bpe.Tokenizer([(116, 104), (256, 101), (32, 257), (101, 101)])  # th, the, " the", ee
    assert tok.encode(b"the") == [257]
    assert tok.encode(b" the") == [258]
    assert tok.encode(b"thee") == [257, 101]
    assert tok.encode(b"eee") == [259, 101]
    assert tok.token_bytes(258) == b" the" and tok.token_bytes(tok.eot_id) == b""


def test_training_is_deterministic_and_encoding_matches_training(tmp_path):
    text = b"It is a truth universally acknowledged, that a single man in possession of a good fortune " * 5
    a = bpe.train([text], vocab_size=320)
    b = bpe.train([text], vocab_size=320)
    assert a.merges == b.merges
    path = tmp_path / "tokenizer.json"
    a.save(str(path))
    doc = json.loads(path.read_text())
    assert doc["format"] == "tost-bpe-v1" and doc["special_tokens"] == {"<|endoftext|>": a.eot_id}
    c = bpe.Tokenizer.load(str(path))
    assert c.encode(text) == a.encode(text)
    assert len(a.encode(text)) < len(text) / 3  # the training text compresses well


def test_load_rejects_other_formats(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"format": "gpt2", "max_piece_bytes": 32, "merges": []}))
    with pytest.raises(ValueError, match="format must be"):
        bpe.Tokenizer.load(str(p))
