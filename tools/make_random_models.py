#!/usr/bin/env python3
"""Write small ToST models at their official random initialisation into a model repository.

Why: tests, demos and load tests sometimes need a model repository that does not depend on the
trained models under models/ (which tools/train_vision.py and tools/train_lm.py make), and no
official ToST checkpoints have been released. These models are honest about it: ``"trained": false`` and a ``provenance`` object naming this
script and seed. They use the official initialisation, so they behave like untrained ToST models
(near-uniform class probabilities, near-uniform next-byte distribution), not like arbitrary noise.

Models written into --out:
  tost-digits  vision, 1x32x32 grey images, patch 4 (2-stage stem, 8x8 = 64 tokens), D 64, depth 4,
               4 heads, 10 classes "0".."9", preprocess mean 0.5 / std 0.5.
  tost-bytes   causal LM over bytes, 4 layers, 4 heads, C 128, context 1024, vocab 257
               (256 bytes + end-of-text 256), bias false.

Total size is about 4.6 MB (float32).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tost_reference as R  # noqa: E402

DIGITS_CFG = R.VisionConfig(
    embed_dim=64, depth=4, num_heads=4, mlp_ratio=4, patch_size=4, in_chans=1,
    num_classes=10, cls_attn_layers=2, image_height=32, image_width=32,
)
BYTES_CFG = R.LMConfig(
    n_layer=4, n_head=4, n_embd=128, context_length=1024, vocab_size=257, bias=False, mlp_ratio=4,
)


def _provenance(seed: int, init: str) -> dict:
    return {
        "kind": "random_init",
        "script": "tools/make_random_models.py",
        "seed": seed,
        "init": init,
        "note": "randomly initialised, NOT trained: outputs carry no information. Shipped so the "
                "server has a working default model; replace with trained weights for real use.",
    }


def build_models(seed: int):
    """Return [(config dict, model)] for the shipped defaults, deterministically from ``seed``."""
    torch.manual_seed(seed)
    digits = R.TostVision(DIGITS_CFG)  # eta 1.0 (official value for depth <= 12)
    digits_cfg = R.make_config(
        "tost-digits", DIGITS_CFG, version=f"random-{seed}", trained=False,
        provenance=_provenance(seed, "official XCiT/ToST init: trunc_normal(0.02) Linear weights and "
                                     "cls_token, zero biases, LayerNorm (1,0), default conv init, "
                                     "BatchNorm (1,0,0,1), gamma = eta = 1.0, temp = 1"),
        labels=[str(i) for i in range(10)],
        preprocess={"mean": [0.5], "std": [0.5]},
    )
    torch.manual_seed(seed + 1)
    lm = R.TostLM(BYTES_CFG)
    bytes_cfg = R.make_config(
        "tost-bytes", BYTES_CFG, version=f"random-{seed}", trained=False,
        provenance=_provenance(seed + 1, "official nanoGPT/ToST init: N(0,0.02) Linear and Embedding, "
                                         "c_proj N(0,0.02/sqrt(2*n_layer)), LayerNorm weight 1, "
                                         "gamma 1e-5, temp 1, denom_bias 0"),
        tokenizer={"type": "byte", "eos_token_id": 256},
    )
    return [(digits_cfg, digits), (bytes_cfg, lm)]


def _check_same_outputs(model, reloaded, config) -> None:
    """The written files must reproduce the in-memory model exactly (float32 in, float32 out)."""
    g = torch.Generator().manual_seed(0)
    if config["architecture"] == "tost_vision":
        v = model.cfg
        x = torch.randn(1, v.in_chans, v.image_height, v.image_width, generator=g)
    else:
        x = torch.randint(0, model.cfg.vocab_size, (1, 32), generator=g)
    with torch.no_grad():
        if not torch.equal(model(x), reloaded(x)):
            raise RuntimeError(f"{config['name']}: reloaded model differs from the one written")


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write randomly initialised models (tost-digits and a byte-level LM, tost-bytes) "
                    "into a model repository directory."
    )
    ap.add_argument("--out", required=True, help="model repository directory (e.g. models/)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)  # tiny models; extra threads only contend with parallel builds
    total = 0
    for config, model in build_models(args.seed):
        d = os.path.join(args.out, config["name"])
        tensors = R.save_model(model, config, d)
        # Re-load through the same path the tests use, so a broken file is caught here.
        reloaded, _ = R.load_model(d)
        _check_same_outputs(model, reloaded, config)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in ("config.json", "model.safetensors"))
        total += size
        n = sum(t.numel() for t in tensors.values())
        arch = config["architecture"]
        print(f"wrote {d}: {arch}, {len(tensors)} tensors, {n / 1e6:.3f}M parameters, {size / 1e6:.2f} MB")
    print(f"total {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
