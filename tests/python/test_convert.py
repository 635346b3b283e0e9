"""Tests of tools/convert_official.py on randomly initialised checkpoints in the official layouts.

The expected outputs never go through the converter: the official state_dict is loaded straight
into the reference model (whose keys are the official ones), and the converted directory must
reproduce it exactly. The C++ side of the same check is tests/model/converted_parity_test.cc.
"""

import argparse
import base64
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

import convert_official as CO
import tost_reference as R

F64 = torch.float64


def small_vision_checkpoint(model_name="tost_cab_custom_p4", seed=3, D=32, depth=2, K=4, patch=4):
    sd = CO.official_vision_state_dict(D, depth, K, patch, in_chans=3, num_classes=7, seed=seed)
    ema = {k: (v + 0.25 if v.is_floating_point() and not k.endswith("running_var") else v.clone())
           for k, v in sd.items()}
    return {"model": sd, "model_ema": ema, "optimizer": {"state": {}}, "lr_scheduler": {}, "epoch": 3,
            "scaler": {}, "args": argparse.Namespace(model=model_name, input_size=24, nb_classes=7)}


def direct_vision(sd, image):
    cfg = R.VisionConfig(embed_dim=sd["cls_token"].shape[-1], depth=2, num_heads=4, patch_size=4, in_chans=3,
                         num_classes=7, image_height=image, image_width=image)
    m = R.TostVision(cfg)
    m.load_state_dict(sd, strict=True)  # the official keys ARE the reference's keys
    return m.to(F64).eval()


def test_vision_checkpoint_converts_with_batchnorm_kept(tmp_path):
    ckpt = small_vision_checkpoint()
    path = tmp_path / "checkpoint.pth"
    torch.save(ckpt, path)
    assert CO.main(["convert", str(path), "--out", str(tmp_path / "repo"), "--name", "v"]) == 0
    d = tmp_path / "repo" / "v"
    config = json.loads((d / "config.json").read_text())
    assert config["vision"] == {"embed_dim": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 4, "patch_size": 4,
                                "in_chans": 3, "num_classes": 7, "cls_attn_layers": 2,
                                "image_height": 24, "image_width": 24}
    assert config["preprocess"] == {"mean": CO.IMAGENET_MEAN, "std": CO.IMAGENET_STD}
    prov = config["provenance"]
    assert prov["kind"] == "converted" and prov["state_dict"] == "model" and prov["epoch"] == 3
    assert "not a registered" in prov["warning"]
    # BatchNorm is kept as it is (the server folds it at load), num_batches_tracked included.
    tensors = load_file(d / "model.safetensors")
    assert set(tensors) == set(ckpt["model"])
    for k, v in ckpt["model"].items():
        assert torch.equal(tensors[k], v), k
    model, _ = R.load_model(d, F64)
    x = torch.randn(2, 3, 24, 24, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), direct_vision(ckpt["model"], 24)(x), rtol=0, atol=0)


def test_vision_ema_labels_and_image_size(tmp_path):
    ckpt = small_vision_checkpoint()
    path = tmp_path / "c.pth"
    torch.save(ckpt, path)
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"class {i}\n" for i in range(7)))
    assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "e", "--ema", "--image-size", "32",
                    "--labels", str(labels), "--mean", "0.5", "0.5", "0.5", "--std", "0.25", "0.25", "0.25"]) == 0
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    assert config["provenance"]["state_dict"] == "model_ema"
    assert config["vision"]["image_height"] == 32 and config["labels"][6] == "class 6"
    assert config["preprocess"] == {"mean": [0.5] * 3, "std": [0.25] * 3}
    tensors = load_file(tmp_path / "e" / "model.safetensors")
    assert torch.equal(tensors["head.weight"], ckpt["model_ema"]["head.weight"])
    assert not torch.equal(tensors["head.weight"], ckpt["model"]["head.weight"])


def test_vision_registered_name_must_match_the_tensors(tmp_path, capsys):
    path = tmp_path / "c.pth"
    torch.save(small_vision_checkpoint(model_name="tost_cab_small_12_p16"), path)
    assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "x"]) == 2
    err = capsys.readouterr().err
    assert "tost_cab_small_12_p16" in err and "(384, 12, 8, 16)" in err and "(32, 2, 4, 4)" in err
    assert not (tmp_path / "x").exists()


def test_official_registry_sizes_match_reference_doc():
    # docs/model-semantics.md §1.3: tiny_12 has 5.769M parameters, small_12 22.590M (1000 classes, p16).
    for name, want in (("tost_cab_tiny_12_p16", 5_769_000), ("tost_cab_small_12_p16", 22_590_000)):
        D, depth, K = CO.OFFICIAL_VISION[name[:-4]]
        sd = CO.official_vision_state_dict(D, depth, K, 16, 3, 1000, seed=0)
        n = sum(v.numel() for k, v in sd.items() if not k.endswith("num_batches_tracked")
                and not k.endswith("running_mean") and not k.endswith("running_var"))
        assert abs(n - want) < 1000, (name, n)


def test_lm_checkpoint_strips_compile_prefix_and_tied_head(tmp_path):
    ckpt = CO.official_lm_checkpoint(n_layer=2, n_head=4, n_embd=32, block_size=48, vocab_size=257, bias=False, seed=5)
    assert all(k.startswith("_orig_mod.") for k in ckpt["model"])
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "lm"]) == 0
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert config["lm"] == {"n_layer": 2, "n_head": 4, "n_embd": 32, "context_length": 48, "vocab_size": 257,
                            "bias": False, "mlp_ratio": 4}
    assert config["tokenizer"] == {"type": "byte", "eos_token_id": 256}
    assert config["provenance"]["iter_num"] == 2000
    assert config["provenance"]["best_val_loss"] == pytest.approx(3.21)
    tensors = load_file(tmp_path / "lm" / "model.safetensors")
    assert "lm_head.weight" not in tensors and not any(k.startswith("_orig_mod.") for k in tensors)
    stripped = {k[len("_orig_mod."):]: v for k, v in ckpt["model"].items()}
    direct = R.TostLM(R.LMConfig(n_layer=2, n_head=4, n_embd=32, context_length=48, vocab_size=257))
    direct.load_state_dict(stripped, strict=True)
    model, _ = R.load_model(tmp_path / "lm", F64)
    tok = torch.randint(0, 257, (2, 48))
    with torch.no_grad():
        torch.testing.assert_close(model(tok), direct.to(F64)(tok), rtol=0, atol=0)


def test_dtypes_are_written_as_serving_dtypes_and_checked(tmp_path, capsys):
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=257, bias=False, seed=2)
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "lm", "--dtypes", "fp32, bfloat16"]) == 0
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert config["serving"] == {"dtypes": ["fp32", "bf16"]}
    # Without --dtypes nothing is listed (any precision).
    assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "plain"]) == 0
    assert "serving" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    for bad, message in [("fp32,fp8", "expected fp32, bf16, fp16 or int8, got 'fp8'"),
                         ("fp16,float16", "'fp16' is listed twice"), (",", "expected a comma-separated list")]:
        assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "bad", "--dtypes", bad]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()


def test_lm_with_bias_and_gpt2_vocabulary():
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=50304, bias=True, seed=1)
    model, config, sd = CO.convert(ckpt, name="bpe")
    assert config["lm"]["bias"] is True and config["lm"]["vocab_size"] == 50304
    assert config["tokenizer"] == {"type": "none", "eos_token_id": 50256}  # no tokenizer files given
    assert "transformer.h.0.attn.c_attn.bias" in sd and "transformer.ln_f.bias" in sd


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["model"].__setitem__("_orig_mod.lm_head.weight", c["model"]["_orig_mod.lm_head.weight"] + 1),
     "lm_head.weight differs"),
    (lambda c: c["model_args"].__setitem__("TSSA", False), "not ToST"),
    (lambda c: c["model"].__setitem__("_orig_mod.transformer.h.0.attn.extra", torch.zeros(2)),
     "unexpected transformer.h.0.attn.extra"),
    (lambda c: c["model"].pop("_orig_mod.transformer.h.0.attn.denom_bias"), "missing transformer.h.0.attn.denom_bias"),
    (lambda c: c["model"].__setitem__("_orig_mod.transformer.h.0.attn.temp", torch.ones(3, 1)),
     "transformer.h.0.attn.temp: shape (3, 1), expected (4, 1)"),
])
def test_lm_layout_errors_name_the_problem(mutate, message):
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=4, n_embd=16, block_size=8, vocab_size=257, bias=False, seed=2)
    ckpt["model"]["_orig_mod.lm_head.weight"] = ckpt["model"]["_orig_mod.transformer.wte.weight"].clone()
    mutate(ckpt)
    with pytest.raises(CO.ConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CO.convert(ckpt, name="bad")


class NotAllowed:
    """Pickled by reference: weights_only unpickling must refuse it."""


def test_pickled_code_is_refused_without_unsafe_pickle(tmp_path, capsys):
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=4, n_embd=16, block_size=8, vocab_size=257, bias=False, seed=2)
    ckpt["config"] = NotAllowed()
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "lm"]) == 2
    assert "--unsafe-pickle" in capsys.readouterr().err
    assert not (tmp_path / "lm").exists()
    assert CO.main(["convert", str(path), "--out", str(tmp_path), "--name", "lm", "--unsafe-pickle"]) == 0


def test_bare_state_dict_and_unknown_layout():
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=4, n_embd=16, block_size=8, vocab_size=300, bias=False, seed=4)
    _, config, _ = CO.convert(ckpt["model"], name="bare")
    assert config["lm"]["context_length"] == 8 and config["lm"]["vocab_size"] == 300
    assert config["provenance"]["state_dict"] == "top level"
    with pytest.raises(CO.ConversionError, match="neither a tost_vision"):
        CO.convert({"model": {"foo.weight": torch.zeros(1)}}, name="x")
    with pytest.raises(CO.ConversionError, match="no 'model_ema'"):
        CO.convert(ckpt, name="x", ema=True)


def test_fixture_negative_controls_are_far(tmp_path, monkeypatch):
    # The fixture writer on a reduced case list (the full list runs in ctest: converted_fixtures).
    monkeypatch.setattr(CO, "FIXTURE_CASES", {
        "v": dict(kind="vision", model="tost_cab_tiny_12_p8", input_size=24, num_classes=10, seed=1, batch=1),
        "l": dict(kind="lm", n_layer=1, n_head=4, n_embd=16, block_size=16, vocab_size=257, bias=False,
                  seed=2, batch=1, seq_len=9),
    })
    entries = CO.write_fixtures(str(tmp_path))
    assert [e["case"] for e in entries] == ["v", "l"]
    for e in entries:
        assert e["negative_control_rel_diff"] > 0.01
        fx = load_file(tmp_path / e["case"] / "fixture.safetensors")
        model, config = R.load_model(tmp_path / e["case"], F64)
        with torch.no_grad():
            out = model(fx["input"].double()) if e["kind"] == "vision" else model(fx["tokens"])
        torch.testing.assert_close(out.float(), fx["logits"], rtol=1e-5, atol=1e-5)
    assert json.loads((tmp_path / "v" / "config.json").read_text())["vision"]["patch_size"] == 8
    assert os.path.exists(tmp_path / "manifest.json")


# ---------------------------------------------------------------------------------------------
# LM tokenizers: one config per vocabulary size class, GPT-2's files, and the server's rules
# ---------------------------------------------------------------------------------------------

COMMITTED_GPT2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "fixtures", "gpt2")
ENCODER_FORM = ("encoder.json", "vocab.bpe")
RANKS_FORM = ("gpt2.tiktoken",)


def gpt2_byte_symbols():
    """GPT-2's bytes_to_unicode: byte -> the printable character encoder.json and vocab.bpe use."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):  # the other bytes (controls, space, ...) take the characters from U+0100 on
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tiny_gpt2(d, merges=(("Ġ", "t"), ("h", "e"), ("Ġt", "he"))):
    """A small tokenizer in GPT-2's formats: the 256 byte symbols, ``merges``, then <|endoftext|>
    (260 ids); encoder.json + vocab.bpe and the equivalent gpt2.tiktoken (259 ranks)."""
    sym = gpt2_byte_symbols()
    back = {c: b for b, c in sym.items()}
    tokens = [sym[b] for b in range(256)] + [left + right for left, right in merges]
    os.makedirs(d, exist_ok=True)
    encoder = {t: i for i, t in enumerate(tokens)}
    encoder["<|endoftext|>"] = len(tokens)
    with open(os.path.join(d, "encoder.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(os.path.join(d, "vocab.bpe"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges))
    with open(os.path.join(d, "gpt2.tiktoken"), "w", encoding="ascii") as f:
        for rank, t in enumerate(tokens):
            f.write(base64.b64encode(bytes(back[c] for c in t)).decode() + f" {rank}\n")
    return str(d)


def test_tiny_gpt2_files_are_gpt2s_byte_mapping():
    sym = gpt2_byte_symbols()
    assert len(set(sym.values())) == 256
    assert sym[ord(" ")] == "Ġ" and sym[ord("\n")] == "Ċ" and sym[ord("A")] == "A"
    assert CO.gpt2_byte_symbols() == sym


def test_tiny_gpt2_files_load_in_tiktoken(tmp_path):
    # The tiny files are GPT-2's formats: tiktoken reads the ranks, and encodes with the merges.
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe
    ranks = load_tiktoken_bpe(os.path.join(write_tiny_gpt2(tmp_path), "gpt2.tiktoken"))
    gpt2_pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("tiny", pat_str=gpt2_pattern, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    assert enc.encode(" the<|endoftext|>", allowed_special="all") == [258, 259]
    assert enc.encode("\x00 he") == [0, ord(" "), 257]  # single bytes rank as their value


# Where GPT-2 format files come from: written by the test, and the committed fixtures when present.
TOKENIZER_SOURCES = [
    pytest.param("tiny", id="tiny"),
    pytest.param("committed", id="committed", marks=pytest.mark.skipif(
        not all(os.path.exists(os.path.join(COMMITTED_GPT2, f)) for f in ENCODER_FORM + RANKS_FORM),
        reason="tests/model/fixtures/gpt2 not committed yet")),
]


def gpt2_source(which, tmp_path):
    return write_tiny_gpt2(tmp_path / "tok") if which == "tiny" else COMMITTED_GPT2


def expected_ids(d, form):
    """(ids, end-of-text id) of a GPT-2 format tokenizer, read independently of the converter."""
    if form == ENCODER_FORM:
        with open(os.path.join(d, "encoder.json"), encoding="utf-8") as f:
            enc = json.load(f)
        return len(enc), enc["<|endoftext|>"]
    with open(os.path.join(d, "gpt2.tiktoken"), encoding="ascii") as f:
        ranks = sum(1 for line in f if line.strip())
    return ranks + 1, ranks


def lm_checkpoint_file(tmp_path, vocab_size, name="ckpt.pt"):
    # n_embd 8 keeps a GPT-2 sized embedding at 0.4M parameters.
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=vocab_size,
                                     bias=False, seed=vocab_size)
    path = tmp_path / name
    torch.save(ckpt, path)
    return str(path)


@pytest.mark.parametrize("vocab_size, tokenizer, note", [
    (100, {"type": "none", "eos_token_id": -1}, "token-id prompts (prompt_tokens) only"),
    (256, {"type": "none", "eos_token_id": -1}, "token-id prompts (prompt_tokens) only"),
    (257, {"type": "byte", "eos_token_id": 256}, None),
    (260, {"type": "byte", "eos_token_id": 256}, None),
    (50256, {"type": "byte", "eos_token_id": 256}, None),
    (50257, {"type": "none", "eos_token_id": 50256}, "--tokenizer-files encoder.json vocab.bpe"),
    (50304, {"type": "none", "eos_token_id": 50256}, "--tokenizer-files encoder.json vocab.bpe"),
])
def test_lm_vocabulary_classes_without_tokenizer_files(tmp_path, capsys, vocab_size, tokenizer, note):
    ckpt = lm_checkpoint_file(tmp_path, vocab_size)
    assert CO.main(["convert", ckpt, "--out", str(tmp_path / "repo"), "--name", "lm"]) == 0
    d = tmp_path / "repo" / "lm"
    config = json.loads((d / "config.json").read_text())
    assert config["lm"]["vocab_size"] == vocab_size
    assert config["tokenizer"] == tokenizer
    assert sorted(os.listdir(d)) == ["config.json", "model.safetensors"]
    err = capsys.readouterr().err
    assert (note in err) if note else "note:" not in err
    CO.check_written_tokenizer(str(d))
    model, _ = R.load_model(d, F64)
    assert model.cfg.vocab_size == vocab_size


@pytest.mark.parametrize("which", TOKENIZER_SOURCES)
@pytest.mark.parametrize("form", [ENCODER_FORM, RANKS_FORM], ids=["encoder+merges", "tiktoken"])
@pytest.mark.parametrize("vocab", ["exact", 50304])
def test_lm_gpt2_tokenizer_files_are_validated_and_copied(tmp_path, capsys, which, form, vocab):
    src = gpt2_source(which, tmp_path)
    n_ids, eos = expected_ids(src, form)
    vocab_size = n_ids if vocab == "exact" else vocab  # the model's vocabulary may be padded
    if vocab_size < n_ids:
        pytest.skip(f"the committed tokenizer has {n_ids} ids")
    ckpt = lm_checkpoint_file(tmp_path, vocab_size)
    files = [os.path.join(src, f) for f in form]
    assert CO.main(["convert", ckpt, "--out", str(tmp_path / "repo"), "--name", "lm",
                    "--tokenizer-files", *files]) == 0
    d = tmp_path / "repo" / "lm"
    config = json.loads((d / "config.json").read_text())
    if form == ENCODER_FORM:
        want = {"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe", "eos_token_id": eos}
    else:
        want = {"type": "gpt2", "ranks_file": "gpt2.tiktoken", "eos_token_id": eos}
    assert config["tokenizer"] == want
    assert config["lm"]["vocab_size"] == vocab_size
    assert sorted(os.listdir(d)) == sorted(["config.json", "model.safetensors", *form])
    for f in form:
        assert (d / f).read_bytes() == open(os.path.join(src, f), "rb").read(), f
    assert "note:" not in capsys.readouterr().err
    CO.check_written_tokenizer(str(d))


def test_line_ends_as_the_server_reads_them(tmp_path):
    # "\r\n" line ends and empty lines are accepted, as by the server's reader.
    src = write_tiny_gpt2(tmp_path)
    for name in ("vocab.bpe", "gpt2.tiktoken"):
        _edit(name, lambda t: t.replace("\n", "\r\n\n"))(src)
    assert CO.read_tokenizer_files([os.path.join(src, "encoder.json"), os.path.join(src, "vocab.bpe")]).n_ids == 260
    assert CO.read_tokenizer_files([os.path.join(src, "gpt2.tiktoken")]).n_ids == 260


def test_tiny_tokenizer_ids_and_end_of_text(tmp_path):
    src = write_tiny_gpt2(tmp_path)
    by_encoder = CO.read_tokenizer_files([os.path.join(src, "encoder.json"), os.path.join(src, "vocab.bpe")])
    by_ranks = CO.read_tokenizer_files([os.path.join(src, "gpt2.tiktoken")])
    assert (by_encoder.n_ids, by_encoder.eos_token_id) == (260, 259)
    assert (by_ranks.n_ids, by_ranks.eos_token_id) == (260, 259)  # end-of-text follows the 259 ranks


def test_tokenizer_files_recognised_by_content_and_in_any_order(tmp_path):
    src = write_tiny_gpt2(tmp_path / "tok")
    other = tmp_path / "renamed"
    other.mkdir()
    shutil.copy(os.path.join(src, "vocab.bpe"), other / "merges.txt")
    shutil.copy(os.path.join(src, "encoder.json"), other / "vocab")
    shutil.copy(os.path.join(src, "gpt2.tiktoken"), other / "ranks")
    gpt2 = CO.read_tokenizer_files([str(other / "merges.txt"), str(other / "vocab")])
    assert gpt2.sources == {"merges_file": str(other / "merges.txt"), "encoder_file": str(other / "vocab")}
    assert gpt2.config() == {"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe",
                             "eos_token_id": 259}
    assert CO.read_tokenizer_files([str(other / "ranks")]).config() == {
        "type": "gpt2", "ranks_file": "gpt2.tiktoken", "eos_token_id": 259}


def _edit(name, fn):
    """A refusal case: rewrite tokenizer file ``name`` of the tiny set with fn(text)."""
    def apply(d):
        p = os.path.join(d, name)
        with open(p, encoding="utf-8") as f:
            text = f.read()
        with open(p, "w", encoding="utf-8") as f:
            f.write(fn(text))
    return apply


def _encoder_edit(fn):
    def edit(text):
        enc = json.loads(text)
        fn(enc)
        return json.dumps(enc)
    return _edit("encoder.json", edit)


@pytest.mark.parametrize("files, edit, message", [
    (["missing.json", "vocab.bpe"], None, "missing.json: cannot read tokenizer file"),
    (["encoder.json"], None, "encoder.json and vocab.bpe, or one *.tiktoken"),
    (["vocab.bpe"], None, "encoder.json and vocab.bpe, or one *.tiktoken"),
    (["encoder.json", "vocab.bpe", "gpt2.tiktoken"], None, "encoder.json and vocab.bpe, or one *.tiktoken"),
    (["gpt2.tiktoken", "gpt2.tiktoken"], None, "two gpt2.tiktoken files"),
    (["notes.txt"], lambda d: open(os.path.join(d, "notes.txt"), "w").write("hello\n"),
     "not a GPT-2 tokenizer file"),
    (["encoder.json", "vocab.bpe"], _edit("encoder.json", lambda t: t[:-5]), "not valid JSON"),
    (["encoder.json", "vocab.bpe"], _edit("encoder.json", lambda t: "[1, 2]"), "must be a non-empty JSON object"),
    (["encoder.json", "vocab.bpe"], _encoder_edit(lambda e: e.pop("<|endoftext|>")), "no '<|endoftext|>' token"),
    (["encoder.json", "vocab.bpe"], _encoder_edit(lambda e: e.__setitem__("<|endoftext|>", 300)),
     "ids must be 0..259"),
    (["encoder.json", "vocab.bpe"], _encoder_edit(lambda e: e.__setitem__("<|endoftext|>", 0)), "share id 0"),
    (["encoder.json", "vocab.bpe"], _encoder_edit(lambda e: e.__setitem__("<|endoftext|>", "259")),
     "not an integer id"),
    (["encoder.json", "vocab.bpe"], _edit("encoder.json", lambda t: t[:-1] + ', "he": 260}'), "'he' appears twice"),
    (["encoder.json", "vocab.bpe"], _edit("vocab.bpe", lambda t: t.replace("#version: 0.2\n", "")),
     "must start with a '#version' line"),
    # Merges of another tokenizer: a part, or the result, that this encoder does not have.
    (["encoder.json", "vocab.bpe"], _edit("vocab.bpe", lambda t: t + "Ġthe re\n"), "'re' is not in the encoder"),
    (["encoder.json", "vocab.bpe"], _edit("vocab.bpe", lambda t: t + "t h\n"), "'th' is not in the encoder"),
    (["encoder.json", "vocab.bpe"], _edit("vocab.bpe", lambda t: t + "a b c\n"), "two tokens separated by one space"),
    (["encoder.json", "vocab.bpe"], _edit("vocab.bpe", lambda t: t + "<|endoftext|> a\n"),
     "'<|endoftext|>' is not in the encoder"),
    # The server encodes any text only if every byte is a token, in GPT-2's alphabet.
    (["encoder.json", "vocab.bpe"], _encoder_edit(lambda e: e.update({"ĀĀ": e.pop("Ā")})),
     "no token for the byte 0"),
    (["encoder.json", "vocab.bpe"], _encoder_edit(lambda e: e.update({"a b": e.pop("he")})),
     "'a b' is not written in GPT-2's bytes-to-unicode alphabet"),
    (["gpt2.tiktoken"], _edit("gpt2.tiktoken", lambda t: t.replace("AA== 0\n", "AAA= 0\n")),
     "no token for the byte 0"),
    (["gpt2.tiktoken"], _edit("gpt2.tiktoken", lambda t: t + "YQ== 3\n"), "rank 3 also on line 4"),
    (["gpt2.tiktoken"], _edit("gpt2.tiktoken", lambda t: t + "YWJj 300\n"), "ranks must be 0..259"),
    (["gpt2.tiktoken"], _edit("gpt2.tiktoken", lambda t: t + "YQ== 259\n"), "token b'a' also on line"),
    (["gpt2.tiktoken"], _edit("gpt2.tiktoken", lambda t: t + "Y 259\n"), "not valid base64"),
    (["gpt2.tiktoken"], _edit("gpt2.tiktoken", lambda t: t + "YWJj\n"), "expected 'base64 rank'"),
])
def test_bad_tokenizer_files_are_refused_before_writing(tmp_path, capsys, files, edit, message):
    src = write_tiny_gpt2(tmp_path / "tok")
    if edit:
        edit(src)
    ckpt = lm_checkpoint_file(tmp_path, 50304)
    assert CO.main(["convert", ckpt, "--out", str(tmp_path / "repo"), "--name", "lm",
                    "--tokenizer-files", *[os.path.join(src, f) for f in files]]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("form", [ENCODER_FORM, RANKS_FORM], ids=["encoder+merges", "tiktoken"])
def test_vocab_smaller_than_the_tokenizer_is_refused(tmp_path, capsys, form):
    src = write_tiny_gpt2(tmp_path / "tok")  # 260 ids
    ckpt = lm_checkpoint_file(tmp_path, 259)
    assert CO.main(["convert", ckpt, "--out", str(tmp_path / "repo"), "--name", "lm",
                    "--tokenizer-files", *[os.path.join(src, f) for f in form]]) == 2
    assert "vocab_size 259 is smaller than the tokenizer's 260 ids" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


def test_tokenizer_files_refused_for_vision(tmp_path, capsys):
    src = write_tiny_gpt2(tmp_path / "tok")
    path = tmp_path / "checkpoint.pth"
    torch.save(small_vision_checkpoint(), path)
    assert CO.main(["convert", str(path), "--out", str(tmp_path / "repo"), "--name", "v",
                    "--tokenizer-files", os.path.join(src, "gpt2.tiktoken")]) == 2
    assert "--tokenizer-files is for language-model checkpoints" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


TINY = CO.Gpt2Tokenizer({"encoder_file": "e", "merges_file": "m"}, n_ids=260, eos_token_id=259)
TINY_RANKS = CO.Gpt2Tokenizer({"ranks_file": "r"}, n_ids=260, eos_token_id=259)


@pytest.mark.parametrize("tok, vocab_size, gpt2, message", [
    ({"type": "byte", "eos_token_id": 256}, 257, None, None),
    ({"type": "byte", "eos_token_id": 299}, 300, None, None),
    ({"type": "byte", "eos_token_id": 256}, 256, None, "byte needs vocab_size >= 257"),
    ({"type": "byte", "eos_token_id": 255}, 300, None, "special id in [256, 300)"),
    ({"type": "byte", "eos_token_id": 300}, 300, None, "special id in [256, 300)"),
    ({"type": "byte"}, 300, None, "eos_token_id must be an integer"),
    ({"type": "byte", "eos_token_id": True}, 300, None, "eos_token_id must be an integer"),
    ({"type": "bpe", "file": "tokenizer.json", "eos_token_id": 299}, 300, None, None),
    ({"type": "bpe", "file": "../tokenizer.json", "eos_token_id": 299}, 300, None, "file name inside"),
    ({"type": "none", "eos_token_id": -1}, 100, None, None),
    ({"type": "none", "eos_token_id": 0}, 1, None, None),
    ({"type": "none", "eos_token_id": 50256}, 50304, None, None),
    ({"type": "none", "eos_token_id": 100}, 100, None, "-1 (none) or in [0, 100)"),
    ({"type": "none", "eos_token_id": -2}, 100, None, "-1 (none) or in [0, 100)"),
    ({"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe", "eos_token_id": 259}, 260, TINY,
     None),
    ({"type": "gpt2", "ranks_file": "gpt2.tiktoken", "eos_token_id": 259}, 50304, TINY_RANKS, None),
    ({"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe", "eos_token_id": 259}, 259, TINY,
     "vocab_size must be >= the tokenizer's 260 ids"),
    ({"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe", "eos_token_id": 258}, 260, TINY,
     "end-of-text id 259"),
    ({"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe", "eos_token_id": 255}, 260,
     CO.Gpt2Tokenizer({"encoder_file": "e", "merges_file": "m"}, n_ids=260, eos_token_id=255),
     "in [256, 260) for gpt2"),
    ({"type": "gpt2", "encoder_file": "encoder.json", "eos_token_id": 259}, 260, TINY,
     "encoder_file and merges_file, or ranks_file"),
    ({"type": "gpt2", "encoder_file": "encoder.json", "merges_file": "vocab.bpe", "ranks_file": "gpt2.tiktoken",
      "eos_token_id": 259}, 260, TINY, "encoder_file and merges_file, or ranks_file"),
    ({"type": "gpt2", "encoder_file": "dir/encoder.json", "merges_file": "vocab.bpe", "eos_token_id": 259}, 260,
     TINY, "plain names"),
    ({"type": "gpt2", "ranks_file": "gpt2.tiktoken", "eos_token_id": 259}, 260, TINY, "files were not read"),
    ({"type": "gpt2", "eos_token_id": 50256}, 50304, None, "encoder_file and merges_file, or ranks_file"),
    ({"type": "tiktoken", "eos_token_id": 50256}, 50304, None, 'type must be "byte", "bpe", "gpt2" or "none"'),
    ("byte", 300, None, "must be a JSON object"),
])
def test_check_tokenizer_mirrors_the_server_rules(tok, vocab_size, gpt2, message):
    if message is None:
        CO.check_tokenizer(tok, vocab_size, gpt2)
    else:
        with pytest.raises(CO.ConversionError, match=message.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("*", r"\*")):
            CO.check_tokenizer(tok, vocab_size, gpt2)


def test_every_vocabulary_class_passes_the_check():
    for vocab_size in (1, 100, 256, 257, 260, 50256, 50257, 50304, 100000):
        CO.check_tokenizer(CO.lm_tokenizer(vocab_size), vocab_size)
    for gpt2 in (TINY, TINY_RANKS):
        for vocab_size in (260, 50304):
            CO.check_tokenizer(CO.lm_tokenizer(vocab_size, gpt2), vocab_size, gpt2)


def test_written_tokenizer_is_checked_after_writing(tmp_path):
    src = write_tiny_gpt2(tmp_path / "tok")
    gpt2 = CO.read_tokenizer_files([os.path.join(src, "encoder.json"), os.path.join(src, "vocab.bpe")])
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=300, bias=False, seed=6)
    model, config, sd = CO.convert(ckpt, name="lm", gpt2=gpt2)
    # Forgetting the files: the config would name files the directory lacks; config.json is removed
    # so that the server skips the directory instead of refusing a model.
    d = tmp_path / "lm"
    with pytest.raises(CO.ConversionError, match="cannot read tokenizer file"):
        CO.write_converted(model, config, sd, str(d))
    assert not (d / "config.json").exists()
    CO.write_converted(model, config, sd, str(d), gpt2)
    CO.check_written_tokenizer(str(d))
    (d / "vocab.bpe").write_text("#version: 0.2\nx y\n", encoding="utf-8")  # no longer this encoder's merges
    with pytest.raises(CO.ConversionError, match="'xy' is not in the encoder"):
        CO.check_written_tokenizer(str(d))
