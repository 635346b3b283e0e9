"""Tests of tools/convert_official.py on randomly initialised checkpoints in the official layouts.

The expected outputs never go through the converter: the official state_dict is loaded straight
into the reference model (whose keys are the official ones), and the converted directory must
reproduce it exactly. The C++ side of the same check is tests/model/converted_parity_test.cc.
"""

import argparse
import json
import os

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


def test_lm_with_bias_and_gpt2_vocabulary():
    ckpt = CO.official_lm_checkpoint(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=50304, bias=True, seed=1)
    model, config, sd = CO.convert(ckpt, name="bpe")
    assert config["lm"]["bias"] is True and config["lm"]["vocab_size"] == 50304
    assert config["tokenizer"] == {"type": "gpt2", "eos_token_id": 50256}
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
