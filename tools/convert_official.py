#!/usr/bin/env python3
"""Convert checkpoints of the official ToST code (RobinWu218/ToST) to our model repository format.

Two layouts are understood (docs/model-semantics.md §3):

  vision  ``torch.save`` dict from ``tost_vision/main.py``: keys ``model``, ``model_ema``,
          ``optimizer``, ``lr_scheduler``, ``epoch``, ``scaler``, ``args`` (an argparse.Namespace).
          ``model`` (or ``model_ema`` with --ema) holds the ``tost_cab_*`` state_dict, BatchNorm of
          the conv stem included.
  lm      ``ckpt.pt`` from ``tost_lang/train.py``: keys ``model`` (the state_dict of the
          ``torch.compile``d module: every key prefixed ``_orig_mod.``), ``model_args``
          (n_layer, n_head, n_embd, block_size, bias, vocab_size, dropout, TSSA), ``optimizer``,
          ``iter_num``, ``best_val_loss``, ``config``.

A bare state_dict (no wrapper) is accepted too. What the conversion does, and only that:
  * unpickle with ``torch.load(weights_only=True)``, allowing argparse.Namespace (the vision
    ``args``); anything else a checkpoint pickles is refused unless --unsafe-pickle is given
    (full unpickling runs code: only for files you trust);
  * strip the ``_orig_mod.`` (torch.compile) and ``module.`` (DistributedDataParallel) prefixes;
  * drop ``lm_head.weight`` after checking it equals ``transformer.wte.weight`` (tied);
  * keep every other tensor as it is, BatchNorm weights, running statistics and
    num_batches_tracked included: tost-serve folds BatchNorm into the stem convolutions when it
    loads the model, so the file stays the official state_dict;
  * write config.json from the checkpoint's own description (vision: the tensors' shapes,
    cross-checked with ``args.model`` when it names a registered model, and ``args.input_size``;
    lm: ``model_args``), and model.safetensors (float32);
  * lm tokenizer: ``gpt2`` with the files of --tokenizer-files (GPT-2's encoder.json + vocab.bpe,
    or a .tiktoken rank file; validated, and copied into the model directory); without them, by
    vocabulary size: below 257 ``none`` (token ids only, no end-of-text), below 50257 ``byte``
    (end-of-text 256), GPT-2 sized (the official 50304) ``none`` with end-of-text 50256. The
    tokenizer object is checked against the server's rules before and after writing
    (check_tokenizer);
  * validate: load the result with tools/tost_reference.load_model and check it reproduces the
    official weights' outputs on a random input.

Subcommand ``fixtures`` writes randomly initialised official-layout checkpoints, converts them and
stores the reference outputs of the converted models (tests/model/converted_parity_test.cc).

Usage:
  python tools/convert_official.py convert CKPT --out models --name tost-s12 [--ema] [--labels FILE]
  python tools/convert_official.py convert ckpt.pt --out models --name tost-lm \
      [--tokenizer-files encoder.json vocab.bpe | --tokenizer-files gpt2.tiktoken]
  python tools/convert_official.py fixtures --out DIR
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tost_reference as R  # noqa: E402

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
PREFIXES = ("_orig_mod.", "module.")

# tost_vision/tost.py registrations (docs/model-semantics.md §1.3): name -> (embed_dim, depth, num_heads).
# Every one exists as _p16 (4-stage stem) and _p8 (3-stage stem).
OFFICIAL_VISION = {
    "tost_cab_tiny_12": (192, 12, 4),
    "tost_cab_small_12": (384, 12, 8),
    "tost_cab_tiny_24": (192, 24, 4),
    "tost_cab_small_24": (384, 24, 8),
    "tost_cab_medium_24": (512, 24, 8),
    "tost_cab_large_24": (768, 24, 16),
}


class ConversionError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def load_checkpoint(path: str, unsafe_pickle: bool = False) -> Dict[str, Any]:
    """Unpickle a checkpoint without running code: weights_only, plus argparse.Namespace."""
    if unsafe_pickle:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError (or RuntimeError wrapping it)
        raise ConversionError(
            f"{path}: cannot be read with torch.load(weights_only=True) (+argparse.Namespace): "
            f"{str(e).splitlines()[0]}. If you trust this file, pass --unsafe-pickle") from e


def strip_prefixes(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out = {}
    for k, v in sd.items():
        name = k
        changed = True
        while changed:
            changed = False
            for p in PREFIXES:
                if name.startswith(p):
                    name, changed = name[len(p):], True
        if name in out:
            raise ConversionError(f"two keys map to {name!r} after stripping {PREFIXES}")
        out[name] = v
    return out


def detect(sd: Dict[str, torch.Tensor]) -> str:
    if "cls_token" in sd and "patch_embed.proj.0.0.weight" in sd:
        return "vision"
    if "transformer.wte.weight" in sd:
        return "lm"
    raise ConversionError("neither a tost_vision state_dict (cls_token, patch_embed.proj.0.0.weight) "
                          f"nor a tost_lang one (transformer.wte.weight); first keys: {sorted(sd)[:5]}")


def _count(sd: Dict[str, torch.Tensor], prefix: str) -> int:
    idx = {int(k[len(prefix):].split(".", 1)[0]) for k in sd if k.startswith(prefix)}
    if idx != set(range(len(idx))):
        raise ConversionError(f"{prefix}N keys are not numbered 0..{len(idx) - 1}: {sorted(idx)}")
    return len(idx)


def vision_config(sd: Dict[str, torch.Tensor], args: Any, image_size: Optional[int]) -> Tuple[R.VisionConfig, Dict[str, Any]]:
    """The architecture from the tensors' shapes, cross-checked with ``args.model``."""
    D = sd["cls_token"].shape[-1]
    # Sequential indices 0, 2, 4, ... are stages; GELUs (no keys) sit between them.
    stage_idx = sorted({int(k.split(".")[2]) for k in sd if k.startswith("patch_embed.proj.")})
    if stage_idx != list(range(0, 2 * len(stage_idx), 2)):
        raise ConversionError(f"stem stages at Sequential indices {stage_idx}, expected 0, 2, 4, ...")
    stages = len(stage_idx)
    in_chans = sd["patch_embed.proj.0.0.weight"].shape[1]
    depth = _count(sd, "blocks.")
    heads = sd["blocks.0.attn.temp"].shape[0]
    hidden = sd["blocks.0.mlp.fc1.weight"].shape[0]
    if hidden % D:
        raise ConversionError(f"blocks.0.mlp.fc1.weight has {hidden} rows, not a multiple of embed_dim {D}")
    mlp_ratio = hidden // D
    num_classes = sd["head.weight"].shape[0]
    cls_layers = _count(sd, "cls_attn_blocks.")
    size = image_size or getattr(args, "input_size", None) or 224
    cfg = R.VisionConfig(embed_dim=D, depth=depth, num_heads=heads, mlp_ratio=mlp_ratio, patch_size=2 ** stages,
                         in_chans=in_chans, num_classes=num_classes, cls_attn_layers=cls_layers,
                         image_height=int(size), image_width=int(size))
    notes: Dict[str, Any] = {}
    name = getattr(args, "model", None)
    if name:
        notes["official_model"] = name
        base, _, patch = name.rpartition("_p")
        if base in OFFICIAL_VISION:
            want = OFFICIAL_VISION[base] + (int(patch),)
            got = (D, depth, heads, cfg.patch_size)
            if want != got:
                raise ConversionError(f"args.model {name!r} means (embed_dim, depth, heads, patch) {want}, "
                                      f"but the tensors say {got}")
        else:
            notes["warning"] = f"args.model {name!r} is not a registered tost_cab model; sizes taken from the tensors"
    return cfg, notes


def lm_config(sd: Dict[str, torch.Tensor], model_args: Optional[Dict[str, Any]]) -> R.LMConfig:
    """The architecture from ``model_args`` (the official GPTConfig), checked against the tensors."""
    wte = sd["transformer.wte.weight"]
    n_layer = _count(sd, "transformer.h.")
    if model_args is None:  # a bare state_dict: everything from the shapes
        model_args = {"n_layer": n_layer, "n_head": sd["transformer.h.0.attn.temp"].shape[0],
                      "n_embd": wte.shape[1], "block_size": sd["transformer.wpe.weight"].shape[0],
                      "bias": "transformer.ln_f.bias" in sd, "vocab_size": wte.shape[0], "TSSA": True}
    if not model_args.get("TSSA", False):
        raise ConversionError(f"model_args.TSSA is {model_args.get('TSSA')!r}: a plain nanoGPT checkpoint, "
                              "not ToST (tost-serve serves only the TSSA model)")
    hidden = sd["transformer.h.0.mlp.c_fc.weight"].shape[0]
    cfg = R.LMConfig(n_layer=int(model_args["n_layer"]), n_head=int(model_args["n_head"]),
                     n_embd=int(model_args["n_embd"]), context_length=int(model_args["block_size"]),
                     vocab_size=int(model_args["vocab_size"]), bias=bool(model_args["bias"]),
                     mlp_ratio=hidden // wte.shape[1])
    if cfg.n_layer != n_layer:
        raise ConversionError(f"model_args.n_layer {cfg.n_layer}, but the state_dict has {n_layer} layers")
    return cfg


# ---------------------------------------------------------------------------------------------
# Tokenizer (language models): what config.json's "tokenizer" may say, and GPT-2's files
# ---------------------------------------------------------------------------------------------

# GPT-2's byte-level BPE, which the official LMs use: 50257 ids, end-of-text last (50256); the
# official vocabulary is padded to 50304 and the server masks the ids past the tokenizer's.
GPT2_IDS = 50257
GPT2_EOT = "<|endoftext|>"
# The byte tokenizer: ids 0-255 are the bytes, end-of-text 256.
BYTE_IDS = 257
# config.json key -> the name the file gets in the model directory.
GPT2_FILE_NAMES = {"encoder_file": "encoder.json", "merges_file": "vocab.bpe", "ranks_file": "gpt2.tiktoken"}
GPT2_FORMS = ({"encoder_file", "merges_file"}, {"ranks_file"})
TIKTOKEN_LINE = re.compile(r"([A-Za-z0-9+/]+={0,2}) ([0-9]+)")
TOKENIZER_FILES_USAGE = "--tokenizer-files takes GPT-2's encoder.json and vocab.bpe, or one *.tiktoken rank file"


@dataclass(frozen=True)
class Gpt2Tokenizer:
    """GPT-2 tokenizer files that passed validation."""
    sources: Dict[str, str]  # config key (GPT2_FILE_NAMES) -> path of the file read
    n_ids: int  # ids the tokenizer produces: encoder entries, or ranks + end-of-text
    eos_token_id: int

    def config(self) -> Dict[str, Any]:
        tok: Dict[str, Any] = {"type": "gpt2"}
        tok.update({key: GPT2_FILE_NAMES[key] for key in GPT2_FILE_NAMES if key in self.sources})
        tok["eos_token_id"] = self.eos_token_id
        return tok


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConversionError(f"{path}: cannot read tokenizer file: {e.strerror}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from e


def _lines(text: str) -> List[Tuple[int, str]]:
    """(line number, line) of the non-empty lines, "\n" or "\r\n" ended, as the server reads them."""
    out = []
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line[:-1] if line.endswith("\r") else line
        if line:
            out.append((lineno, line))
    return out


def gpt2_byte_symbols() -> Dict[int, str]:
    """GPT-2's bytes_to_unicode: the printable character that stands for each byte in encoder.json
    and vocab.bpe (printable Latin-1 bytes stand for themselves, the others from U+0100 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def _check_every_byte(path: str, has_byte) -> None:
    # Byte-level BPE encodes any text only if each single byte is a token; the server checks it too.
    missing = [b for b in range(256) if not has_byte(b)]
    if missing:
        raise ConversionError(f"{path}: no token for the byte {missing[0]} ({len(missing)} bytes missing): "
                              "every byte must encode")


def read_encoder(path: str) -> Dict[str, int]:
    """encoder.json: a JSON object token -> id, ids unique and 0..n-1, "<|endoftext|>" among them."""
    def no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
        obj: Dict[str, Any] = {}
        for k, v in pairs:
            if k in obj:  # json.loads would keep the last silently; the server might not
                raise ConversionError(f"{path}: token {k!r} appears twice")
            obj[k] = v
        return obj

    try:
        enc = json.loads(_read_text(path), object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: not valid JSON ({e}); encoder.json is a JSON object token -> id") from e
    if not isinstance(enc, dict) or not enc:
        raise ConversionError(f"{path}: encoder.json must be a non-empty JSON object token -> id")
    by_id: Dict[int, str] = {}
    for tok, i in enc.items():
        if type(i) is not int:  # bool is an int subclass; JSON true is no id
            raise ConversionError(f"{path}: token {tok!r} maps to {i!r}, not an integer id")
        if i in by_id:
            raise ConversionError(f"{path}: tokens {by_id[i]!r} and {tok!r} share id {i}")
        by_id[i] = tok
    if min(by_id) != 0 or max(by_id) != len(enc) - 1:  # n unique ids in [0, n) are exactly 0..n-1
        raise ConversionError(f"{path}: ids must be 0..{len(enc) - 1}, one per token; "
                              f"they run {min(by_id)}..{max(by_id)}")
    if GPT2_EOT not in enc:
        raise ConversionError(f"{path}: no {GPT2_EOT!r} token (GPT-2's end-of-text)")
    symbols = gpt2_byte_symbols()
    alphabet = set(symbols.values())
    for tok in enc:
        if tok != GPT2_EOT and not set(tok) <= alphabet:
            raise ConversionError(f"{path}: token {tok!r} is not written in GPT-2's bytes-to-unicode alphabet")
    _check_every_byte(path, lambda b: symbols[b] in enc)
    return enc


def check_merges(path: str, encoder: Dict[str, int]) -> int:
    """vocab.bpe: "#version" line, then merges "left right" whose parts and result are all in the
    encoder (a merge producing an unknown token would make encoding fail at serving time)."""
    text = _read_text(path)
    first = text.split("\n", 1)[0]
    if not first.startswith("#version"):
        raise ConversionError(f"{path}: vocab.bpe must start with a '#version' line, got {first[:40]!r}")
    lines = _lines(text)[1:]
    for lineno, line in lines:
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ConversionError(f"{path}:{lineno}: a merge is two tokens separated by one space, got {line!r}")
        for tok in (parts[0], parts[1], parts[0] + parts[1]):
            if tok not in encoder or tok == GPT2_EOT:  # end-of-text is special: never a merge's part
                raise ConversionError(f"{path}:{lineno}: merge {line!r}: {tok!r} is not in the encoder "
                                      "(encoder.json and vocab.bpe must come from the same tokenizer)")
    return len(lines)


def read_ranks(path: str) -> int:
    """A tiktoken rank file: lines "base64 rank", tokens and ranks unique, ranks 0..n-1. Returns n."""
    ranks: Dict[int, int] = {}
    tokens: Dict[bytes, int] = {}
    for lineno, line in _lines(_read_text(path)):
        m = TIKTOKEN_LINE.fullmatch(line)
        if not m:
            raise ConversionError(f"{path}:{lineno}: expected 'base64 rank', got {line[:60]!r}")
        try:
            tok = base64.b64decode(m[1], validate=True)
        except binascii.Error as e:
            raise ConversionError(f"{path}:{lineno}: {m[1]!r} is not valid base64 ({e})") from e
        rank = int(m[2])
        if rank in ranks:
            raise ConversionError(f"{path}:{lineno}: rank {rank} also on line {ranks[rank]}")
        if tok in tokens:
            raise ConversionError(f"{path}:{lineno}: token {tok!r} also on line {tokens[tok]}")
        ranks[rank], tokens[tok] = lineno, lineno
    if not ranks:
        raise ConversionError(f"{path}: no ranks")
    if max(ranks) != len(ranks) - 1:  # n unique ranks >= 0 with maximum n-1 are exactly 0..n-1
        raise ConversionError(f"{path}: ranks must be 0..{len(ranks) - 1}, one per line; the largest is {max(ranks)}")
    _check_every_byte(path, lambda b: bytes([b]) in tokens)
    return len(ranks)


def read_gpt2(sources: Dict[str, str]) -> Gpt2Tokenizer:
    """Validate one of GPT-2's two file forms; ``sources`` maps config keys to paths."""
    if set(sources) == {"encoder_file", "merges_file"}:
        encoder = read_encoder(sources["encoder_file"])
        check_merges(sources["merges_file"], encoder)
        return Gpt2Tokenizer(dict(sources), len(encoder), encoder[GPT2_EOT])
    if set(sources) == {"ranks_file"}:
        n = read_ranks(sources["ranks_file"])
        return Gpt2Tokenizer(dict(sources), n + 1, n)  # end-of-text follows the ranks
    got = ", ".join(f"{path} ({GPT2_FILE_NAMES[key]})" for key, path in sources.items())
    raise ConversionError(f"{TOKENIZER_FILES_USAGE}; got {got}")


def tokenizer_file_kind(path: str) -> str:
    """Which GPT-2 file ``path`` is (its config key): by its name's extension, else by its first line."""
    name = os.path.basename(path).lower()
    for key, ext in (("encoder_file", ".json"), ("merges_file", ".bpe"), ("ranks_file", ".tiktoken")):
        if name.endswith(ext):
            return key
    text = _read_text(path)
    first = text.split("\n", 1)[0]
    if text.lstrip().startswith("{"):
        return "encoder_file"
    if first.startswith("#version"):
        return "merges_file"
    if TIKTOKEN_LINE.fullmatch(first):
        return "ranks_file"
    raise ConversionError(f"{path}: not a GPT-2 tokenizer file: expected encoder.json (JSON object token -> id), "
                          "vocab.bpe ('#version' line, then merges) or a *.tiktoken rank file ('base64 rank' lines)")


def read_tokenizer_files(paths: List[str]) -> Gpt2Tokenizer:
    """--tokenizer-files: recognise each file, then validate the set as one GPT-2 tokenizer."""
    sources: Dict[str, str] = {}
    for path in paths:
        key = tokenizer_file_kind(path)
        if key in sources:
            raise ConversionError(f"{TOKENIZER_FILES_USAGE}; got two {GPT2_FILE_NAMES[key]} files: "
                                  f"{sources[key]} and {path}")
        sources[key] = path
    return read_gpt2(sources)


def lm_tokenizer(vocab_size: int, gpt2: Optional[Gpt2Tokenizer] = None) -> Dict[str, Any]:
    """The tokenizer object for an LM of this vocabulary, with GPT-2's files when given."""
    if gpt2 is not None:
        if vocab_size < gpt2.n_ids:
            raise ConversionError(f"the model's vocab_size {vocab_size} is smaller than the tokenizer's "
                                  f"{gpt2.n_ids} ids: these tokenizer files do not belong to this model")
        return gpt2.config()
    if vocab_size < BYTE_IDS:  # no room for 256 bytes and end-of-text: token ids only
        return {"type": "none", "eos_token_id": -1}
    if vocab_size < GPT2_IDS:
        return {"type": "byte", "eos_token_id": 256}
    # GPT-2 sized but no files to tokenize with: serve token ids, end generation at GPT-2's end-of-text.
    return {"type": "none", "eos_token_id": GPT2_IDS - 1}


def _plain_name(name: Any) -> bool:
    """A file name inside the model directory: a config must not make the server read elsewhere."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def check_tokenizer(tok: Any, vocab_size: int, gpt2: Optional[Gpt2Tokenizer] = None) -> None:
    """The server's rules for a tost_lm config.json "tokenizer" (docs/model-repository.md), in one
    place: the converter checks what it will write, and what it wrote, so that it never leaves a
    configuration the server refuses. ``gpt2``: the validated files a "gpt2" object names."""
    def bad(why: str) -> ConversionError:
        return ConversionError(f"tokenizer {json.dumps(tok)} with vocab_size {vocab_size}: {why}")

    if not isinstance(tok, dict):
        raise bad("must be a JSON object")
    kind = tok.get("type", "byte")
    eos = tok.get("eos_token_id")
    if type(eos) is not int:
        raise bad("eos_token_id must be an integer")
    if kind in ("byte", "bpe"):
        if vocab_size < BYTE_IDS:
            raise bad(f"{kind} needs vocab_size >= {BYTE_IDS} (256 bytes and end-of-text)")
        if not 256 <= eos < vocab_size:
            raise bad(f"eos_token_id must be a special id in [256, {vocab_size})")
        if kind == "bpe" and not _plain_name(tok.get("file", "tokenizer.json")):
            raise bad("file must be a file name inside the model directory")
    elif kind == "gpt2":
        keys = {k for k in GPT2_FILE_NAMES if k in tok}
        if keys not in GPT2_FORMS:
            raise bad("gpt2 names encoder_file and merges_file, or ranks_file")
        if not all(_plain_name(tok[k]) for k in keys):
            raise bad("file names must be plain names inside the model directory")
        if gpt2 is None or set(gpt2.sources) != keys:
            raise bad("the tokenizer files were not read")
        if vocab_size < gpt2.n_ids:
            raise bad(f"vocab_size must be >= the tokenizer's {gpt2.n_ids} ids")
        if not 256 <= eos < vocab_size:
            raise bad(f"eos_token_id must be in [256, {vocab_size}) for gpt2 (the 256 bytes come first)")
        if eos != gpt2.eos_token_id:
            raise bad(f"eos_token_id must be the tokenizer's end-of-text id {gpt2.eos_token_id}")
    elif kind == "none":
        if eos != -1 and not 0 <= eos < vocab_size:
            raise bad(f"eos_token_id must be -1 (none) or in [0, {vocab_size})")
    else:
        raise bad('type must be "byte", "bpe", "gpt2" or "none"')


def check_written_tokenizer(model_dir: str) -> None:
    """check_tokenizer on a written model directory: its config.json and the files it names."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    tok = config.get("tokenizer")
    gpt2 = None
    if isinstance(tok, dict) and tok.get("type") == "gpt2":
        names = {k: tok[k] for k in GPT2_FILE_NAMES if k in tok}
        if set(names) in GPT2_FORMS and all(_plain_name(n) for n in names.values()):
            gpt2 = read_gpt2({k: os.path.join(model_dir, n) for k, n in names.items()})
    check_tokenizer(tok, config["lm"]["vocab_size"], gpt2)


def tokenizer_note(config: Dict[str, Any]) -> Optional[str]:
    """What a user should know about the tokenizer written (type none: no text prompts)."""
    tok = config.get("tokenizer")
    if config["architecture"] != "tost_lm" or tok["type"] != "none":
        return None
    if tok["eos_token_id"] == -1:
        return (f"vocab_size {config['lm']['vocab_size']} is below the byte tokenizer's {BYTE_IDS} ids: written "
                "with tokenizer type 'none' and no end-of-text id; token-id prompts (prompt_tokens) only, "
                "and output is token ids")
    return ("GPT-2 sized vocabulary without tokenizer files: written with tokenizer type 'none' (token-id "
            f"prompts and output only, end-of-text {tok['eos_token_id']}); for text prompts convert again with "
            "--tokenizer-files encoder.json vocab.bpe (or gpt2.tiktoken)")


# ---------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------


def _check_against_contract(config: Dict[str, Any], sd: Dict[str, torch.Tensor]) -> None:
    expected = R.expected_tensor_names(config)
    problems = []
    for k, shape in expected.items():
        if k not in sd:
            problems.append(f"missing {k} {shape}")
        elif tuple(sd[k].shape) != shape:
            problems.append(f"{k}: shape {tuple(sd[k].shape)}, expected {shape}")
    for k in sd:
        if k not in expected and not (k.endswith(".num_batches_tracked") and k.startswith("patch_embed.")):
            problems.append(f"unexpected {k}")
    if problems:
        raise ConversionError(f"state_dict does not match the {config['architecture']} layout: " + "; ".join(problems))


def convert(ckpt: Any, *, name: str, ema: bool = False, image_size: Optional[int] = None,
            labels: Optional[List[str]] = None, mean: Optional[List[float]] = None,
            std: Optional[List[float]] = None, source: str = "", tokenizer: Optional[Dict[str, Any]] = None,
            gpt2: Optional[Gpt2Tokenizer] = None) -> Tuple[nn.Module, Dict[str, Any], Dict[str, torch.Tensor]]:
    """Checkpoint object -> (reference model holding the weights, config dict, official state_dict).

    The returned model is built from our config and loaded strictly from the official tensors,
    so a key or shape that does not match the official layout is an error here. ``gpt2``: validated
    tokenizer files (read_tokenizer_files) for an LM; write_converted copies them.
    """
    wrapped = isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict)
    if ema:
        if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model_ema"), dict)):
            raise ConversionError("--ema: the checkpoint has no 'model_ema' state_dict")
        raw = ckpt["model_ema"]
    else:
        raw = ckpt["model"] if wrapped else ckpt
    if not isinstance(raw, dict) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        raise ConversionError("expected a state_dict of tensors (under 'model' or at the top level)")
    sd = strip_prefixes(raw)
    kind = detect(sd)
    if gpt2 is not None and kind != "lm":
        raise ConversionError("--tokenizer-files is for language-model checkpoints; this one is a vision model")
    provenance: Dict[str, Any] = {
        "kind": "converted",
        "script": "tools/convert_official.py",
        "source": source,
        "source_layout": f"official {'tost_vision/main.py' if kind == 'vision' else 'tost_lang/train.py'} checkpoint",
        "state_dict": "model_ema" if ema else ("model" if wrapped else "top level"),
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if kind == "vision":
        args = ckpt.get("args") if wrapped else None
        cfg, notes = vision_config(sd, args, image_size)
        provenance.update(notes)
        if wrapped and "epoch" in ckpt:
            provenance["epoch"] = int(ckpt["epoch"])
        n_cls = cfg.num_classes
        if labels is not None and len(labels) != n_cls:
            raise ConversionError(f"{len(labels)} labels given for {n_cls} classes")
        config = R.make_config(name, cfg, version="converted", trained=True, provenance=provenance,
                               labels=labels, preprocess={"mean": mean or IMAGENET_MEAN[:cfg.in_chans],
                                                          "std": std or IMAGENET_STD[:cfg.in_chans]})
        model: nn.Module = R.TostVision(cfg)
    else:
        model_args = ckpt.get("model_args") if wrapped else None
        cfg = lm_config(sd, model_args)
        if "lm_head.weight" in sd:
            if not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"]):
                raise ConversionError("lm_head.weight differs from transformer.wte.weight: the official model "
                                      "ties them, and so does the repository format")
            del sd["lm_head.weight"]
        for key in ("iter_num", "best_val_loss"):
            if wrapped and key in ckpt:
                v = ckpt[key]
                provenance[key] = v.item() if isinstance(v, torch.Tensor) else v
        if tokenizer is None:
            tokenizer = lm_tokenizer(cfg.vocab_size, gpt2)
        check_tokenizer(tokenizer, cfg.vocab_size, gpt2)  # before anything is written
        config = R.make_config(name, cfg, version="converted", trained=True, provenance=provenance,
                               tokenizer=tokenizer)
        model = R.TostLM(cfg)
    _check_against_contract(config, sd)
    full = dict(sd)
    if kind == "lm":
        full["lm_head.weight"] = full["transformer.wte.weight"]
    else:  # num_batches_tracked is optional in the official layout as in ours
        for k, v in model.state_dict().items():
            if k.endswith("num_batches_tracked") and k not in full:
                full[k] = v
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in full.items()}, strict=True)
    return model.eval(), config, sd


def copy_tokenizer_files(gpt2: Gpt2Tokenizer, out_dir: str) -> None:
    for key, src in gpt2.sources.items():
        dst = os.path.join(out_dir, GPT2_FILE_NAMES[key])
        if not (os.path.exists(dst) and os.path.samefile(src, dst)):
            shutil.copyfile(src, dst)


def write_converted(model: nn.Module, config: Dict[str, Any], sd: Dict[str, torch.Tensor], out_dir: str,
                    gpt2: Optional[Gpt2Tokenizer] = None) -> None:
    """Write model_dir (with the tokenizer files of ``gpt2``), check the tokenizer written, then
    validate the weights by loading with the reference and comparing outputs."""
    R.save_model(model, config, out_dir, keep_num_batches_tracked=any(k.endswith("num_batches_tracked") for k in sd))
    if config["architecture"] == "tost_lm":
        if gpt2 is not None:
            copy_tokenizer_files(gpt2, out_dir)
        try:
            check_written_tokenizer(out_dir)
        except ConversionError:
            # Without config.json the directory is no model: the server skips it instead of refusing it.
            os.remove(os.path.join(out_dir, "config.json"))
            raise
    reloaded, _ = R.load_model(out_dir, torch.float64)
    direct = model.to(torch.float64)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if config["architecture"] == "tost_vision":
            v = direct.cfg
            x = torch.randn(1, v.in_chans, v.image_height, v.image_width, generator=g, dtype=torch.float64)
        else:
            x = torch.randint(0, direct.cfg.vocab_size, (1, min(64, direct.cfg.context_length)), generator=g)
        a, b = direct(x), reloaded(x)
    model.float()
    if not torch.equal(a, b):
        raise ConversionError(f"{out_dir}: the written model's outputs differ from the checkpoint's "
                              f"(max abs diff {(a - b).abs().max().item():.3g})")


# ---------------------------------------------------------------------------------------------
# Official-layout test checkpoints (key lists of docs/model-semantics.md §3, written out
# independently of tools/tost_reference.py so that a wrong key there is caught too)
# ---------------------------------------------------------------------------------------------


def official_vision_state_dict(D: int, depth: int, K: int, patch: int, in_chans: int, num_classes: int,
                               seed: int, mlp_ratio: int = 4, cls_layers: int = 2) -> Dict[str, torch.Tensor]:
    """A randomly initialised tost_cab_* state_dict at scales that keep activations O(1) and every
    parameter away from its init (γ, temp, BatchNorm statistics), BatchNorm num_batches_tracked included."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s, std=1.0: torch.randn(*s, generator=g) * std  # noqa: E731
    ru = lambda lo, hi, *s: torch.rand(*s, generator=g) * (hi - lo) + lo  # noqa: E731
    sd: Dict[str, torch.Tensor] = {"cls_token": rn(1, 1, D)}
    S = int(math.log2(patch))
    c_prev = in_chans
    for i in range(S):
        c = D // 2 ** (S - 1 - i)
        p = f"patch_embed.proj.{2 * i}."
        sd[p + "0.weight"] = rn(c, c_prev, 3, 3, std=1 / math.sqrt(9 * c_prev))
        sd[p + "1.weight"], sd[p + "1.bias"] = ru(0.5, 1.5, c), rn(c, std=0.2)
        sd[p + "1.running_mean"], sd[p + "1.running_var"] = rn(c, std=0.2), ru(0.5, 2.0, c)
        sd[p + "1.num_batches_tracked"] = torch.tensor(12345, dtype=torch.int64)
        c_prev = c
    H = D * mlp_ratio

    def block(p: str, qkv_out: int) -> None:
        sd[p + "gamma1"], sd[p + "gamma2"] = ru(0.5, 1.5, D), ru(0.5, 1.5, D)
        for n in ("norm1", "norm2"):
            sd[p + n + ".weight"], sd[p + n + ".bias"] = ru(0.7, 1.3, D), rn(D, std=0.1)
        sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"] = rn(qkv_out, D, std=1 / math.sqrt(D)), rn(qkv_out, std=0.5)
        sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"] = rn(H, D, std=1 / math.sqrt(D)), rn(H, std=0.1)
        sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"] = rn(D, H, std=1 / math.sqrt(H)), rn(D, std=0.1)

    for i in range(depth):
        p = f"blocks.{i}."
        block(p, D)
        sd[p + "attn.temp"] = ru(0.5, 3.0, K, 1)
        sd[p + "attn.to_out.0.weight"], sd[p + "attn.to_out.0.bias"] = rn(D, D, std=1 / math.sqrt(D)), rn(D, std=0.1)
    for i in range(cls_layers):
        p = f"cls_attn_blocks.{i}."
        block(p, 3 * D)
        sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"] = rn(D, D, std=1 / math.sqrt(D)), rn(D, std=0.1)
    sd["norm.weight"], sd["norm.bias"] = ru(0.7, 1.3, D), rn(D, std=0.1)
    sd["head.weight"], sd["head.bias"] = rn(num_classes, D, std=1 / math.sqrt(D)), rn(num_classes, std=0.1)
    sd["pos_embeder.token_projection.weight"] = rn(D, 64, 1, 1, std=1 / 8)
    sd["pos_embeder.token_projection.bias"] = rn(D, std=0.1)
    return sd


def official_vision_checkpoint(model_name: str, input_size: int, num_classes: int, seed: int,
                               in_chans: int = 3) -> Dict[str, Any]:
    """What tost_vision/main.py saves: model, model_ema, optimizer, lr_scheduler, epoch, scaler, args."""
    base, _, patch = model_name.rpartition("_p")
    D, depth, K = OFFICIAL_VISION[base]
    model = official_vision_state_dict(D, depth, K, int(patch), in_chans, num_classes, seed)
    ema = {k: (v * 0.5 if v.is_floating_point() and not k.endswith("running_var") else v.clone())
           for k, v in model.items()}
    return {
        "model": model,
        "model_ema": ema,
        "optimizer": {"state": {}, "param_groups": [{"lr": 5e-4, "weight_decay": 0.05, "params": [0, 1]}]},
        "lr_scheduler": {"last_epoch": 7},
        "epoch": 7,
        "scaler": {"scale": 65536.0, "growth_factor": 2.0},
        "args": argparse.Namespace(model=model_name, input_size=input_size, nb_classes=num_classes,
                                   batch_size=128, lr=5e-4, drop_path=0.0, full_crop=True),
    }


def official_lm_checkpoint(n_layer: int, n_head: int, n_embd: int, block_size: int, vocab_size: int,
                           bias: bool, seed: int) -> Dict[str, Any]:
    """What tost_lang/train.py saves: the compiled module's state_dict (``_orig_mod.`` keys, lm_head
    sharing wte's storage), optimizer, model_args, iter_num, best_val_loss, config."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s, std=1.0: torch.randn(*s, generator=g) * std  # noqa: E731
    ru = lambda lo, hi, *s: torch.rand(*s, generator=g) * (hi - lo) + lo  # noqa: E731
    C, K, H = n_embd, n_head, 4 * n_embd
    sd: Dict[str, torch.Tensor] = {"transformer.wte.weight": rn(vocab_size, C, std=0.3),
                                   "transformer.wpe.weight": rn(block_size, C, std=0.3)}

    def lin(name: str, out_f: int, in_f: int) -> None:
        sd[name + ".weight"] = rn(out_f, in_f, std=1 / math.sqrt(in_f))
        if bias:
            sd[name + ".bias"] = rn(out_f, std=0.1)

    def ln(name: str) -> None:
        sd[name + ".weight"] = ru(0.7, 1.3, C)
        if bias:
            sd[name + ".bias"] = rn(C, std=0.1)

    for i in range(n_layer):
        p = f"transformer.h.{i}."
        sd[p + "gamma1"], sd[p + "gamma2"] = ru(0.5, 1.5, C), ru(0.5, 1.5, C)
        ln(p + "ln_1")
        sd[p + "attn.temp"] = ru(0.5, 3.0, K, 1)
        sd[p + "attn.denom_bias"] = rn(K, block_size, 1, std=0.5)
        lin(p + "attn.c_attn", C, C)
        lin(p + "attn.c_proj", C, C)
        ln(p + "ln_2")
        lin(p + "mlp.c_fc", H, C)
        lin(p + "mlp.c_proj", C, H)
    ln("transformer.ln_f")
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied: the same storage, as nanoGPT saves it
    model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                      vocab_size=vocab_size, dropout=0.0, TSSA=True)
    return {
        "model": {"_orig_mod." + k: v for k, v in sd.items()},
        "optimizer": {"state": {}, "param_groups": [{"lr": 6e-4, "params": [0]}]},
        "model_args": model_args,
        "iter_num": 2000,
        "best_val_loss": torch.tensor(3.21),
        "config": {"batch_size": 12, "learning_rate": 6e-4, "dataset": "openwebtext"},
    }


# Cases of the converter fixture. Small enough for a test, official in layout and naming.
FIXTURE_CASES = {
    # tost_cab_tiny_12_p16 (5.77M parameters, 4-stage stem with BatchNorm) at 64x64 = 16 tokens.
    "converted_vision_tiny_p16": dict(kind="vision", model="tost_cab_tiny_12_p16", input_size=64,
                                      num_classes=1000, seed=11, batch=2),
    # byte-level vocabulary so that the server can load it with its byte tokenizer.
    "converted_lm": dict(kind="lm", n_layer=2, n_head=4, n_embd=64, block_size=128, vocab_size=257,
                         bias=False, seed=12, batch=2, seq_len=40),
    "converted_lm_bias": dict(kind="lm", n_layer=1, n_head=4, n_embd=32, block_size=64, vocab_size=260,
                              bias=True, seed=13, batch=1, seq_len=33),
}


def write_fixtures(out: str) -> List[Dict[str, Any]]:
    """For every case: the official checkpoint (official.pt), the converted model directory, and
    fixture.safetensors with the input, the float64 reference output of the converted model
    (``logits``) and a negative control that a faithful loader must NOT match (vision: BatchNorm
    skipped, ``logits_no_bn``; lm: denom_bias ignored, ``logits_no_denom_bias``)."""
    os.makedirs(out, exist_ok=True)
    entries = []
    for case, spec in FIXTURE_CASES.items():
        d = os.path.join(out, case)
        os.makedirs(d, exist_ok=True)
        g = torch.Generator().manual_seed(spec["seed"] + 100)
        if spec["kind"] == "vision":
            ckpt = official_vision_checkpoint(spec["model"], spec["input_size"], spec["num_classes"], spec["seed"])
        else:
            ckpt = official_lm_checkpoint(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["block_size"],
                                          spec["vocab_size"], spec["bias"], spec["seed"])
        ckpt_path = os.path.join(out, f"{case}.official.pt")
        torch.save(ckpt, ckpt_path)
        # Convert from the file, through the same path as the command line.
        model, config, sd = convert(load_checkpoint(ckpt_path), name=case, source=os.path.basename(ckpt_path))
        write_converted(model, config, sd, d)
        ref, _ = R.load_model(d, torch.float64)
        with torch.no_grad():
            if spec["kind"] == "vision":
                v = ref.cfg
                x = torch.randn(spec["batch"], v.in_chans, v.image_height, v.image_width, generator=g)
                logits = ref(x.double())
                for m in ref.modules():
                    if isinstance(m, nn.BatchNorm2d):
                        m.forward = lambda t: t  # negative control: BatchNorm not applied
                wrong = ref(x.double())
                fixture = {"input": x.float(), "logits": logits.float(), "logits_no_bn": wrong.float()}
            else:
                tok = torch.randint(0, spec["vocab_size"], (spec["batch"], spec["seq_len"]), generator=g)
                logits = ref(tok)
                for blk in ref.transformer.h:
                    blk.attn.denom_bias.data.zero_()
                wrong = ref(tok)
                fixture = {"tokens": tok, "logits": logits.float(), "logits_no_denom_bias": wrong.float()}
        fixture_path = os.path.join(d, "fixture.safetensors")
        save_file({k: v.contiguous() for k, v in fixture.items()}, fixture_path,
                  metadata={"generator": f"tools/convert_official.py fixtures case={case}"})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(fixture_path, 0o666 & ~umask)  # safetensors writes 0600; fixtures are shared test data
        scale = logits.abs().max().item()
        entries.append({"case": case, "kind": spec["kind"], "max_abs_logit": scale,
                        "negative_control_rel_diff": (wrong - logits).abs().max().item() / scale,
                        "tensors": len(sd)})
        print(f"{case}: {len(sd)} official tensors -> {d}; |logits| max {scale:.3g}, negative control "
              f"differs by {entries[-1]['negative_control_rel_diff']:.3g} (relative)")
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/convert_official.py fixtures", "cases": entries}, f, indent=2)
        f.write("\n")
    return entries


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


# The server's precision names (model/config/device.cc ParseComputeDtype), long forms to short.
DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
               "fp16": "fp16", "float16": "fp16", "int8": "int8"}


def parse_dtypes(text: str) -> List[str]:
    """--dtypes "fp32,bf16" -> ["fp32", "bf16"]: known names, each once, at least one."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ConversionError(f"--dtypes: expected a comma-separated list of fp32, bf16, fp16, int8, got {text!r}")
    out: List[str] = []
    for n in names:
        if n not in DTYPE_NAMES:
            raise ConversionError(f"--dtypes: expected fp32, bf16, fp16 or int8, got {n!r}")
        if DTYPE_NAMES[n] in out:
            raise ConversionError(f"--dtypes: {DTYPE_NAMES[n]!r} is listed twice in {text!r}")
        out.append(DTYPE_NAMES[n])
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Convert official ToST checkpoints (vision or LM) to the "
                                             "tost-serve model repository format.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert one checkpoint into <out>/<name>/")
    c.add_argument("checkpoint", help="official checkpoint (.pth / ckpt.pt)")
    c.add_argument("--out", required=True, help="model repository directory")
    c.add_argument("--name", required=True, help="model name (directory under --out)")
    c.add_argument("--ema", action="store_true", help="vision: convert model_ema instead of model")
    c.add_argument("--image-size", type=int, default=None,
                   help="vision: served resolution (default: args.input_size of the checkpoint, else 224)")
    c.add_argument("--labels", default=None, help="vision: file with one class label per line")
    c.add_argument("--mean", type=float, nargs="+", default=None, help="vision: preprocess mean (default ImageNet)")
    c.add_argument("--std", type=float, nargs="+", default=None, help="vision: preprocess std (default ImageNet)")
    c.add_argument("--tokenizer-files", nargs="+", metavar="FILE", default=None,
                   help="lm: GPT-2's tokenizer, for text prompts: encoder.json and vocab.bpe, or one *.tiktoken "
                        "rank file; validated and copied into the model directory")
    c.add_argument("--dtypes", default=None, metavar="LIST",
                   help="the precisions the model may be served in, comma-separated (fp32, bf16, fp16, "
                        "int8), written as config.json serving.dtypes: list those whose quality you "
                        "checked (tools/bench/precision_quality.py measures a language model's); the "
                        "server refuses to load the model at any other. Default: none listed, any "
                        "precision is allowed")
    c.add_argument("--unsafe-pickle", action="store_true",
                   help="unpickle without weights_only (runs code from the file: trusted files only)")
    f = sub.add_parser("fixtures", help="write random official-layout checkpoints, their conversions and "
                                        "reference outputs (for tests/model/converted_parity_test.cc)")
    f.add_argument("--out", required=True, help="output directory")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # small models; the build machines' 2 cores are shared
    try:
        if args.cmd == "fixtures":
            write_fixtures(args.out)
            return 0
        labels = None
        if args.labels:
            with open(args.labels, encoding="utf-8") as fh:
                labels = [ln.rstrip("\n") for ln in fh if ln.strip()]
        dtypes = parse_dtypes(args.dtypes) if args.dtypes is not None else None
        # Tokenizer files first: a bad one fails in a second, before the checkpoint is read.
        gpt2 = read_tokenizer_files(args.tokenizer_files) if args.tokenizer_files else None
        ckpt = load_checkpoint(args.checkpoint, args.unsafe_pickle)
        model, config, sd = convert(ckpt, name=args.name, ema=args.ema, image_size=args.image_size,
                                    labels=labels, mean=args.mean, std=args.std,
                                    source=os.path.basename(args.checkpoint), gpt2=gpt2)
        if dtypes is not None:
            config.setdefault("serving", {})["dtypes"] = dtypes
        d = os.path.join(args.out, args.name)
        write_converted(model, config, sd, d, gpt2)
    except ConversionError as e:
        print(f"convert_official: {e}", file=sys.stderr)
        return 2
    n = sum(v.numel() for k, v in sd.items() if not k.endswith("num_batches_tracked"))
    print(f"wrote {d}: {config['architecture']}, {len(sd)} tensors, {n / 1e6:.3f}M parameters")
    note = tokenizer_note(config)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
