#!/usr/bin/env python3
"""Train the shipped causal ToST language model (models/tost-austen) and its softmax GPT twin.

Data: Jane Austen's six novels (public domain), as Debian's ``r-cran-janeaustenr`` ships them
(apt-get install --no-install-recommends r-cran-janeaustenr; read without R, see
tools/common_training.py). Split: the last ``--val-fraction`` (default 5%) of every novel, cut at a
line break, is validation; the rest is training. Nothing of the validation text is ever trained on.

Tokens (``--tokenizer``): ``bpe`` (default) is byte-level BPE (tools/bpe.py): ids 0-255 are the
bytes, then ``--vocab-size`` - 257 merges learned on the training split only, then end-of-text,
which separates the novels. ``byte`` is the bytes alone (vocabulary 257). Why BPE is the default:
causal TSSA sees earlier tokens only through prefix sums over the whole prefix, in which the
previous token weighs 1/t, so a byte-token model cannot tell which byte came just before and stays
near a byte-bigram model (``--probe-steps`` measures this); with BPE a token is most of a word.

Models: ``--attention`` tost (the official ``tost_lang/model_TSSA.py`` architecture, served by
tost-serve) and/or softmax (the same skeleton with nanoGPT causal softmax attention: same
embeddings, layer-scales, LayerNorms, MLPs, widths and depth; its attention has 3C² instead of C²
input-projection weights). Both see the same batches in the same order for the same number of
steps: equal size (same dimensions) and equal budget (tokens). Validation metric: bits per byte
(cross-entropy in nats / ln 2 summed over all validation tokens, end-of-text targets excluded,
divided by the bytes those tokens stand for), so the byte and BPE runs are on one scale.

Outputs:
  <out>/<name>/config.json + model.safetensors   the ToST model, with provenance and metrics
  <out>/<name>/tokenizer.json                      its BPE merges (tost-bpe-v1)
  <work-dir>/tokenizer.json                        the tokenizer every run of the work dir uses
  <work-dir>/<attention>/model.safetensors         each run's weights (the twin's included)
  <work-dir>/<attention>/metrics.json              each run's curves, final metrics and sample
  <work-dir>/report.json                           the comparison of the finished runs
  --curve-png                                      loss curves of the finished runs (bits per byte)

Single-threaded (2-core build machines shared with compilers). The two runs can be trained by two
concurrent invocations and reported on by a third (empty --attention), which is how the shipped
model was made (docs/training.md):
  python tools/train_lm.py --attention tost    --work-dir W &
  python tools/train_lm.py --attention softmax --work-dir W &
  wait; python tools/train_lm.py --attention "" --work-dir W --out models --curve-png docs/img/lm_loss.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import common_training as C  # noqa: E402
import tost_reference as R  # noqa: E402

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


class ByteTokens:
    """Bytes as tokens 0-255, end-of-text 256 (the ``byte`` tokenizer of the server)."""

    eot_id = 256
    vocab_size = 257

    def encode(self, data: bytes) -> List[int]:
        return list(data)

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b""

    def decode(self, ids) -> bytes:
        return b"".join(self.token_bytes(t) for t in ids)


def token_byte_lengths(tok) -> torch.Tensor:
    """Bytes each token id stands for (0 for end-of-text): the denominator of bits per byte."""
    return torch.tensor([len(tok.token_bytes(t)) for t in range(tok.vocab_size)], dtype=torch.float64)


def split_texts(texts: Dict[str, str], val_fraction: float) -> Tuple[Dict[str, bytes], Dict[str, bytes], Dict[str, Any]]:
    """Each novel's first part (training) and its last ``val_fraction`` from the first line break
    after the cut (validation), as UTF-8 bytes."""
    train, val, info = {}, {}, {}
    for name, text in texts.items():
        data = text.encode("utf-8")
        cut = int(len(data) * (1.0 - val_fraction))
        nl = data.find(b"\n", cut)
        cut = nl + 1 if nl >= 0 else cut
        info[name] = {"train_bytes": cut, "val_bytes": len(data) - cut}
        train[name], val[name] = data[:cut], data[cut:]
    return train, val, info


def make_tokenizer(args: argparse.Namespace, train_texts: Dict[str, bytes]):
    """The run's tokenizer: BPE merges learned on the training split (deterministic, so concurrent
    invocations agree; each writes the same <work-dir>/tokenizer.json), or plain bytes."""
    if args.tokenizer == "byte":
        return ByteTokens()
    t0 = time.time()
    tok = bpe.train(train_texts.values(), args.vocab_size)
    os.makedirs(args.work_dir, exist_ok=True)
    path = os.path.join(args.work_dir, "tokenizer.json")
    tmp = f"{path}.{os.getpid()}"
    tok.save(tmp)
    os.replace(tmp, path)
    print(f"BPE: {len(tok.merges)} merges learned in {time.time() - t0:.1f} s -> {path}", flush=True)
    return tok


def token_streams(tok, train_texts: Dict[str, bytes], val_texts: Dict[str, bytes]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Train and validation token streams (int64); every novel's part ends with end-of-text."""
    def stream(parts: Dict[str, bytes]) -> torch.Tensor:
        ids: List[int] = []
        for data in parts.values():
            ids.extend(tok.encode(data))
            ids.append(tok.eot_id)
        return torch.tensor(ids, dtype=torch.int64)
    return stream(train_texts), stream(val_texts)


def val_windows(val: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping (seq_len + 1)-token windows covering the validation stream (the last one
    is shifted back to end at the stream's end; its overlap is excluded from the loss by
    ``window_masks``)."""
    starts = list(range(0, len(val) - seq_len - 1, seq_len))
    last = len(val) - seq_len - 1
    if not starts or starts[-1] != last:
        starts.append(last)
    return torch.stack([val[s:s + seq_len + 1] for s in starts]), torch.tensor(starts)


def window_masks(starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Loss mask per window target so every validation target is counted exactly once."""
    mask = torch.ones(len(starts), seq_len, dtype=torch.bool)
    if len(starts) > 1:
        overlap = int(starts[-2] + seq_len - starts[-1])
        if overlap > 0:
            mask[-1, :overlap] = False
    return mask


@torch.no_grad()
def evaluate_bpb(model: torch.nn.Module, windows: torch.Tensor, mask: torch.Tensor, byte_len: torch.Tensor,
                 batch: int = 4) -> float:
    """Bits per byte over the masked targets of ``windows``: summed cross-entropy / the bytes the
    targets stand for; end-of-text targets (no bytes) are excluded."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        logits = model(w[:, :-1])
        tgt = w[:, 1:]
        lens = byte_len[tgt]
        m = mask[i:i + batch] & (lens > 0)
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
        total += nll[m.reshape(-1)].sum().item()
        count += float(lens[m].sum())
    model.train(was_training)
    return total / count / LN2


def ngram_baselines(train: torch.Tensor, val: torch.Tensor, byte_len: torch.Tensor) -> Dict[str, float]:
    """Unigram and bigram (add-0.5) token models in bits per byte on validation: floors any context
    model must beat."""
    V = len(byte_len)
    tgt = val[1:]
    lens = byte_len[tgt]
    keep = lens > 0
    uni = torch.bincount(train, minlength=V).double() + 0.5
    uni_lp = (uni / uni.sum()).log()
    big = torch.zeros(V, V, dtype=torch.float64)
    big.index_put_((train[:-1], train[1:]), torch.ones(len(train) - 1, dtype=torch.float64), accumulate=True)
    big += 0.5
    big_lp = (big / big.sum(1, keepdim=True)).log()
    nbytes = float(lens[keep].sum())
    return {
        "unigram_bpb": float(-uni_lp[tgt][keep].sum() / nbytes / LN2),
        "bigram_bpb": float(-big_lp[val[:-1], tgt][keep].sum() / nbytes / LN2),
    }


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def build(attention: str, cfg: R.LMConfig, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return R.TostLM(cfg) if attention == "tost" else C.softmax_lm_twin(cfg)


def train_one(attention: str, cfg: R.LMConfig, train: torch.Tensor, windows: torch.Tensor,
              mask: torch.Tensor, byte_len: torch.Tensor, args: argparse.Namespace) -> Tuple[torch.nn.Module, Dict[str, Any]]:
    model = build(attention, cfg, args.seed)
    model.train()
    opt = torch.optim.AdamW(C.param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    data_gen = torch.Generator().manual_seed(args.seed + 1)  # same batches for every model
    T, B = args.seq_len, args.batch_size
    # Periodic evaluation on a fixed, evenly spaced subset of the validation windows (the final
    # figure uses all of them).
    sub = torch.linspace(0, len(windows) - 1, min(args.eval_windows, len(windows))).long()
    curve_train: List[Tuple[int, float]] = []
    curve_val: List[Tuple[int, float]] = []
    timer = C.Timer()
    running, running_n = 0.0, 0
    # The training curve is in bits per byte too, with the corpus-wide bytes per token.
    bytes_per_token = float(byte_len[train].sum()) / len(train)
    bar = C.progress(args.steps, f"{attention:>7}")
    for step in range(args.steps):
        lr = C.cosine_lr(step, args.steps, args.warmup, args.lr, args.min_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train) - T - 1, (B,), generator=data_gen)
        x = torch.stack([train[s:s + T + 1] for s in starts.tolist()])
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        running += loss.item()
        running_n += 1
        last = step == args.steps - 1
        if (step + 1) % args.eval_every == 0 or last:
            curve_train.append((step + 1, running / running_n / LN2 / bytes_per_token))
            running, running_n = 0.0, 0
            curve_val.append((step + 1, evaluate_bpb(model, windows[sub], mask[sub], byte_len)))
            bar.set_postfix(train_bpb=f"{curve_train[-1][1]:.3f}", val_bpb=f"{curve_val[-1][1]:.3f}")
        bar.update(1)
        if args.max_minutes and timer.seconds > 60 * args.max_minutes and not last:
            bar.write(f"{attention}: stopping at step {step + 1}: --max-minutes {args.max_minutes} reached")
            curve_train.append((step + 1, running / max(1, running_n) / LN2 / bytes_per_token))
            curve_val.append((step + 1, evaluate_bpb(model, windows[sub], mask[sub], byte_len)))
            break
    bar.close()
    train_seconds = timer.seconds
    steps_done = curve_val[-1][0]
    final = evaluate_bpb(model, windows, mask, byte_len)
    model.eval()
    metrics = {
        "attention": attention,
        "parameters": C.count_parameters(model),
        "steps": steps_done,
        "tokens_seen": steps_done * B * T,
        "train_seconds": round(train_seconds, 1),
        "tokens_per_second": round(steps_done * B * T / train_seconds, 1),
        "val_bpb": final,
        "curve_train_bpb": curve_train,
        "curve_val_bpb_subset": curve_val,
    }
    print(f"{attention}: {metrics['parameters']} parameters, {steps_done} steps, "
          f"{metrics['tokens_seen'] / 1e6:.2f}M tokens in {train_seconds / 60:.1f} min "
          f"({metrics['tokens_per_second']:.0f} tok/s); validation {final:.4f} bits/byte", flush=True)
    return model, metrics


@torch.no_grad()
def sample(model: torch.nn.Module, tok, prompt: str, n: int, temperature: float, top_k: int, seed: int) -> str:
    """Continue ``prompt`` by ``n`` tokens with top-k sampling (full forward each step: any model)."""
    g = torch.Generator().manual_seed(seed)
    ids = tok.encode(prompt.encode("utf-8"))
    for _ in range(n):
        logits = model(torch.tensor([ids[-model.cfg.context_length:]]))[0, -1] / temperature
        v, i = logits.topk(top_k)
        nxt = int(i[torch.multinomial(torch.softmax(v, -1), 1, generator=g)])
        if nxt == tok.eot_id:
            break
        ids.append(nxt)
    return tok.decode(ids).decode("utf-8", errors="replace")


def previous_byte_probe(steps: int, seed: int, n_embd: int = 64, n_layer: int = 2, seq_len: int = 128,
                        batch: int = 16, alphabet: int = 16) -> Dict[str, Any]:
    """Can the architecture tell which byte came just before? Train each attention type on
    uniformly random byte strings (``alphabet`` symbols) to output, at position t, the byte at
    t-1. Softmax attention can attend to the previous position. TSSA sees other tokens only through
    prefix sums (S1 = Σw², S2 = ΣΠw², S3 = ΣΠ, docs/model-semantics.md §2.2), in which the previous token
    weighs 1/t; so its accuracy should fall toward chance (1/alphabet) as t grows.
    Returns accuracy per position band for each attention type."""
    cfg = R.LMConfig(n_layer=n_layer, n_head=4, n_embd=n_embd, context_length=seq_len, vocab_size=ByteTokens.vocab_size)
    bands = [(1, 4), (4, 16), (16, 64), (64, seq_len)]
    out: Dict[str, Any] = {"task": f"predict the previous byte of uniform random strings over {alphabet} symbols",
                           "chance": 1.0 / alphabet, "steps": steps, "batch": batch, "seq_len": seq_len,
                           "config": cfg.to_dict(), "accuracy": {}}
    for attention in ("tost", "softmax"):
        model = build(attention, cfg, seed)
        model.train()
        opt = torch.optim.AdamW(C.param_groups(model, 0.0), lr=3e-3, betas=(0.9, 0.95))
        g = torch.Generator().manual_seed(seed + 7)
        bar = C.progress(steps, f"probe {attention}")
        for step in range(steps):
            for grp in opt.param_groups:
                grp["lr"] = C.cosine_lr(step, steps, 50, 3e-3, 3e-4)
            x = torch.randint(0, alphabet, (batch, seq_len), generator=g)
            logits = model(x)[:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, :-1].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            bar.update(1)
        bar.close()
        model.eval()
        with torch.no_grad():
            x = torch.randint(0, alphabet, (64, seq_len), generator=torch.Generator().manual_seed(seed + 99))
            hit = (model(x)[:, 1:].argmax(-1) == x[:, :-1]).float()  # hit[:, t-1] is position t
        out["accuracy"][attention] = {f"t in [{a},{b})": round(hit[:, a - 1:b - 1].mean().item(), 4) for a, b in bands}
        print(f"previous-byte probe, {attention}: {out['accuracy'][attention]} (chance {1 / alphabet:.4f})", flush=True)
    return out


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Train the causal ToST LM (tost-austen) on Jane Austen's novels and its "
                    "softmax GPT twin (same size, same batches); report validation bits per byte.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    C.add_run_arguments(ap, name="tost-austen", work_dir="build/train-runs/lm",
                        curve_help="write the loss curves here (PNG)")
    ap.add_argument("--corpus-dir", default=C.JANEAUSTENR_DIR, help="installed janeaustenr package")
    ap.add_argument("--val-fraction", type=float, default=0.05, help="tail of each novel held out")
    ap.add_argument("--tokenizer", choices=("bpe", "byte"), default="bpe",
                    help="byte-level BPE learned on the training split, or bytes alone")
    ap.add_argument("--vocab-size", type=int, default=2048,
                    help="BPE vocabulary: 256 bytes + merges + end-of-text")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--context-length", type=int, default=1024, help="positions of wpe and denom_bias")
    ap.add_argument("--mlp-ratio", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024, help="training window (<= context length)")
    ap.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW, betas 0.9/0.95)")
    ap.add_argument("--min-lr", type=float, default=2e-4, help="cosine floor")
    ap.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="on matrices; not temp/denom_bias/1-D")
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=100, help="steps between validation points")
    ap.add_argument("--eval-windows", type=int, default=24, help="validation windows per curve point")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop a run early after this (0: never)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probe-steps", type=int, default=0,
                    help="instead of training on the corpus: run the previous-byte probe (both attention "
                         "types, this many steps) and write <work-dir>/probe.json")
    ap.add_argument("--prompt", default="The weather was so fine that",
                    help="prompt of the sample continuation recorded in the provenance")
    args = ap.parse_args(argv)
    if args.seq_len > args.context_length:
        ap.error(f"--seq-len {args.seq_len} exceeds --context-length {args.context_length}")
    C.parse_runs(ap, args)
    return args


def tokenizer_section(tok) -> Dict[str, Any]:
    """config.json's "tokenizer" object for the server (model/config/config.cc)."""
    if isinstance(tok, bpe.Tokenizer):
        return {"type": "bpe", "file": "tokenizer.json", "eos_token_id": tok.eot_id}
    return {"type": "byte", "eos_token_id": tok.eot_id}


def load_run(work_dir: str, attention: str, cfg: R.LMConfig) -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """A finished run from ``work_dir/<attention>/`` (its weights and metrics.json)."""
    sd, metrics = C.read_run(work_dir, attention, cfg.to_dict())
    model = build(attention, cfg, 0)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model.load_state_dict(sd, strict=True)
    return model.eval(), metrics


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    C.single_thread()
    t_start = time.time()
    if args.probe_steps:
        probe = previous_byte_probe(args.probe_steps, args.seed)
        os.makedirs(args.work_dir, exist_ok=True)
        with open(os.path.join(args.work_dir, "probe.json"), "w", encoding="utf-8") as f:
            json.dump(probe, f, indent=1)
            f.write("\n")
        return 0
    texts, data_prov = C.load_austen(args.corpus_dir)
    train_texts, val_texts, split_info = split_texts(texts, args.val_fraction)
    tok = make_tokenizer(args, train_texts)
    train, val = token_streams(tok, train_texts, val_texts)
    byte_len = token_byte_lengths(tok)
    windows, starts = val_windows(val, args.seq_len)
    mask = window_masks(starts, args.seq_len)
    baselines = ngram_baselines(train, val, byte_len)
    print(f"corpus: {len(train)} training tokens, {len(val)} validation tokens "
          f"({len(windows)} windows of {args.seq_len}); unigram {baselines['unigram_bpb']:.3f}, "
          f"bigram {baselines['bigram_bpb']:.3f} bits/byte", flush=True)
    cfg = R.LMConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                     context_length=args.context_length, vocab_size=tok.vocab_size, bias=False, mlp_ratio=args.mlp_ratio)
    training = {
        "script": "tools/train_lm.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "seed": args.seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "tokenizer": args.tokenizer if args.tokenizer == "byte" else
        f"byte-level BPE (tools/bpe.py, tost-bpe-v1), vocabulary {tok.vocab_size}, merges learned on the training split",
        "optimizer": f"AdamW(betas 0.9/0.95, weight_decay {args.weight_decay} on matrices except temp, "
                     f"denom_bias), grad clip {args.grad_clip}",
        "lr_schedule": f"linear warmup {args.warmup} steps to {args.lr}, cosine to {args.min_lr}",
        "loss": "cross-entropy over all positions of random training windows (same windows for every run)",
        **C.environment_provenance(),
    }
    split = {
        "rule": f"last {args.val_fraction:.0%} of each novel (from the first line break after the cut) "
                f"is validation, the rest training; novels separated by end-of-text ({tok.eot_id})",
        "train_tokens": len(train), "val_tokens": len(val), "per_novel": split_info,
        "bytes_per_token": {"train": round(float(byte_len[train].sum()) / len(train), 4),
                            "val": round(float(byte_len[val].sum()) / len(val), 4)},
    }

    for attention in args.runs:
        model, metrics = train_one(attention, cfg, train, windows, mask, byte_len, args)
        metrics["sample"] = sample(model, tok, args.prompt, 60, temperature=0.8, top_k=40, seed=args.seed)
        metrics["sample_prompt"] = args.prompt
        metrics["config"] = cfg.to_dict()
        metrics["training"] = training
        print(f"{attention} sample: {metrics['sample']!r}", flush=True)
        C.save_run(args.work_dir, attention, model, metrics, skip=("lm_head.weight",))  # tied to wte

    # Report on every finished run in the work directory (runs may be trained by separate,
    # concurrent invocations: each is single-threaded).
    results: Dict[str, Dict[str, Any]] = {}
    models: Dict[str, torch.nn.Module] = {}
    for attention in C.finished_runs(args.work_dir):
        models[attention], results[attention] = load_run(args.work_dir, attention, cfg)
    comparison: Dict[str, Any] = {}
    if "tost" in results and "softmax" in results:
        t, s = results["tost"], results["softmax"]
        if t["tokens_seen"] != s["tokens_seen"]:
            print(f"warning: unequal budgets: tost {t['tokens_seen']} tokens, softmax {s['tokens_seen']}")
        comparison = {"tost_val_bpb": t["val_bpb"], "softmax_val_bpb": s["val_bpb"],
                      "relative_gap": t["val_bpb"] / s["val_bpb"] - 1.0}
        print(f"ToST {t['val_bpb']:.4f} vs softmax {s['val_bpb']:.4f} bits/byte: ToST is "
              f"{100 * comparison['relative_gap']:+.1f}% (unigram {baselines['unigram_bpb']:.3f}, "
              f"bigram {baselines['bigram_bpb']:.3f})", flush=True)
    with open(os.path.join(args.work_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump({"config": cfg.to_dict(), "data": data_prov, "split": split, "baselines": baselines,
                   "runs": {a: {k: v for k, v in r.items() if not k.startswith("curve")} for a, r in results.items()},
                   "comparison": comparison}, f, indent=1)
        f.write("\n")

    if args.curve_png and results:
        labels = {"tost": "ToST (TSSA)", "softmax": "softmax twin"}
        r0 = next(iter(results.values()))["training"]
        C.plot_curves(
            args.curve_png,
            {labels[a]: {"train": r["curve_train_bpb"], "val": r["curve_val_bpb_subset"]} for a, r in results.items()},
            title=f"Austen LM ({args.tokenizer} {tok.vocab_size}): {cfg.n_layer} layers x {cfg.n_embd}, "
                  f"{r0['batch_size']}x{r0['seq_len']} tokens/step (bigram {baselines['bigram_bpb']:.2f} bits/byte)",
            ylabel="bits per byte", ylim=(1.0, 5.0))
        print(f"wrote {args.curve_png}")

    if args.out:
        if "tost" not in results:
            raise SystemExit(f"--out: no finished ToST run in {args.work_dir}")
        tost = results["tost"]
        twin = results.get("softmax")
        provenance = {
            "kind": "trained",
            "data": data_prov,
            "split": split,
            "training": tost["training"],
            "metrics": {
                "val_bpb": tost["val_bpb"],
                "steps": tost["steps"],
                "tokens_seen": tost["tokens_seen"],
                "train_seconds": tost["train_seconds"],
                "parameters": tost["parameters"],
                "baselines": baselines,
                "softmax_twin": None if twin is None else {
                    "val_bpb": twin["val_bpb"], "parameters": twin["parameters"],
                    "steps": twin["steps"], "tokens_seen": twin["tokens_seen"],
                    "train_seconds": twin["train_seconds"], "relative_gap": comparison["relative_gap"],
                    "architecture": "same skeleton and widths, nanoGPT causal softmax attention"},
            },
            "sample": {"prompt": tost["sample_prompt"], "temperature": 0.8, "top_k": 40,
                       "seed": tost["training"]["seed"], "text": tost["sample"]},
        }
        config = R.make_config(args.name, cfg, version=time.strftime("%Y%m%d") + "-austen", trained=True,
                               provenance=provenance, tokenizer=tokenizer_section(tok))
        d = os.path.join(args.out, args.name)
        R.save_model(models["tost"], config, d)
        if isinstance(tok, bpe.Tokenizer):
            tok.save(os.path.join(d, "tokenizer.json"))
        reloaded, _ = R.load_model(d)
        check = evaluate_bpb(reloaded, windows[:4], mask[:4], byte_len)
        direct = evaluate_bpb(models["tost"], windows[:4], mask[:4], byte_len)
        if abs(check - direct) > 1e-6:
            raise RuntimeError(f"{d}: reloaded model gives {check} bits/byte, trained model {direct}")
        size = os.path.getsize(os.path.join(d, "model.safetensors"))
        print(f"exported {d} ({size / 1e6:.2f} MB); reload check {check:.4f} bits/byte on 4 windows")
    print(f"done in {(time.time() - t_start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
