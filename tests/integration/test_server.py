"""End-to-end: the real tost_server on the shipped models/, called by Python grpcio and tost_cli."""
import json
import os
import re
import subprocess
import sys

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import SOURCE_DIR, RunningServer, _binary
from tost_harness import collect_generate

sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import bpe  # noqa: E402  (tools/bpe.py: the Python side of the server's tokenizer)

LM = "tost-austen"


def _lm_tokenizer():
    return bpe.Tokenizer.load(os.path.join(SOURCE_DIR, "models", LM, "tokenizer.json"))


def _digits_config():
    with open(os.path.join(SOURCE_DIR, "models", "tost-digits", "config.json")) as f:
        return json.load(f)


def _image_request(pb2, batch=1, seed=0):
    v = _digits_config()["vision"]
    x = np.random.default_rng(seed).standard_normal((batch, v["in_chans"], v["image_height"], v["image_width"]))
    x = x.astype(np.float32)
    return pb2.ClassifyRequest(model="tost-digits", tensor=pb2.FloatTensor(shape=list(x.shape), raw=x.tobytes()),
                               top_k=3), x


def test_list_models(stub, proto_modules):
    pb2, _ = proto_modules
    models = {m.name: m for m in stub.ListModels(pb2.ListModelsRequest()).models}
    assert models["tost-digits"].ready and models["tost-digits"].architecture == "tost_vision"
    assert models["tost-austen"].ready and models["tost-austen"].architecture == "tost_lm"
    for m in models.values():  # --device=auto: the CPU here (fp32), cuda:0 where there is a GPU
        assert m.device in ("cpu", "cuda:0") and (m.device != "cpu" or m.dtype == "fp32"), m
    assert list(models["tost-digits"].input_shape) == [1, 32, 32]
    tok = _lm_tokenizer()
    assert models[LM].tokenizer == "bpe"
    assert models[LM].vocab_size == tok.vocab_size and models[LM].eos_token_id == tok.eot_id


def test_health_check(channel):
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service="tost.v1.Tost")).status == \
        health_pb2.HealthCheckResponse.SERVING


def test_classify_batch_matches_single_images(stub, proto_modules):
    pb2, _ = proto_modules
    req, x = _image_request(pb2, batch=3)
    batch = stub.Classify(req)
    assert len(batch.results) == 3
    for i in range(3):
        single = stub.Classify(pb2.ClassifyRequest(model="tost-digits", top_k=3, tensor=pb2.FloatTensor(
            shape=list(x.shape[1:]), data=x[i].reshape(-1).tolist())))
        # Same labels; probabilities equal up to float rounding (the BLAS may block a batch of 3
        # differently from a batch of 1).
        assert [l.index for l in single.results[0].labels] == [l.index for l in batch.results[i].labels]
        assert np.allclose([l.probability for l in single.results[0].labels],
                           [l.probability for l in batch.results[i].labels], atol=1e-5)
        probs = [l.probability for l in batch.results[i].labels]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001


def test_generate_streams_token_by_token(stub, proto_modules):
    pb2, _ = proto_modules
    prompt = b"Hello, said Emma."
    prompt_ids = _lm_tokenizer().encode(prompt)  # the server must tokenize as tools/bpe.py does
    req = pb2.GenerateRequest(model=LM, prompt_bytes=prompt, max_new_tokens=24,
                              sampling=pb2.SamplingParams(temperature=0.8, seed=5))
    got = collect_generate(stub.Generate(req))
    tokens, final = got.tokens, got.final
    assert final is not None
    n = len(prompt_ids)
    assert final.prompt_tokens == n
    assert final.generated_tokens == len(tokens)
    assert [t.position for t in tokens] == list(range(n, n + len(tokens)))
    tok = _lm_tokenizer()
    assert all(t.bytes == tok.token_bytes(t.id) for t in tokens)
    if final.finish_reason == pb2.FINISH_REASON_LENGTH:
        assert len(tokens) == 24
    # text is released in complete characters only, and the concatenation is valid UTF-8
    text = got.text  # the tokens' texts, then final.text
    assert text.encode("utf-8").decode("utf-8") == text
    # the same seed gives the same tokens
    again = collect_generate(stub.Generate(req)).ids
    assert again == [t.id for t in tokens]


def test_generate_reports_each_sampled_tokens_own_logprob(stub, proto_modules):
    """logprobs=True alone gives every token its own logprob; with top_logprobs it is the listed
    value when the token is among the alternatives, and at most the last of them when it is not."""
    pb2, _ = proto_modules

    def tokens(**fields):
        req = pb2.GenerateRequest(model=LM, prompt_bytes=b"It was a truth", max_new_tokens=24,
                                  sampling=pb2.SamplingParams(temperature=1.5, seed=3), **fields)
        return collect_generate(stub.Generate(req)).tokens

    own = tokens(logprobs=True, top_logprobs=0)
    assert own and all(t.HasField("logprob") and not t.top_logprobs for t in own)
    assert all(np.isfinite(t.logprob) and t.logprob <= 0 for t in own)
    listed = tokens(top_logprobs=5)
    assert [t.id for t in listed] == [t.id for t in own]  # the same seed draws the same tokens
    # At temperature 1.5 this seed draws tokens on both sides of the top 5 (19 of 24 outside).
    outside = sum(t.id not in {alt.id for alt in t.top_logprobs} for t in listed)
    assert 0 < outside < len(listed)
    for t, alone in zip(listed, own):
        assert t.HasField("logprob") and len(t.top_logprobs) == 5
        assert t.logprob == pytest.approx(alone.logprob, abs=1e-5)
        alternatives = {alt.id: alt.logprob for alt in t.top_logprobs}
        if t.id in alternatives:
            assert t.logprob == alternatives[t.id]
        else:
            assert t.logprob <= t.top_logprobs[-1].logprob
    assert not any(t.HasField("logprob") for t in tokens())


def test_generate_cancel_mid_stream(stub, proto_modules):
    pb2, _ = proto_modules
    call = stub.Generate(pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"abc", max_new_tokens=1000,
                                             sampling=pb2.SamplingParams(temperature=1.0, seed=1)))
    first = next(call)
    assert first.HasField("token")
    call.cancel()
    with pytest.raises(grpc.RpcError) as e:
        for _ in call:
            pass
    assert e.value.code() == grpc.StatusCode.CANCELLED


@pytest.mark.parametrize("mutate,code,fragment", [
    (lambda r: setattr(r, "model", "nope"), grpc.StatusCode.NOT_FOUND, "not served"),
    (lambda r: r.tensor.shape.__setitem__(1, 31), grpc.StatusCode.INVALID_ARGUMENT, "expected images of shape"),
    (lambda r: setattr(r.tensor, "raw", b"\0" * 12), grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
    (lambda r: setattr(r, "top_k", -1), grpc.StatusCode.INVALID_ARGUMENT, "top_k"),
    (lambda r: setattr(r, "model", "tost-austen"), grpc.StatusCode.INVALID_ARGUMENT, "needs a tost_vision model"),
])
def test_classify_errors(stub, proto_modules, mutate, code, fragment):
    pb2, _ = proto_modules
    req, _ = _image_request(pb2)
    mutate(req)
    with pytest.raises(grpc.RpcError) as e:
        stub.Classify(req)
    assert e.value.code() == code
    assert fragment in e.value.details()


@pytest.mark.parametrize("kwargs,code,fragment", [
    (dict(model="nope", prompt_bytes=b"a"), grpc.StatusCode.NOT_FOUND, "not served"),
    (dict(model="tost-austen"), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty"),
    (dict(model="tost-austen", prompt_tokens={"ids": [97] * 1025}), grpc.StatusCode.OUT_OF_RANGE,
     "context length of 1024"),
    (dict(model="tost-austen", prompt_bytes=b"a", max_new_tokens=-2), grpc.StatusCode.INVALID_ARGUMENT, "max_new_tokens"),
    (dict(model="tost-austen", prompt_tokens={"ids": [65, 5000]}), grpc.StatusCode.INVALID_ARGUMENT, "token id 5000"),
    (dict(model="tost-digits", prompt_bytes=b"a"), grpc.StatusCode.INVALID_ARGUMENT, "needs a tost_lm model"),
])
def test_generate_errors(stub, proto_modules, kwargs, code, fragment):
    pb2, _ = proto_modules
    if "prompt_tokens" in kwargs:
        kwargs["prompt_tokens"] = pb2.TokenIds(**kwargs["prompt_tokens"])
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Generate(pb2.GenerateRequest(**kwargs)))
    assert e.value.code() == code
    assert fragment in e.value.details()


def test_generation_stops_at_the_context_length(stub, proto_modules):
    pb2, _ = proto_modules
    msgs = list(stub.Generate(pb2.GenerateRequest(model="tost-austen", prompt_tokens=pb2.TokenIds(ids=[97] * 1020),
                                                  max_new_tokens=50,
                                                  sampling=pb2.SamplingParams(temperature=0))))
    final = msgs[-1].final
    assert final.finish_reason in (pb2.FINISH_REASON_CONTEXT, pb2.FINISH_REASON_EOS)
    if final.finish_reason == pb2.FINISH_REASON_CONTEXT:
        assert final.generated_tokens == 5  # positions 1020..1024: the last token is produced, not fed


def test_cli_classify_and_generate(server, tmp_path):
    cli = _binary("TOST_CLI_BIN")
    v = _digits_config()["vision"]
    img = np.random.default_rng(1).standard_normal((v["in_chans"], v["image_height"], v["image_width"]))
    np.save(tmp_path / "img.npy", img.astype(np.float32))
    out = subprocess.run([cli, "classify", f"--server={server.address}", "--model=tost-digits",
                          f"--input={tmp_path / 'img.npy'}", "--top_k=2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("image 0:") and out.stdout.count("(class ") == 2
    out = subprocess.run([cli, "generate", f"--server={server.address}", "--model=tost-austen", "--prompt=Hi",
                          "--max_new_tokens=8", "--temperature=0"], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(b"Hi")
    assert b"[finish: FINISH_REASON_" in out.stderr
    out = subprocess.run([cli, "classify", f"--server={server.address}", "--model=missing"],
                         capture_output=True, text=True, timeout=60)
    # An unknown model: exit status 4, one line naming the served ones (test_cli_usage.py has more).
    assert out.returncode == 4 and f'model "missing" is not served by {server.address}' in out.stderr, out.stderr


def test_broken_model_is_reported_while_others_serve(tmp_path, proto_modules):
    pb2, pb2_grpc = proto_modules
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(os.path.join(SOURCE_DIR, "models", "tost-digits"), repo / "tost-digits")
    broken = repo / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"name": "broken", "architecture": "tost_lm"}))
    s = RunningServer(str(repo))
    try:
        with grpc.insecure_channel(s.address) as ch:
            stub = pb2_grpc.TostStub(ch)
            models = {m.name: m for m in stub.ListModels(pb2.ListModelsRequest(), timeout=30).models}
            assert models["tost-digits"].ready
            assert not models["broken"].ready and "\"lm\" object" in models["broken"].error
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(pb2.GenerateRequest(model="broken", prompt_bytes=b"x"), timeout=30))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            req, _ = _image_request(pb2)
            assert len(stub.Classify(req, timeout=30).results) == 1
    finally:
        assert s.stop() == 0


def test_membership_maps_and_cli_heatmaps(stub, proto_modules, server, tmp_path):
    pb2, _ = proto_modules
    req, x = _image_request(pb2, batch=2)
    req.return_membership = True
    resp = stub.Classify(req)
    v = _digits_config()["vision"]
    plain = stub.Classify(_image_request(pb2, batch=2)[0])
    for with_maps, without in zip(resp.results, plain.results):
        # Same classification whether or not the maps are asked for (they bypass the batcher).
        assert [l.index for l in with_maps.labels] == [l.index for l in without.labels]
        assert len(with_maps.membership) == v["depth"]
        for layer, m in enumerate(with_maps.membership):
            assert m.layer == layer and m.heads == v["num_heads"] and m.grid_height * m.grid_width == 64
            pi = np.array(m.values).reshape(m.heads, -1)
            assert np.allclose(pi.sum(axis=0), 1.0, atol=1e-5), "Π is a distribution over heads per token"
            assert (pi >= 0).all()
    np.save(tmp_path / "img.npy", x[0])
    out = subprocess.run([_binary("TOST_CLI_BIN"), "classify", f"--server={server.address}", "--model=tost-digits",
                          f"--input={tmp_path / 'img.npy'}", f"--membership_png={tmp_path / 'pi'}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pngs = sorted(p.name for p in tmp_path.glob("pi_image0_layer*.png"))
    assert len(pngs) == v["depth"]
    assert (tmp_path / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_membership_requests_take_a_queue_place(proto_modules, tmp_path):
    """Membership requests run outside the batcher but hold a place of --max_queue_size while they
    run: a burst of them on a one-place queue is refused with RESOURCE_EXHAUSTED, not run at once."""
    pb2, pb2_grpc = proto_modules
    s = RunningServer(os.path.join(SOURCE_DIR, "models"), ("--max_queue_size=1",))
    try:
        with grpc.insecure_channel(s.address) as ch:
            grpc.channel_ready_future(ch).result(timeout=30)
            stub = pb2_grpc.TostStub(ch)
            req, _ = _image_request(pb2, batch=8)
            req.return_membership = True
            futures = [stub.Classify.future(req, timeout=60) for _ in range(32)]
            codes = []
            for f in futures:
                try:
                    f.result()
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    codes.append(e.code())
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
            assert grpc.StatusCode.OK in codes and grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
    finally:
        assert s.stop() == 0


def test_payload_and_element_limits_are_enforced_before_work(proto_modules):
    pb2, pb2_grpc = proto_modules
    s = RunningServer(os.path.join(SOURCE_DIR, "models"),
                      ["--max_message_bytes=65536", "--max_tensor_elements=1000", "--max_prompt_bytes=16",
                       "--max_new_tokens=8"])
    try:
        with grpc.insecure_channel(s.address) as ch:
            stub = pb2_grpc.TostStub(ch)
            big = pb2.ClassifyRequest(model="tost-digits", tensor=pb2.FloatTensor(shape=[1, 1, 32, 32],
                                                                                  raw=b"\0" * 100_000))
            with pytest.raises(grpc.RpcError) as e:
                stub.Classify(big, timeout=30)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # over --max_message_bytes
            req, _ = _image_request(pb2)
            with pytest.raises(grpc.RpcError) as e:
                stub.Classify(req, timeout=30)  # 1024 elements > 1000
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit of 1000" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"x" * 17), timeout=30))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit of 16" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"x", max_new_tokens=9),
                                   timeout=30))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_new_tokens" in e.value.details()
    finally:
        assert s.stop() == 0


def _austen_words():
    """Every word of the shipped LM's corpus (its provenance names the package)."""
    import common_training  # tools/, on the path above; imports torch, so only when needed
    texts, _ = common_training.load_austen()
    return {w.lower() for t in texts.values() for w in re.findall(r"[A-Za-z]+", t)}


def test_cli_generate_continues_english_with_english_words(server):
    """tost_cli generate continues an English prompt with English words.
    Sampled as a user would (temperature 0.7, top-k 40; three prompts, two seeds each): at least
    85% of the words written must be words of Austen's English (measured: 93% over 5 prompts x 4
    seeds; greedy decoding gives 100% but loops), and each continuation must write 20 or more."""
    cli = _binary("TOST_CLI_BIN")
    known = _austen_words()
    total, english = 0, 0
    for prompt in ("The weather was so fine that", "Mr. Darcy had never", "She could not help"):
        for seed in (1, 2):
            out = subprocess.run([cli, "generate", f"--server={server.address}", f"--model={LM}", f"--prompt={prompt}",
                                  "--max_new_tokens=60", "--temperature=0.7", "--top_k=40", f"--seed={seed}"],
                                 capture_output=True, timeout=120)
            assert out.returncode == 0, out.stderr
            text = out.stdout.decode("utf-8", errors="replace")
            assert text.startswith(prompt)
            words = [w.lower() for w in re.findall(r"[A-Za-z]+", text[len(prompt):])]
            hits = sum(w in known for w in words)
            print(f"{prompt!r} (seed {seed}) -> {text[len(prompt):]!r}: {hits}/{len(words)} words are Austen's")
            assert len(words) >= 20, text
            total += len(words)
            english += hits
    assert english >= 0.85 * total, f"{english}/{total} generated words are English"
