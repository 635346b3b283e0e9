"""Smoke and unit tests of the training tools (tools/train_vision.py, tools/train_lm.py,
tools/common_training.py): data readers, splits, metrics, and a few steps of each trainer on tiny
configurations, end to end through export, reload and samples."""

import gzip
import json
import math
import os
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
import torch

import bpe
import common_training as C
import tost_reference as R
import train_lm as TL
import train_vision as TV

HAVE_AUSTEN = os.path.exists(os.path.join(C.JANEAUSTENR_DIR, "data", "Rdata.rdx"))
needs_austen = pytest.mark.skipif(not HAVE_AUSTEN, reason=f"Debian package {C.JANEAUSTENR_PACKAGE} not installed "
                                  "(scripts/install-deps.sh installs it)")


# ---------------------------------------------------------------------------------------------
# R lazy-load reader, against a hand-written serialisation (independent of R) and against R
# ---------------------------------------------------------------------------------------------


def _i(v):
    return struct.pack(">i", v)


def _charsxp(s):
    if s is None:
        return _i(9) + _i(-1)
    b = s.encode("utf-8")
    return _i(9 | (8 << 12)) + _i(len(b)) + b  # levels: UTF8 mask, ignored by the reader


def _strsxp(items):
    return _i(16) + _i(len(items)) + b"".join(_charsxp(s) for s in items)


class _Writer:
    """R's XDR serialisation for the few types a lazy-load index uses; symbols are written once
    and then referenced (REFSXP), as R does."""

    def __init__(self):
        self.syms = []

    def sym(self, name):
        if name in self.syms:
            return _i(255 | ((self.syms.index(name) + 1) << 8))
        self.syms.append(name)
        return _i(1) + _charsxp(name)

    def named_list(self, d):
        body = b"".join(d.values())
        attrs = _i(2 | (1 << 10)) + self.sym("names") + _strsxp(list(d)) + _i(254)
        return _i(19 | (1 << 9)) + _i(len(d)) + body + attrs


def _header():
    return b"X\n" + _i(3) + _i(0x40201) + _i(0x30500) + _i(5) + b"UTF-8"


def _write_db(tmp_path, variables, compressed, kind):
    rdb = b""
    keys = {}
    for name, obj in variables.items():
        raw = _header() + obj
        if kind == "zlib":
            rec = struct.pack(">I", len(raw)) + zlib.compress(raw)
        else:
            import bz2
            import lzma
            body = {"bzip2": (b"2", bz2.compress), "xz": (b"Z", lzma.compress), "none": (b"0", bytes)}[kind]
            rec = struct.pack(">I", len(raw)) + body[0] + body[1](raw)
        keys[name] = _i(13) + _i(2) + _i(len(rdb)) + _i(len(rec))
        rdb += rec
    w = _Writer()
    index = w.named_list({"variables": w.named_list(keys), "references": _i(19) + _i(0),
                          "compressed": _i(10) + _i(1) + _i(compressed)})
    base = tmp_path / "Rdata"
    (tmp_path / "Rdata.rdb").write_bytes(rdb)
    with gzip.open(str(base) + ".rdx", "wb") as f:
        f.write(_header() + index)
    return str(base)


@pytest.mark.parametrize("kind, compressed", [("zlib", 1), ("bzip2", 2), ("xz", 3), ("none", 3)])
def test_r_lazyload_reader_on_handwritten_database(tmp_path, kind, compressed):
    lines = ["It is a truth universally acknowledged,", "", None, "caf\u00e9 \u00a3100"]
    base = _write_db(tmp_path, {"novel": _strsxp(lines), "other": _strsxp(["x"])}, compressed, kind)
    assert C.read_r_lazyload(base, ["novel"]) == {"novel": lines}
    assert C.read_r_lazyload(base) == {"novel": lines, "other": ["x"]}
    with pytest.raises(KeyError, match="no variable 'missing'"):
        C.read_r_lazyload(base, ["missing"])


def test_r_reader_refuses_code_and_truncation():
    closure = _header() + _i(3)  # CLOSXP
    with pytest.raises(C.RUnserializeError, match="SEXP type 3 is not plain data"):
        C.r_unserialize(closure)
    with pytest.raises(C.RUnserializeError, match="truncated"):
        C.r_unserialize(_header() + _strsxp(["abcdef"])[:-3])
    with pytest.raises(C.RUnserializeError, match="expected XDR"):
        C.r_unserialize(b"A\n" + _i(3))


@needs_austen
@pytest.mark.skipif(shutil.which("Rscript") is None, reason="Rscript not installed")
def test_austen_reader_matches_r_itself():
    texts, prov = C.load_austen()
    r = subprocess.run(["Rscript", "-e", 'library(janeaustenr); cat(persuasion, sep="\\n")'],
                       capture_output=True, timeout=120, check=True).stdout.decode("utf-8")
    assert r[:-1] == texts["persuasion"]
    assert prov["package_version"] and prov["novels"]["emma"] == len(texts["emma"].encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# LM data and metric
# ---------------------------------------------------------------------------------------------


def test_lm_split_holds_out_each_tail_and_counts_every_target_once():
    texts = {"a": "line one\nline two\nline three\n" * 20, "b": "other text here\n" * 30}
    train_texts, val_texts, info = TL.split_texts(texts, 0.1)
    tok = TL.ByteTokens()
    train, val = TL.token_streams(tok, train_texts, val_texts)
    assert (train == tok.eot_id).sum() == 2 and (val == tok.eot_id).sum() == 2
    for name, t in texts.items():
        b = t.encode()
        tail = b[info[name]["train_bytes"]:]
        assert info[name]["train_bytes"] + info[name]["val_bytes"] == len(b)
        assert tail.startswith(b"line") or tail.startswith(b"other")  # cut at a line break
        assert train_texts[name] + val_texts[name] == b
    assert bytes(val[val != tok.eot_id].tolist()) == b"".join(t.encode()[info[n]["train_bytes"]:] for n, t in texts.items())
    windows, starts = TL.val_windows(val, 16)
    mask = TL.window_masks(starts, 16)
    assert int(mask.sum()) == len(val) - 1  # every validation target exactly once
    assert int(starts[-1]) + 17 == len(val)


class _Uniform(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, idx):
        return torch.zeros(*idx.shape, self.vocab)


def test_bits_per_byte_of_a_uniform_model_is_log2_vocab():
    tok = TL.ByteTokens()
    val = torch.randint(0, 256, (200,))
    windows, starts = TL.val_windows(val, 32)
    bpb = TL.evaluate_bpb(_Uniform(257), windows, TL.window_masks(starts, 32), TL.token_byte_lengths(tok))
    assert bpb == pytest.approx(math.log2(257))


def test_bits_per_byte_divides_by_the_bytes_bpe_tokens_stand_for():
    """A uniform model over a BPE vocabulary costs log2(V) bits per token, i.e. log2(V) divided
    by the bytes per token (end-of-text targets stand for no bytes and are left out)."""
    tok = bpe.train([b"the cat sat on the mat " * 50], vocab_size=300)
    ids = tok.encode(b"the cat sat on the mat " * 20) + [tok.eot_id] + tok.encode(b"a mat " * 10)
    val = torch.tensor(ids)
    windows, starts = TL.val_windows(val, 16)
    mask = TL.window_masks(starts, 16)
    lens = TL.token_byte_lengths(tok)
    targets = val[1:]
    nbytes = float(lens[targets].sum())
    counted = int((lens[targets] > 0).sum())
    bpb = TL.evaluate_bpb(_Uniform(tok.vocab_size), windows, mask, lens)
    assert bpb == pytest.approx(counted * math.log2(tok.vocab_size) / nbytes)
    assert nbytes == len(tok.decode(ids[1:]))


# ---------------------------------------------------------------------------------------------
# Trainers end to end (tiny configurations, a few steps)
# ---------------------------------------------------------------------------------------------


@needs_austen
def test_train_lm_smoke(tmp_path):
    repo, work, png = tmp_path / "repo", tmp_path / "work", tmp_path / "lm.png"
    args = ["--n-layer", "1", "--n-head", "4", "--n-embd", "32", "--context-length", "64", "--seq-len", "64",
            "--batch-size", "4", "--steps", "40", "--eval-every", "10", "--eval-windows", "8", "--warmup", "5",
            "--lr", "1e-2", "--min-lr", "1e-3", "--work-dir", str(work)]
    assert TL.main(args) == 0  # both runs
    assert TL.main(["--attention", "", "--out", str(repo), "--curve-png", str(png)] + args) == 0  # report + export
    report = json.loads((work / "report.json").read_text())
    for a in ("tost", "softmax"):
        run = report["runs"][a]
        assert run["steps"] == 40 and run["tokens_seen"] == 40 * 4 * 64
        # learned something: a uniform guess costs log2(vocabulary) bits per token
        uniform_bpb = math.log2(2048) / report["split"]["bytes_per_token"]["val"]
        assert run["val_bpb"] < 0.9 * uniform_bpb
    assert report["runs"]["softmax"]["parameters"] > report["runs"]["tost"]["parameters"]  # 3C^2 vs C^2
    assert report["comparison"]["relative_gap"] == pytest.approx(
        report["runs"]["tost"]["val_bpb"] / report["runs"]["softmax"]["val_bpb"] - 1)
    model, config = R.load_model(repo / "tost-austen")
    assert config["trained"] is True
    assert config["tokenizer"] == {"type": "bpe", "file": "tokenizer.json", "eos_token_id": 2047}
    tok = bpe.Tokenizer.load(str(repo / "tost-austen" / "tokenizer.json"))
    assert tok.vocab_size == config["lm"]["vocab_size"] == 2048 and tok.eot_id == 2047
    prov = config["provenance"]
    assert prov["data"]["package"].startswith("r-cran-janeaustenr") and prov["data"]["package_version"]
    assert prov["metrics"]["val_bpb"] == report["runs"]["tost"]["val_bpb"]
    assert prov["metrics"]["softmax_twin"]["val_bpb"] == report["runs"]["softmax"]["val_bpb"]
    assert prov["split"]["val_tokens"] > 50_000 and prov["sample"]["text"].startswith(prov["sample"]["prompt"])
    assert png.stat().st_size > 10_000


def test_digit_preprocessing_and_split():
    images, labels, prov = C.load_digits()
    assert images.shape == (1797, 8, 8) and prov["package_version"]
    px = TV.to_pixels(images[:5])
    assert px.shape == (5, 32, 32) and px.dtype == torch.uint8
    x = TV.normalise(px)
    assert x.shape == (5, 1, 32, 32) and float(x.min()) >= -1 and float(x.max()) <= 1
    tr, va = TV.split_digits(labels, 0.2, 0)
    assert len(tr) == 1437 and len(va) == 360 and not set(tr.tolist()) & set(va.tolist())
    counts = torch.bincount(labels[va], minlength=10)
    assert int(counts.min()) >= 35  # stratified: ~36 of each class
    tr2, va2 = TV.split_digits(labels, 0.2, 0)
    assert torch.equal(va, va2)  # fixed


def test_train_vision_smoke(tmp_path):
    repo, work, png = tmp_path / "repo", tmp_path / "work", tmp_path / "v.png"
    # No jitter or label smoothing: the fastest learning a 80-step smoke test can show.
    args = ["--embed-dim", "32", "--depth", "1", "--num-heads", "4", "--steps", "80", "--batch-size", "32",
            "--eval-every", "20", "--warmup", "5", "--lr", "3e-3", "--rotate", "0", "--shift", "0", "--scale", "0",
            "--label-smoothing", "0", "--work-dir", str(work)]
    assert TV.main(args + ["--out", str(repo), "--curve-png", str(png)]) == 0
    report = json.loads((work / "report.json").read_text())
    for a in ("tost", "softmax"):
        assert report["runs"][a]["val_top1"] > 0.3  # chance is 0.1
    model, config = R.load_model(repo / "tost-digits")
    assert config["trained"] is True and config["labels"] == [str(i) for i in range(10)]
    assert config["vision"]["image_height"] == 32 and config["preprocess"] == {"mean": [0.5], "std": [0.5]}
    prov = config["provenance"]
    assert prov["data"]["package"].startswith("scikit-learn") and prov["split"]["val_images"] == 360
    assert prov["metrics"]["val_top1"] == report["runs"]["tost"]["val_top1"]
    samples = repo / "tost-digits" / "samples"
    assert sorted(os.listdir(samples)) == sorted([f"{c}_0.png" for c in range(10)] + [f"{c}_0.npy" for c in range(10)])
    for s in prov["samples"]:
        png_px = C.load_grey_png(str(samples / s["file"]))
        assert png_px.shape == (32, 32)
        arr = np.load(samples / s["file"].replace(".png", ".npy"))
        assert arr.shape == (1, 32, 32) and arr.dtype == np.float32
        np.testing.assert_array_equal(arr, TV.normalise(png_px.unsqueeze(0))[0].numpy())
        with torch.no_grad():
            assert int(model(torch.from_numpy(arr).unsqueeze(0)).argmax()) == s["predicted"]
    assert png.stat().st_size > 10_000
