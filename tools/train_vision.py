#!/usr/bin/env python3
"""Train the shipped ToST digit classifier (models/tost-digits) and its softmax-attention twin.

Data: scikit-learn's bundled handwritten digits (1797 grey 8x8 images, ink 0..16, classes 0-9).
Split: stratified 80/20 with a fixed seed (sklearn.model_selection.train_test_split, random_state
0): 1437 training and 360 validation images; nothing of the validation split is trained on.

Input: 8x8 is too few tokens for TSSA's statistics (Π over 4 tokens says little), so every image
is upsampled once to 32x32 (bilinear, align_corners=False, of ink/16), quantised to 8-bit grey
(white digit on black, like MNIST: exactly the PNG a client would send), then normalised with
mean 0.5 / std 0.5. The model's 2-stage stem (patch 4) turns 32x32 into 8x8 = 64 tokens.
Training adds small random affine jitter (rotation, scale, shift) to the 32x32 images.

Models: ``--attention`` tost (the official tost_vision architecture, served by tost-serve) and/or
softmax (the same skeleton, the ``vit_cab`` baseline: timm softmax attention instead of TSSA;
qkv is 3D² instead of D²). Both see the same batches, augmentations and steps.

Outputs:
  <out>/<name>/config.json + model.safetensors   the ToST model, provenance and metrics
  <out>/<name>/samples/<label>_0.png, .npy        the first validation image of each class (PNG:
                                                  32x32 grey; .npy: (1, 32, 32) float32 model input)
  <work-dir>/<attention>/{model.safetensors,metrics.json}, <work-dir>/report.json
  --curve-png                                     loss / accuracy curves of the finished runs

Example (the shipped model):
  python tools/train_vision.py --out models --work-dir build-train/runs/vision --curve-png docs/img/vision_loss.png
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common_training as C  # noqa: E402
import tost_reference as R  # noqa: E402

SIZE = 32  # model input resolution
MEAN, STD = 0.5, 0.5


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def to_pixels(images8: torch.Tensor, size: int = SIZE) -> torch.Tensor:
    """(N, 8, 8) ink 0..16 -> (N, size, size) uint8 grey levels (bilinear upsampling, rounded)."""
    x = (images8.float() / 16.0).unsqueeze(1)
    up = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return (up.clamp(0, 1) * 255).round().to(torch.uint8).squeeze(1)


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """(N, H, W) uint8 -> (N, 1, H, W) float32 model input: (p/255 - mean) / std."""
    return ((pixels.float() / 255.0 - MEAN) / STD).unsqueeze(1)


def split_digits(labels: torch.Tensor, val_fraction: float, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    tr, va = train_test_split(idx, test_size=val_fraction, random_state=seed, stratify=labels.numpy())
    return torch.tensor(np.sort(tr)), torch.tensor(np.sort(va))


def augment(x01: torch.Tensor, g: torch.Generator, max_rot_deg: float, max_shift_px: float,
            scale_range: float) -> torch.Tensor:
    """Random affine jitter of (B, 1, H, W) images in [0, 1]; background stays 0 (black)."""
    B, _, H, W = x01.shape
    rot = (torch.rand(B, generator=g) * 2 - 1) * math.radians(max_rot_deg)
    scale = 1 + (torch.rand(B, generator=g) * 2 - 1) * scale_range
    shift = (torch.rand(B, 2, generator=g) * 2 - 1) * (2 * max_shift_px / H)  # grid units: 2/H per pixel
    cos, sin = torch.cos(rot) / scale, torch.sin(rot) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x01.shape), align_corners=False)
    return F.grid_sample(x01, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 120) -> Dict[str, Any]:
    was = model.training
    model.eval()
    logits = torch.cat([model(x[i:i + batch]) for i in range(0, len(x), batch)])
    model.train(was)
    pred = logits.argmax(-1)
    return {"loss": F.cross_entropy(logits, y).item(), "top1": (pred == y).float().mean().item(),
            "errors": int((pred != y).sum()), "pred": pred}


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def make_cfg(args: argparse.Namespace) -> R.VisionConfig:
    return R.VisionConfig(embed_dim=args.embed_dim, depth=args.depth, num_heads=args.num_heads,
                          mlp_ratio=args.mlp_ratio, patch_size=args.patch_size, in_chans=1,
                          num_classes=10, cls_attn_layers=2, image_height=SIZE, image_width=SIZE)


def build(attention: str, cfg: R.VisionConfig, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return R.TostVision(cfg) if attention == "tost" else C.softmax_vision_twin(cfg)


def train_one(attention: str, cfg: R.VisionConfig, train_px: torch.Tensor, train_y: torch.Tensor,
              val_x: torch.Tensor, val_y: torch.Tensor, args: argparse.Namespace):
    model = build(attention, cfg, args.seed)
    model.train()
    opt = torch.optim.AdamW(C.param_groups(model, args.weight_decay), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed + 1)  # same batches and jitter for every model
    train01 = (train_px.float() / 255.0).unsqueeze(1)
    curve_train, curve_val, curve_acc = [], [], []
    running, running_n = 0.0, 0
    timer = C.Timer()
    bar = C.progress(args.steps, f"{attention:>7}")
    for step in range(args.steps):
        lr = C.cosine_lr(step, args.steps, args.warmup, args.lr, args.min_lr)
        for grp in opt.param_groups:
            grp["lr"] = lr
        idx = torch.randint(0, len(train01), (args.batch_size,), generator=g)
        xb = augment(train01[idx], g, args.rotate, args.shift, args.scale)
        xb = (xb - MEAN) / STD
        loss = F.cross_entropy(model(xb), train_y[idx], label_smoothing=args.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        running += loss.item()
        running_n += 1
        if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
            ev = evaluate(model, val_x, val_y)
            curve_train.append((step + 1, running / running_n))
            curve_val.append((step + 1, ev["loss"]))
            curve_acc.append((step + 1, ev["top1"]))
            running, running_n = 0.0, 0
            bar.set_postfix(train_loss=f"{curve_train[-1][1]:.3f}", val_loss=f"{ev['loss']:.3f}",
                            val_top1=f"{ev['top1']:.4f}")
        bar.update(1)
    bar.close()
    seconds = timer.seconds
    model.eval()
    ev = evaluate(model, val_x, val_y)
    metrics = {
        "attention": attention,
        "parameters": C.count_parameters(model),
        "steps": args.steps,
        "images_seen": args.steps * args.batch_size,
        "train_seconds": round(seconds, 1),
        "val_top1": ev["top1"],
        "val_loss": ev["loss"],
        "val_errors": ev["errors"],
        "curve_train_loss": curve_train,
        "curve_val_loss": curve_val,
        "curve_val_top1": curve_acc,
    }
    print(f"{attention}: {metrics['parameters']} parameters, {args.steps} steps in {seconds / 60:.1f} min; "
          f"validation top-1 {100 * ev['top1']:.2f}% ({ev['errors']} errors of {len(val_y)}), "
          f"loss {ev['loss']:.4f}", flush=True)
    return model, metrics


def load_run(work_dir: str, attention: str, cfg: R.VisionConfig):
    sd, metrics = C.read_run(work_dir, attention, cfg.to_dict())
    model = build(attention, cfg, 0)
    model.load_state_dict(sd, strict=True)
    return model.eval(), metrics


def write_samples(model: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor, val_idx: torch.Tensor,
                  out_dir: str) -> List[Dict[str, Any]]:
    """The first validation image of every class: <label>_0.png (32x32 grey) and <label>_0.npy
    ((1, 32, 32) float32, preprocessed exactly as the model expects)."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for cls in range(10):
        i = int(val_idx[(labels[val_idx] == cls).nonzero()[0, 0]])
        stem = os.path.join(out_dir, f"{cls}_0")
        C.save_grey_png(stem + ".png", pixels[i])
        x = normalise(C.load_grey_png(stem + ".png").unsqueeze(0))  # through the PNG: what a client sends
        np.save(stem + ".npy", x[0].numpy().astype(np.float32))
        with torch.no_grad():
            pred = int(model(x).argmax(-1))
        written.append({"file": f"{cls}_0.png", "dataset_index": i, "label": cls, "predicted": pred})
    return written


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Train the ToST digit classifier (tost-digits) on scikit-learn's digits and its "
                    "softmax-attention twin (same skeleton, same batches); report validation top-1.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    C.add_run_arguments(ap, name="tost-digits", work_dir="build/train-runs/vision",
                        curve_help="write the loss/accuracy curves here (PNG)")
    ap.add_argument("--val-fraction", type=float, default=0.2)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--embed-dim", type=int, default=64)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--mlp-ratio", type=int, default=4)
    ap.add_argument("--patch-size", type=int, default=4, help="32x32 input / patch 4 = 64 tokens")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
    ap.add_argument("--min-lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--rotate", type=float, default=12.0, help="max rotation jitter, degrees")
    ap.add_argument("--shift", type=float, default=2.5, help="max shift jitter, pixels of the 32x32 input")
    ap.add_argument("--scale", type=float, default=0.1, help="max relative scale jitter")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    C.parse_runs(ap, args)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    C.single_thread()
    t_start = time.time()
    images, labels, data_prov = C.load_digits()
    pixels = to_pixels(images)
    tr_idx, va_idx = split_digits(labels, args.val_fraction, args.split_seed)
    val_x, val_y = normalise(pixels[va_idx]), labels[va_idx]
    cfg = make_cfg(args)
    split = {
        "rule": f"sklearn.model_selection.train_test_split(test_size={args.val_fraction}, "
                f"random_state={args.split_seed}, stratify=labels)",
        "train_images": len(tr_idx), "val_images": len(va_idx),
        "val_indices_sha256": hashlib.sha256(",".join(map(str, va_idx.tolist())).encode()).hexdigest(),
    }
    preprocessing = (f"8x8 ink/16 -> bilinear upsample to {SIZE}x{SIZE} (align_corners=False) -> 8-bit grey "
                     f"(round(255 v)); model input (p/255 - {MEAN}) / {STD}")
    training = {
        "script": "tools/train_vision.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "seed": args.seed, "steps": args.steps, "batch_size": args.batch_size,
        "optimizer": f"AdamW(weight_decay {args.weight_decay} on matrices except temp, cls_token), "
                     f"grad clip {args.grad_clip}, label smoothing {args.label_smoothing}",
        "lr_schedule": f"linear warmup {args.warmup} steps to {args.lr}, cosine to {args.min_lr}",
        "augmentation": f"random affine: rotation +-{args.rotate} deg, scale +-{args.scale}, "
                        f"shift +-{args.shift} px",
        "preprocessing": preprocessing,
        **C.environment_provenance(),
    }

    for attention in args.runs:
        model, metrics = train_one(attention, cfg, pixels[tr_idx], labels[tr_idx], val_x, val_y, args)
        metrics["config"] = cfg.to_dict()
        metrics["training"] = training
        C.save_run(args.work_dir, attention, model, metrics)

    results: Dict[str, Dict[str, Any]] = {}
    models: Dict[str, torch.nn.Module] = {}
    for attention in C.finished_runs(args.work_dir):
        models[attention], results[attention] = load_run(args.work_dir, attention, cfg)
        # Re-measured from the stored weights, so the report never disagrees with them.
        ev = evaluate(models[attention], val_x, val_y)
        results[attention].update(val_top1=ev["top1"], val_loss=ev["loss"], val_errors=ev["errors"])
    comparison: Dict[str, Any] = {}
    if "tost" in results and "softmax" in results:
        t, s = results["tost"], results["softmax"]
        comparison = {"tost_val_top1": t["val_top1"], "softmax_val_top1": s["val_top1"],
                      "difference_points": 100 * (t["val_top1"] - s["val_top1"])}
        print(f"validation top-1: ToST {100 * t['val_top1']:.2f}%, softmax twin {100 * s['val_top1']:.2f}%")
    os.makedirs(args.work_dir, exist_ok=True)
    with open(os.path.join(args.work_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump({"config": cfg.to_dict(), "data": data_prov, "split": split,
                   "runs": {a: {k: v for k, v in r.items() if not k.startswith("curve")} for a, r in results.items()},
                   "comparison": comparison}, f, indent=1)
        f.write("\n")

    if args.curve_png and results:
        labels_ = {"tost": "ToST (TSSA)", "softmax": "softmax twin"}
        C.plot_curves(
            args.curve_png,
            {labels_[a]: {"train": r["curve_train_loss"], "val": r["curve_val_loss"]} for a, r in results.items()},
            secondary={labels_[a]: r["curve_val_top1"] for a, r in results.items()},
            secondary_label="validation top-1",
            title=f"Digits ({SIZE}x{SIZE}, 64 tokens): D {cfg.embed_dim}, depth {cfg.depth}, "
                  f"batch {args.batch_size}; loss with label smoothing {args.label_smoothing}",
            ylabel="cross-entropy (nats)")
        print(f"wrote {args.curve_png}")

    if args.out:
        if "tost" not in results:
            raise SystemExit(f"--out: no finished ToST run in {args.work_dir}")
        tost, twin = results["tost"], results.get("softmax")
        d = os.path.join(args.out, args.name)
        samples = write_samples(models["tost"], pixels, labels, va_idx, os.path.join(d, "samples"))
        provenance = {
            "kind": "trained",
            "data": data_prov,
            "split": split,
            "training": tost["training"],
            "metrics": {
                "val_top1": tost["val_top1"], "val_loss": tost["val_loss"], "val_errors": tost["val_errors"],
                "steps": tost["steps"], "train_seconds": tost["train_seconds"], "parameters": tost["parameters"],
                "softmax_twin": None if twin is None else {
                    "val_top1": twin["val_top1"], "val_loss": twin["val_loss"], "val_errors": twin["val_errors"],
                    "parameters": twin["parameters"], "steps": twin["steps"], "train_seconds": twin["train_seconds"],
                    "architecture": "same skeleton (vit_cab), timm softmax attention instead of TSSA"},
            },
            "samples": samples,
        }
        config = R.make_config(args.name, cfg, version=time.strftime("%Y%m%d") + "-digits", trained=True,
                               provenance=provenance, labels=[str(i) for i in range(10)],
                               preprocess={"mean": [MEAN], "std": [STD]})
        R.save_model(models["tost"], config, d)
        reloaded, _ = R.load_model(d)
        ev = evaluate(reloaded, val_x, val_y)
        if ev["errors"] != tost["val_errors"]:
            raise RuntimeError(f"{d}: reloaded model makes {ev['errors']} errors, trained model {tost['val_errors']}")
        wrong = [s["file"] for s in samples if s["predicted"] != s["label"]]
        size = os.path.getsize(os.path.join(d, "model.safetensors"))
        print(f"exported {d} ({size / 1e6:.2f} MB), reloaded top-1 {100 * ev['top1']:.2f}%; "
              f"{len(samples)} samples, misclassified: {wrong or 'none'}")
    print(f"done in {(time.time() - t_start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
