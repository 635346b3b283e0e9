"""tests/model/fixtures/gpt2: the GPT-2-format tokenizer fixtures tools/gpt2_fixtures.py writes.

The committed files must be reproducible from the script, must load with each reference the way
the real GPT-2 files do (tiktoken's rank file and its GPT-2 loader, Hugging Face's BPE.from_file),
and both references must give every committed case its expected ids and decode it back."""

import json
import os

import pytest
import tiktoken
import tiktoken.load
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import gpt2_fixtures

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model",
                                         "fixtures", "gpt2"))
FILES = ("encoder.json", "vocab.bpe", "gpt2.tiktoken", "cases.json")


@pytest.fixture(autouse=True)
def no_tiktoken_cache(monkeypatch):
    # tiktoken caches every file it loads, local paths included, under $TMPDIR/data-gym-cache keyed
    # by the path alone, and serves the cached copy after the file changes. "" turns the cache off.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")


def path(name):
    return os.path.join(FIXTURES, name)


def load_cases():
    with open(path("cases.json"), encoding="utf-8") as f:
        return json.load(f)


CASES = load_cases()["cases"]


def test_committed_fixtures_are_reproducible(tmp_path):
    gpt2_fixtures.build(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(FILES)
    for name in FILES:
        with open(path(name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), f"{name}: rerun tools/gpt2_fixtures.py --out {FIXTURES}"


def test_encoder_ids_are_the_tiktoken_ranks():
    ranks = tiktoken.load.load_tiktoken_bpe(path("gpt2.tiktoken"))
    with open(path("encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    meta = load_cases()["meta"]
    assert encoder.pop(meta["eot_token"]) == meta["eot_id"] == len(ranks) == meta["vocab_size"] - 1
    assert encoder == {gpt2_fixtures.to_unicode(tok): rank for tok, rank in ranks.items()}
    assert sorted(ranks.values()) == list(range(len(ranks)))
    assert len(ranks) == 256 + meta["num_merges"]
    # The single bytes carry GPT-2's ids: printable ranges first, then the rest.
    assert ranks[b"!"] == 0 and ranks[b"\t"] == 197 and ranks[b"\n"] == 198 and ranks[b" "] == 220
    assert ranks[b"\xff"] == 187 and ranks[b"\x00"] == 188 and ranks[b"\xad"] == 255


def test_tiktoken_reads_encoder_and_merges_as_gpt2s():
    # The loader tiktoken uses for the real GPT-2 files: it derives the single-byte order itself and
    # checks encoder.json against vocab.bpe, so it vouches for the format of both.
    gym = tiktoken.load.data_gym_to_mergeable_bpe_ranks(path("vocab.bpe"), path("encoder.json"))
    assert gym == tiktoken.load.load_tiktoken_bpe(path("gpt2.tiktoken"))


@pytest.fixture(scope="module")
def references():
    meta = load_cases()["meta"]
    assert meta["pattern"] == gpt2_fixtures.GPT2_PATTERN
    enc = tiktoken.Encoding(name="gpt2-fixture", pat_str=meta["pattern"],
                            mergeable_ranks=tiktoken.load.load_tiktoken_bpe(path("gpt2.tiktoken")),
                            special_tokens={meta["eot_token"]: meta["eot_id"]})
    hf = Tokenizer(models.BPE.from_file(path("encoder.json"), path("vocab.bpe")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return enc, hf


def test_cases_cover_enough():
    assert len(CASES) >= 40
    assert {"", "<|endoftext|>"} <= {c["text"] for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_both_references_give_the_committed_ids(case, references):
    enc, hf = references
    text, ids = case["text"], case["ids"]
    assert enc.encode_ordinary(text) == ids
    assert hf.encode(text, add_special_tokens=False).ids == ids
    assert [text[a:b] for _, (a, b) in hf.pre_tokenizer.pre_tokenize_str(text)] == case["pieces"]
    assert "".join(case["pieces"]) == text
    assert enc.decode_bytes(ids) == text.encode("utf-8")
    assert hf.decode(ids) == text


def test_endoftext_is_special_only_when_allowed(references):
    enc, _ = references
    meta = load_cases()["meta"]
    assert enc.encode(meta["eot_token"], allowed_special="all") == [meta["eot_id"]]
    assert meta["eot_id"] not in enc.encode_ordinary(meta["eot_token"])
