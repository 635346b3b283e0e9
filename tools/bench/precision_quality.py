#!/usr/bin/env python3
"""Quality of the shipped language model at each CPU weight precision against fp32: held-out
bits/byte (docs/training.md's evaluation: the validation split of tools/train_lm.py, the last 5 % of
every novel, in non-overlapping --seq-len windows, end-of-text targets excluded) and teacher-forced
greedy agreement with fp32, measured on the served C++ model (tost_precision_quality) through its
prefill form on every window and its decode steps on the first --decode-windows windows.

Needs the corpus package (r-cran-janeaustenr, scripts/install-deps.sh) and a build with
tost_precision_quality. Prints one JSON line per precision and checks the targets: bits/byte
within 0.5 % of fp32 and agreement >= 99 % for bf16/fp16, within 2 % and >= 97 % for int8 (exit
status 1 when one is missed).
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
import bpe  # noqa: E402
import common_training as C  # noqa: E402
import train_lm  # noqa: E402


def write_windows(path: str, model_dir: str, seq_len: int, val_fraction: float) -> int:
    tok = bpe.Tokenizer.load(os.path.join(model_dir, "tokenizer.json"))
    texts, _ = C.load_austen()
    _, val_texts, _ = train_lm.split_texts(texts, val_fraction)
    ids = []
    for data in val_texts.values():
        ids.extend(tok.encode(data))
        ids.append(tok.eot_id)
    import torch

    windows, starts = train_lm.val_windows(torch.tensor(ids, dtype=torch.int64), seq_len)
    mask = train_lm.window_masks(starts, seq_len)
    with open(path, "wb") as f:
        f.write(struct.pack("<ii", windows.shape[0], windows.shape[1]))
        f.write(windows.to(torch.int32).numpy().tobytes())
        f.write(mask.to(torch.uint8).numpy().tobytes())
    return int(windows.shape[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("TOST_BUILD_DIR", os.path.join(REPO, "build")))
    ap.add_argument("--model-dir", default=os.path.join(REPO, "models", "tost-austen"))
    ap.add_argument("--dtypes", default="bf16,fp16,int8")
    ap.add_argument("--seq-len", type=int, default=256, help="evaluation window (the shipped model's)")
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--decode-windows", type=int, default=8)
    ap.add_argument("--max-bpb-increase", type=float, default=0.005)
    ap.add_argument("--min-agreement", type=float, default=0.99)
    ap.add_argument("--int8-max-bpb-increase", type=float, default=0.02)
    ap.add_argument("--int8-min-agreement", type=float, default=0.97)
    args = ap.parse_args()
    binary = os.path.join(args.build_dir, "tests", "bench", "tost_precision_quality")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "windows.bin")
        n = write_windows(path, args.model_dir, args.seq_len, args.val_fraction)
        print(f"{n} validation windows of {args.seq_len} tokens", file=sys.stderr, flush=True)
        out = subprocess.run([binary, f"--model_dir={args.model_dir}", f"--windows={path}",
                              f"--dtypes={args.dtypes}", f"--decode_windows={args.decode_windows}"],
                             check=True, capture_output=True, text=True).stdout
    ok = True
    for line in out.splitlines():
        r = json.loads(line)
        print(json.dumps(r), flush=True)
        if r["dtype"] == "fp32":
            continue
        int8 = r["dtype"] == "int8"
        max_bpb = args.int8_max_bpb_increase if int8 else args.max_bpb_increase
        min_agreement = args.int8_min_agreement if int8 else args.min_agreement
        if r["bits_per_byte_vs_fp32"] > max_bpb:
            print(f"{r['dtype']}: bits/byte {r['bits_per_byte_vs_fp32']:+.3%} vs fp32 misses the target",
                  file=sys.stderr)
            ok = False
        for form in ("prefill", "decode"):
            if r[f"greedy_agreement_{form}"] < min_agreement:
                print(f"{r['dtype']}: {form} agreement {r[f'greedy_agreement_{form}']:.4f} misses the target",
                      file=sys.stderr)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
