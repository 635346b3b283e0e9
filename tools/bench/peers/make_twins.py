#!/usr/bin/env python3
"""Writes the models tools/bench/peers/run_peers.py serves: for each of two ToST language models, a
GPT-2 "twin" with the same dims (layers, width, heads, context, vocabulary) as a Hugging Face
checkpoint (random weights, fixed seed), converted to GGUF for llama-server (f32, f16, q8_0) and to
CTranslate2 (float32, int8); and the ToST model repository tost_server serves.

  bench-lm     tests/bench/generation_bench.cc's BenchConfig: 6 layers, C 384, 6 heads, context
               4096, vocabulary 257 (bytes + end-of-text); the ToST side is written by
               tools/bench/benchlib.py's write_bench_lm (random weights, seed 7).
  tost-austen  models/tost-austen/config.json: 4 layers, C 128, 4 heads, context 1024, vocabulary
               2048; the ToST side is the shipped trained model itself.

Speed depends on the dims, not on the weights' values, so random twins are fair stand-ins. Run with
the scratch venv's Python that tools/bench/peers/setup.sh prints (PEERS_PYTHON): it has
transformers, CTranslate2's converter and llama.cpp's gguf-py.

Usage: make_twins.py --llama-cpp DIR [--out DIR] [--models bench-lm,tost-austen] [--force]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))

GGUF_TYPES = ("f32", "f16", "q8_0")
CT2_TYPES = ("float32", "int8")
EOS = "<|endoftext|>"


def austen_dims() -> Dict[str, int]:
    with open(os.path.join(ROOT, "models", "tost-austen", "config.json")) as f:
        lm = json.load(f)["lm"]
    return {k: lm[k] for k in ("n_layer", "n_head", "n_embd", "context_length", "vocab_size")}


def twin_dims() -> Dict[str, Dict[str, int]]:
    # bench-lm: BenchConfig(quick=false) of tests/bench/generation_bench.cc, as write_bench_lm has it.
    return {"bench-lm": {"n_layer": 6, "n_head": 6, "n_embd": 384, "context_length": 4096, "vocab_size": 257},
            "tost-austen": austen_dims()}


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def ascii_vocab(vocab_size: int) -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    """A GPT-2 style byte-level BPE vocabulary of exactly `vocab_size` tokens, end-of-text last (as
    the ToST models have it): the 128 ASCII bytes, then merges of two ASCII letters/digits. Every
    token is complete ASCII text: llama-server streams a token only once the text so far is complete
    UTF-8, and a random model's greedy output of lone bytes >= 0x80 would never stream. llama.cpp
    also refuses a BPE vocabulary without merges. The benchmark sends token ids, so which strings
    the ids carry does not matter; their count (the output layer's width) does."""
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(128)}
    chars = [alphabet[b] for b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
    merges: List[Tuple[str, str]] = []
    for a in chars:
        for b in chars:
            if len(vocab) >= vocab_size - 1:
                break
            merges.append((a, b))
            vocab[a + b] = len(vocab)
    if len(vocab) != vocab_size - 1 or not merges:
        raise SystemExit(f"expected a vocabulary of 130 to {128 + len(chars) ** 2 + 1} tokens, got {vocab_size}")
    vocab[EOS] = vocab_size - 1
    return vocab, merges


def write_hf_twin(out: str, dims: Dict[str, int], seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    vocab, merges = ascii_vocab(dims["vocab_size"])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    GPT2TokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS).save_pretrained(out)
    eos_id = dims["vocab_size"] - 1
    # n_ctx: the name convert_hf_to_gguf.py reads the context by (older GPT-2 configs had it).
    config = GPT2Config(vocab_size=dims["vocab_size"], n_positions=dims["context_length"], n_ctx=dims["context_length"],
                        n_embd=dims["n_embd"], n_layer=dims["n_layer"], n_head=dims["n_head"],
                        bos_token_id=eos_id, eos_token_id=eos_id)
    torch.manual_seed(seed)
    # GPT-2's own initialisation (normal 0.02), as the ToST models' official one.
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(out, safe_serialization=True)


# convert_hf_to_gguf.py recognises a BPE pre-tokenizer by hashing how it encodes a test string;
# the twin's filler vocabulary matches no known one. Its pre-tokenizer is GPT-2's (ByteLevel), so
# tell the converter so; tokenization never runs in the benchmark anyway (it sends token ids).
GGUF_CONVERT = """
import sys
sys.path.insert(0, sys.argv[1])
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[2:]
convert_hf_to_gguf.main()
"""


def run(argv: List[str]) -> None:
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"command failed ({out.returncode}): {' '.join(argv)}\n{out.stdout[-3000:]}\n"
                         f"{out.stderr[-3000:]}")


def convert(hf: str, twin_dir: str, llama_cpp: str) -> None:
    for t in GGUF_TYPES:
        path = os.path.join(twin_dir, f"gguf-{t}.gguf")
        if not os.path.exists(path):
            run([sys.executable, "-c", GGUF_CONVERT, llama_cpp, hf, "--outtype", t, "--outfile", path + ".part"])
            os.replace(path + ".part", path)
    converter = os.path.join(os.path.dirname(sys.executable), "ct2-transformers-converter")
    for t in CT2_TYPES:
        path = os.path.join(twin_dir, f"ct2-{t}")
        if not os.path.isdir(path):
            run([converter, "--model", hf, "--output_dir", path + ".part", "--quantization", t, "--force"])
            os.replace(path + ".part", path)


def write_tost_repo(repo: str, names: List[str]) -> None:
    """tost_server's model repository: bench-lm as generation_bench writes it, tost-austen shipped."""
    os.makedirs(repo, exist_ok=True)
    if "bench-lm" in names and not os.path.exists(os.path.join(repo, "bench-lm", "config.json")):
        import benchlib

        benchlib.write_bench_lm(repo, "bench-lm", quick=False, seed=7)
    austen = os.path.join(repo, "tost-austen")
    if "tost-austen" in names and not os.path.lexists(austen):
        os.symlink(os.path.join(ROOT, "models", "tost-austen"), austen)


def main() -> None:
    deps = os.environ.get("TOST_DEPS_DIR", "/opt/tost-deps")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (PEERS_LLAMA_CPP of setup.sh)")
    ap.add_argument("--out", default=os.path.join(deps, "peers", "twins"))
    ap.add_argument("--models", default="bench-lm,tost-austen")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--force", action="store_true", help="rewrite what is already there")
    args = ap.parse_args()
    dims = twin_dims()
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in dims]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; expected some of {sorted(dims)}")
    if not os.path.isfile(os.path.join(args.llama_cpp, "convert_hf_to_gguf.py")):
        raise SystemExit(f"expected convert_hf_to_gguf.py in --llama-cpp {args.llama_cpp}")
    for name in names:
        twin_dir = os.path.join(args.out, name)
        if args.force:
            shutil.rmtree(twin_dir, ignore_errors=True)
        hf = os.path.join(twin_dir, "hf")
        if not os.path.exists(os.path.join(hf, "model.safetensors")):
            shutil.rmtree(hf, ignore_errors=True)
            write_hf_twin(hf, dims[name], args.seed)
        convert(hf, twin_dir, args.llama_cpp)
        with open(os.path.join(twin_dir, "dims.json"), "w") as f:
            json.dump(dict(dims[name], architecture="gpt2", seed=args.seed), f, indent=2)
            f.write("\n")
        print(f"{name}: {dims[name]} -> {twin_dir}")
    write_tost_repo(os.path.join(args.out, "tost-repo"), names)
    print(f"tost_server repository: {os.path.join(args.out, 'tost-repo')}")


if __name__ == "__main__":
    main()
