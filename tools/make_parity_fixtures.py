#!/usr/bin/env python3
"""Write parity fixtures: randomised ToST models plus reference inputs and outputs.

Why: the C++ server must reproduce the official ToST semantics bit-for-bit up to float32 rounding.
Freshly initialised models are a poor test of that - γ = 1e-5 hides whole blocks, temp = 1 and
δ = 0 hide their own handling, BatchNorm with mean 0 / var 1 hides a wrong fold, and tiny weights
keep the TSSA gate 1/(1+dots) at ~1 so a wrong second moment goes unseen. So every parameter and
buffer is moved away from its init, at scales that keep activations O(1) and the gate clearly
below 1. The gate and membership statistics are printed per case to show that.

Each case directory is a valid model directory of the model-repository format plus a fixture:

  DIR/<case>/config.json          model config (name == case)
  DIR/<case>/model.safetensors    weights (float32)
  DIR/<case>/fixture.safetensors  inputs and expected outputs (float32; tokens int64)
  DIR/manifest.json               the cases, tensor names/shapes, and float32-vs-float64 error
  DIR/bpe/<name>/tokenizer.json   byte-level BPE tokenizers (tools/bpe.py): "small" (trained here)
                                  and "shipped" (models/tost-austen's, when present)
  DIR/bpe/cases.json              texts with the pieces and ids tools/bpe.py gives them

Expected outputs are computed by tools/tost_reference.py in float64 from the float32 weights and
inputs actually stored (so the only error a correct float32 implementation shows is its own
rounding), then rounded to float32. ``logits_wrong_tssa`` is the output of the deliberately wrong
TSSA (softmax over tokens instead of heads): a negative control that a correct server must be far
from. The manifest records, per case, the max |float32 reference - float64 reference| as a
calibration point for tolerances.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List

import torch
import torch.nn as nn
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import tost_reference as R  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED_BPE = os.path.join(REPO, "models", "tost-austen", "tokenizer.json")


# ---------------------------------------------------------------------------------------------
# Randomisation
# ---------------------------------------------------------------------------------------------


def _normal_(t: torch.Tensor, std: float, g: torch.Generator, mean: float = 0.0) -> None:
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float64).mul_(std).add_(mean).to(t.dtype))


def _uniform_(t: torch.Tensor, lo: float, hi: float, g: torch.Generator) -> None:
    with torch.no_grad():
        t.copy_((torch.rand(t.shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(t.dtype))


def randomize_(model: nn.Module, seed: int, *, qkv_gain: float = 1.0, qkv_bias_std: float = 0.7,
               denom_bias_std: float = 0.5) -> nn.Module:
    """Move every parameter and buffer of a reference model away from its init, in place.

    Scales (fan_in = input width of the layer):
      Linear / conv weights  N(0, 1/fan_in)           -> O(1) activations from O(1) inputs
      TSSA projection        N(0, qkv_gain²/fan_in), bias N(0, qkv_bias_std²) (vision)
                             -> w² = O(1) with a spread per channel, so the gate 1/(1+dots) lies
                                well inside (0, 1) instead of at ~1
      other biases           N(0, 0.1²)
      LayerNorm              weight U(0.7, 1.3), bias N(0, 0.1²)
      γ1, γ2                 U(0.5, 1.5);  temp U(0.5, 3);  denom_bias N(0, denom_bias_std²)
      BatchNorm              weight U(0.5, 1.5), bias N(0, 0.2²), running_mean N(0, 0.2²),
                             running_var U(0.5, 2), num_batches_tracked 1000
      cls_token N(0, 1); wte N(0, 0.3²); wpe N(0, 0.3²)
    """
    g = torch.Generator().manual_seed(seed)
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            fan_in = mod.in_features
            is_tssa_proj = name.endswith("attn.qkv") and isinstance(model, R.TostVision) and name.startswith("blocks.")
            is_tssa_proj |= name.endswith("attn.c_attn")
            if isinstance(model, R.TostLM) and name == "lm_head":
                continue  # tied to wte, randomised below
            _normal_(mod.weight, (qkv_gain if is_tssa_proj else 1.0) / math.sqrt(fan_in), g)
            if mod.bias is not None:
                _normal_(mod.bias, qkv_bias_std if is_tssa_proj else 0.1, g)
        elif isinstance(mod, nn.Conv2d):
            fan_in = mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1]
            _normal_(mod.weight, 1.0 / math.sqrt(fan_in), g)
            if mod.bias is not None:
                _normal_(mod.bias, 0.1, g)
        elif isinstance(mod, nn.BatchNorm2d):
            _uniform_(mod.weight, 0.5, 1.5, g)
            _normal_(mod.bias, 0.2, g)
            _normal_(mod.running_mean, 0.2, g)
            _uniform_(mod.running_var, 0.5, 2.0, g)
            mod.num_batches_tracked.fill_(1000)
        elif isinstance(mod, nn.LayerNorm):
            _uniform_(mod.weight, 0.7, 1.3, g)
            if mod.bias is not None:
                _normal_(mod.bias, 0.1, g)
        elif isinstance(mod, nn.Embedding):
            _normal_(mod.weight, 0.3, g)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("gamma1", "gamma2"):
            _uniform_(p, 0.5, 1.5, g)
        elif leaf == "temp":
            _uniform_(p, 0.5, 3.0, g)
        elif leaf == "denom_bias":
            _normal_(p, denom_bias_std, g)
        elif name == "cls_token":
            _normal_(p, 1.0, g)
    return model


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

CASES: Dict[str, Dict[str, Any]] = {
    # Official tost_cab_tiny_12_p16 dimensions (5.77M parameters).
    "vision_tiny224": dict(
        kind="vision",
        cfg=R.VisionConfig(embed_dim=192, depth=12, num_heads=4, mlp_ratio=4, patch_size=16, in_chans=3,
                           num_classes=1000, cls_attn_layers=2, image_height=224, image_width=224),
        batch=2, preprocess={"mean": IMAGENET_MEAN, "std": IMAGENET_STD},
    ),
    # Small, non-square (8x12 patches) so H/W mix-ups in the stem or the positional encoding show.
    "vision_small": dict(
        kind="vision",
        cfg=R.VisionConfig(embed_dim=64, depth=3, num_heads=4, mlp_ratio=4, patch_size=4, in_chans=3,
                           num_classes=10, cls_attn_layers=2, image_height=32, image_width=48),
        batch=3, preprocess={"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    ),
    "lm_small": dict(
        kind="lm",
        cfg=R.LMConfig(n_layer=3, n_head=4, n_embd=64, context_length=256, vocab_size=257, bias=False, mlp_ratio=4),
        batch=2, seq_len=200,
    ),
    "lm_bias": dict(
        kind="lm",
        cfg=R.LMConfig(n_layer=2, n_head=4, n_embd=64, context_length=256, vocab_size=257, bias=True, mlp_ratio=4),
        batch=2, seq_len=50,
    ),
}


def _case_seed(seed: int, case: str) -> int:
    """Independent, reproducible seed per case (stable across Python runs, unlike hash())."""
    return seed * 1000 + sorted(CASES).index(case) * 17 + 1


def build_case(case: str, seed: int) -> Dict[str, Any]:
    """Build one case in memory: config dict, float32 model, inputs, float64 expected outputs."""
    spec = CASES[case]
    cseed = _case_seed(seed, case)
    torch.manual_seed(cseed)
    g = torch.Generator().manual_seed(cseed + 7)
    cfg = spec["cfg"]
    provenance = {
        "kind": "parity_fixture",
        "script": "tools/make_parity_fixtures.py",
        "seed": seed,
        "note": "randomised weights (every parameter moved off its init); outputs are meaningless "
                "except as a numerical reference",
    }
    if spec["kind"] == "vision":
        model = R.TostVision(cfg)
        config = R.make_config(case, cfg, version=f"fixture-{seed}", provenance=provenance,
                               preprocess=spec["preprocess"])
        x = torch.randn(spec["batch"], cfg.in_chans, cfg.image_height, cfg.image_width, generator=g)
        inputs = {"input": x.float()}
        run_input = lambda m, dt: m(inputs["input"].to(dt))  # noqa: E731
    else:
        model = R.TostLM(cfg)
        config = R.make_config(case, cfg, version=f"fixture-{seed}", provenance=provenance,
                               tokenizer={"type": "byte", "eos_token_id": 256})
        tok = torch.randint(0, cfg.vocab_size, (spec["batch"], spec["seq_len"]), generator=g, dtype=torch.int64)
        inputs = {"tokens": tok}
        run_input = lambda m, dt: m(inputs["tokens"])  # noqa: E731
    randomize_(model, cseed + 13)
    model = model.float().eval()  # the stored weights are exactly these float32 values

    m64 = _copy_to(model, spec, torch.float64)
    with torch.no_grad():
        logits64 = run_input(m64, torch.float64)
        logits32 = run_input(model, torch.float32)
    stats = R.collect_gate_stats(m64, lambda: run_input(m64, torch.float64))
    R.set_tssa_variant(m64, "token_softmax")
    with torch.no_grad():
        wrong64 = run_input(m64, torch.float64)
    expected = {"logits": logits64.float(), "logits_wrong_tssa": wrong64.float()}
    return dict(
        case=case, seed=seed, kind=spec["kind"], config=config, model=model, inputs=inputs, expected=expected,
        stats=stats,
        f32_err=(logits32.double() - logits64).abs().max().item(),
        wrong_diff=(wrong64 - logits64).abs().max().item(),
        scale=logits64.abs().max().item(),
    )


def _copy_to(model: nn.Module, spec: Dict[str, Any], dtype: torch.dtype) -> nn.Module:
    """A float64 twin of ``model`` with identical (float32-representable) values."""
    twin = (R.TostVision if spec["kind"] == "vision" else R.TostLM)(spec["cfg"])
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin.to(dtype).eval()


def write_case(built: Dict[str, Any], out_dir: str) -> Dict[str, Any]:
    case = built["case"]
    case_dir = os.path.join(out_dir, case)
    R.save_model(built["model"], built["config"], case_dir)
    fixture = {**built["inputs"], **built["expected"]}
    fixture = {k: v.detach().contiguous().clone() for k, v in fixture.items()}
    fixture_path = os.path.join(case_dir, "fixture.safetensors")
    # A single metadata key: safetensors serialises metadata from a hash map, so with several keys
    # the header order (and the file bytes) would vary from run to run.
    save_file(fixture, fixture_path,
              metadata={"generator": f"tools/make_parity_fixtures.py case={case} seed={built['seed']}"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(fixture_path, 0o666 & ~umask)  # safetensors writes 0600; fixtures are shared test data
    files = {f: os.path.getsize(os.path.join(case_dir, f))
             for f in ("config.json", "model.safetensors", "fixture.safetensors")}
    return {
        "name": case,
        "architecture": built["config"]["architecture"],
        "model_dir": case,
        "fixture": f"{case}/fixture.safetensors",
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                    for k, v in fixture.items()},
        "max_abs_logit": built["scale"],
        "float32_reference_max_abs_err": built["f32_err"],
        "wrong_tssa_max_abs_diff": built["wrong_diff"],
        "gate_stats": built["stats"],
        "bytes": files,
    }


# ---------------------------------------------------------------------------------------------
# Tokenizer fixtures
# ---------------------------------------------------------------------------------------------

_BPE_TRAINING_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
    "in want of a wife.\n\nHowever little known the feelings or views of such a man may be on his first "
    "entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that "
    "he is considered the rightful property of some one or other of their daughters.\n"
    "\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard that Netherfield Park is let at "
    "last?\" -- 1811, 1812: caf\u00e9 na\u00efve \u00c9lise \u2014 \u201cquoted\u201d.  Tabs\tand   spaces.\n"
)

_BPE_TEXTS = [
    "",
    " ",
    "a",
    "  ",
    "Hello world",
    " leading space",
    "trailing space ",
    "two  spaces   three    four",
    "line\nbreak\n\nparagraph\n  indented\n\tTabbed\r\nCRLF",
    "numbers 1811 and 3.14159, 10,000 and -42",
    "punctuation!? \"quotes\" (parens) -- dashes... ;:'",
    "caf\u00e9 na\u00efve \u00c9lise \u2014 \u201cquoted\u201d \U0001F600 emoji",
    "x" * 100,
    " " + "y" * 70 + " " * 40 + "z",
    "-" * 65 + "1234567890" * 5,
    "\x00\x01 control\x7f bytes",
    _BPE_TRAINING_TEXT,
]


def write_bpe_fixtures(out_dir: str, seed: int) -> Dict[str, Any]:
    """Tokenizer files and expected encodings for the C++ BpeTokenizer (tests/model/text_test.cc)."""
    root = os.path.join(out_dir, "bpe")
    tokenizers = {"small": bpe.train([_BPE_TRAINING_TEXT.encode("utf-8")], vocab_size=400)}
    if os.path.exists(SHIPPED_BPE):
        tokenizers["shipped"] = bpe.Tokenizer.load(SHIPPED_BPE)
    g = torch.Generator().manual_seed(seed)
    texts = [t.encode("utf-8") for t in _BPE_TEXTS]
    texts.append(bytes(torch.randint(0, 256, (3000,), generator=g).tolist()))  # arbitrary bytes
    texts.append(bytes(torch.randint(32, 127, (3000,), generator=g).tolist()))  # printable ASCII
    cases = []
    for name, tok in tokenizers.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        tok.save(os.path.join(root, name, "tokenizer.json"))
        for data in texts:
            ids = tok.encode(data)
            assert tok.decode(ids) == data
            cases.append({"tokenizer": name, "vocab_size": tok.vocab_size, "text_hex": data.hex(),
                          "pieces_hex": [p.hex() for p in bpe.pre_tokenize(data, tok.max_piece_bytes)],
                          "ids": ids})
    with open(os.path.join(root, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/make_parity_fixtures.py (tools/bpe.py)", "cases": cases}, f)
        f.write("\n")
    return {"tokenizers": {n: t.vocab_size for n, t in tokenizers.items()}, "cases": len(cases)}


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write randomised ToST parity fixtures (model dirs + fixture.safetensors + manifest.json).",
        epilog="Cases: " + ", ".join(CASES),
    )
    ap.add_argument("--out", required=True, help="output directory (created; existing cases are overwritten)")
    ap.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES),
                    help="subset of cases to write (default: all)")
    args = ap.parse_args(argv)

    # Single-threaded on purpose: the models are small, and on the 2-core build machines shared
    # with C++ builds intra-op threads mostly spin (measured: 2.9 s with 1 thread, 14.6 s with 2).
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    entries = []
    for case in args.cases:
        t0 = time.time()
        built = build_case(case, args.seed)
        entry = write_case(built, args.out)
        entries.append(entry)
        s = entry["gate_stats"]
        print(
            f"{case}: gate min/mean/max {s['gate_min']:.4f}/{s['gate_mean']:.4f}/{s['gate_max']:.4f}, "
            f"mean max_k Pi {s['pi_max_mean']:.3f} (min {s['pi_max_min']:.3f}); "
            f"|logits| max {entry['max_abs_logit']:.3g}, fp32-vs-fp64 {entry['float32_reference_max_abs_err']:.2e}, "
            f"wrong-TSSA diff {entry['wrong_tssa_max_abs_diff']:.3g}; "
            f"model {entry['bytes']['model.safetensors'] / 1e6:.2f} MB, "
            f"fixture {entry['bytes']['fixture.safetensors'] / 1e6:.2f} MB ({time.time() - t0:.1f}s)"
        )
    bpe_info = write_bpe_fixtures(args.out, args.seed)
    print(f"bpe: {bpe_info['cases']} encodings with tokenizers {bpe_info['tokenizers']}")
    manifest = {
        "format_version": 1,
        "bpe": bpe_info,
        "generator": "tools/make_parity_fixtures.py",
        "seed": args.seed,
        "reference": "tools/tost_reference.py (float64, outputs rounded to float32)",
        "notes": [
            "Vision 'input' is the model input AFTER preprocessing (send it as a raw tensor).",
            "LM 'logits' cover all positions (B, T, vocab); 'tokens' are int64.",
            "'logits_wrong_tssa' = softmax over tokens instead of heads; a correct server must NOT match it.",
        ],
        "cases": entries,
    }
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"wrote {len(entries)} case(s) and manifest.json to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
