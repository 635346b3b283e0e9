"""Language models trained with the official ToST code, end to end: a checkpoint in the official
layout is converted by tools/convert_official.py, loaded by the real tost_server and answers
Generate through tost_cli. GPT-2-sized vocabularies speak text through the gpt2 tokenizer (the
GPT-2-format fixture files of tests/model/fixtures/gpt2 stand in for OpenAI's, which cannot be
fetched here); a 256-entry vocabulary has no text tokenizer and takes token ids."""
import json
import os
import subprocess
import sys

import grpc
import pytest
import torch

from conftest import SOURCE_DIR, RunningServer
from tost_harness import collect_generate

sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import convert_official  # noqa: E402

FIXTURES = os.path.join(SOURCE_DIR, "tests", "model", "fixtures", "gpt2")
GPT2_PADDED_VOCAB = 50304  # the official models' GPT-2 vocabulary, padded from 50257


def convert(tmp, name, vocab_size, tokenizer_files=()):
    ckpt = os.path.join(tmp, f"{name}.pt")
    torch.save(convert_official.official_lm_checkpoint(n_layer=1, n_head=2, n_embd=32, block_size=64,
                                                       vocab_size=vocab_size, bias=False, seed=3), ckpt)
    cmd = [sys.executable, os.path.join(SOURCE_DIR, "tools", "convert_official.py"), "convert", ckpt,
           "--out", os.path.join(tmp, "repo"), "--name", name]
    if tokenizer_files:
        cmd += ["--tokenizer-files", *tokenizer_files]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    with open(os.path.join(tmp, "repo", name, "config.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def official_repo(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("official"))
    configs = {
        "gpt2-files": convert(tmp, "gpt2-files", GPT2_PADDED_VOCAB,
                              [os.path.join(FIXTURES, "encoder.json"), os.path.join(FIXTURES, "vocab.bpe")]),
        "gpt2-ranks": convert(tmp, "gpt2-ranks", GPT2_PADDED_VOCAB, [os.path.join(FIXTURES, "gpt2.tiktoken")]),
        "ids-only": convert(tmp, "ids-only", 256),
    }
    srv = RunningServer(os.path.join(tmp, "repo"))
    yield srv, configs
    assert srv.stop() == 0


def cli(srv, *args):
    return subprocess.run([os.environ["TOST_CLI_BIN"], "generate", f"--server={srv.address}", *args],
                          capture_output=True, text=True, timeout=120)


def test_converted_configs_name_the_tokenizer_the_vocabulary_allows(official_repo):
    _, configs = official_repo
    meta = json.load(open(os.path.join(FIXTURES, "cases.json")))["meta"]
    assert configs["gpt2-files"]["tokenizer"]["type"] == "gpt2"
    assert configs["gpt2-files"]["tokenizer"]["eos_token_id"] == meta["eot_id"]
    assert configs["gpt2-ranks"]["tokenizer"]["type"] == "gpt2"
    assert configs["ids-only"]["tokenizer"]["type"] == "none"


@pytest.mark.parametrize("name", ["gpt2-files", "gpt2-ranks"])
def test_gpt2_sized_official_lm_answers_a_text_generate_through_tost_cli(official_repo, name):
    srv, _ = official_repo
    done = cli(srv, f"--model={name}", "--prompt=It was the best of times", "--max_new_tokens=12",
               "--temperature=1.0", "--seed=5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("It was the best of times")
    assert "generated 12" in done.stderr or "FINISH_REASON_EOS" in done.stderr, done.stderr


def test_gpt2_prompt_tokens_equal_tiktoken_and_sampled_ids_stay_inside_the_tokenizer(official_repo,
                                                                                     proto_modules):
    srv, _ = official_repo
    pb2, pb2_grpc = proto_modules
    cases = json.load(open(os.path.join(FIXTURES, "cases.json")))
    defined = cases["meta"]["vocab_size"]
    text = "Don't stop: 1,000 ships sailed!"
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        got = collect_generate(stub.Generate(pb2.GenerateRequest(
            model="gpt2-files", prompt_bytes=text.encode(), max_new_tokens=40, top_logprobs=5,
            sampling=pb2.SamplingParams(temperature=1.5, seed=11))))
        ids, final = got.ids, got.final
        # The padded ids (737 .. 50303 here) mean nothing: never sampled, never offered.
        for token in got.tokens:
            assert all(alt.id < defined for alt in token.top_logprobs)
    import tiktoken  # noqa: E402 (a test dependency, pinned in requirements.txt)
    from tiktoken.load import load_tiktoken_bpe  # noqa: E402
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken caches local files by path; read this one
    enc = tiktoken.Encoding(name="fixture", pat_str=cases["meta"]["pattern"],
                            mergeable_ranks=load_tiktoken_bpe(os.path.join(FIXTURES, "gpt2.tiktoken")),
                            special_tokens={"<|endoftext|>": cases["meta"]["eot_id"]})
    assert final.prompt_tokens == len(enc.encode_ordinary(text))
    assert ids and all(i < defined for i in ids)


def test_official_lm_with_256_ids_answers_token_ids_and_refuses_text(official_repo, proto_modules):
    srv, _ = official_repo
    done = cli(srv, "--model=ids-only", "--prompt_tokens=1,2,3,250", "--max_new_tokens=6")
    assert done.returncode == 0, done.stderr
    out = done.stdout.split()
    assert out[:4] == ["1", "2", "3", "250"] and len(out) == 10
    assert all(0 <= int(t) < 256 for t in out)
    pb2, pb2_grpc = proto_modules
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(pb2.GenerateRequest(model="ids-only", prompt_bytes=b"hello")))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "prompt_tokens" in e.value.details()
        models = {m.name: m for m in stub.ListModels(pb2.ListModelsRequest()).models}
        assert models["ids-only"].ready and models["ids-only"].tokenizer == "none"
        assert models["gpt2-files"].ready and models["gpt2-files"].tokenizer == "gpt2"


@pytest.mark.parametrize("name", ["gpt2-files", "gpt2-ranks"])
def test_gpt2_bpe_models_generate_under_json_schemas_and_ids_only_models_refuse(official_repo, proto_modules,
                                                                                  name):
    """Constraints compile against a converted checkpoint's GPT-2 BPE vocabulary (multi-byte
    tokens, padded ids past the tokenizer's): sampled outputs of two schemas, random weights, parse
    strictly and validate, and never use a padded id. A model without a text tokenizer refuses
    constraints with FAILED_PRECONDITION naming it."""
    srv, _ = official_repo
    pb2, pb2_grpc = proto_modules
    defined = json.load(open(os.path.join(FIXTURES, "cases.json")))["meta"]["vocab_size"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from constrained_schemas import SCHEMAS, check_output  # noqa: E402
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        complete = 0
        for schema_name in ("bounds", "array_of_enums"):
            schema = SCHEMAS[schema_name]
            for seed in range(6):
                got = collect_generate(stub.Generate(pb2.GenerateRequest(
                    model=name, prompt_bytes=b"Answer:", max_new_tokens=60,
                    sampling=pb2.SamplingParams(temperature=1.0, seed=seed),
                    constraint=pb2.Constraint(json_schema=json.dumps(schema))), timeout=120))
                text, final, ids = got.output_bytes, got.final, got.ids
                assert all(i < defined for i in ids), ids
                if final.finish_reason == pb2.FINISH_REASON_EOS:
                    check_output(schema, text.decode())
                    complete += 1
                else:
                    assert final.finish_reason == pb2.FINISH_REASON_LENGTH, final
                    assert text.startswith(b"{"), text
        assert complete >= 6, f"only {complete} of 12 constrained outputs completed"
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(pb2.GenerateRequest(model="ids-only", prompt_tokens=pb2.TokenIds(ids=[1, 2]),
                                                   constraint=pb2.Constraint(regex="[a-z]+"))))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ids-only" in e.value.details() and "constrained generation" in e.value.details()
