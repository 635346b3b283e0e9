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
  * validate: load the result with tools/tost_reference.load_model and check it reproduces the
    official weights' outputs on a random input.

Subcommand ``fixtures`` writes randomly initialised official-layout checkpoints, converts them and
stores the reference outputs of the converted models (tests/model/converted_parity_test.cc).

Usage:
  python tools/convert_official.py convert CKPT --out models --name tost-s12 [--ema] [--labels FILE]
  python tools/convert_official.py fixtures --out DIR
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
            ) -> Tuple[nn.Module, Dict[str, Any], Dict[str, torch.Tensor]]:
    """Checkpoint object -> (reference model holding the weights, config dict, official state_dict).

    The returned model is built from our config and loaded strictly from the official tensors,
    so a key or shape that does not match the official layout is an error here.
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
            # The official models use GPT-2 BPE (tiktoken "gpt2": 50257 ids, end-of-text 50256,
            # vocab padded to 50304); smaller vocabularies are byte-level ones like ours.
            tokenizer = ({"type": "gpt2", "eos_token_id": 50256} if cfg.vocab_size >= 50257
                         else {"type": "byte", "eos_token_id": 256})
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


def write_converted(model: nn.Module, config: Dict[str, Any], sd: Dict[str, torch.Tensor], out_dir: str) -> None:
    """Write model_dir, then validate it by loading with the reference and comparing outputs."""
    R.save_model(model, config, out_dir, keep_num_batches_tracked=any(k.endswith("num_batches_tracked") for k in sd))
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
        ckpt = load_checkpoint(args.checkpoint, args.unsafe_pickle)
        model, config, sd = convert(ckpt, name=args.name, ema=args.ema, image_size=args.image_size,
                                    labels=labels, mean=args.mean, std=args.std,
                                    source=os.path.basename(args.checkpoint))
        d = os.path.join(args.out, args.name)
        write_converted(model, config, sd, d)
    except ConversionError as e:
        print(f"convert_official: {e}", file=sys.stderr)
        return 2
    n = sum(v.numel() for k, v in sd.items() if not k.endswith("num_batches_tracked"))
    print(f"wrote {d}: {config['architecture']}, {len(sd)} tensors, {n / 1e6:.3f}M parameters")
    if config["architecture"] == "tost_lm" and config["tokenizer"]["type"] != "byte":
        print(f"note: tokenizer {config['tokenizer']['type']!r}: tost-serve's text API tokenizes bytes only; "
              "this model loads only where its tokenizer is supported", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
