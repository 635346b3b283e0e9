"""Shared helpers of tools/train_vision.py and tools/train_lm.py.

What lives here and why:
  * data readers for the two corpora the shipped models are trained on, both shipped by packages
    (nothing is downloaded at run time): scikit-learn's handwritten digits, and Jane Austen's six
    novels from Debian's ``r-cran-janeaustenr`` (read from R's lazy-load database with a small,
    read-only unserialiser: no R process, no code execution);
  * the softmax-attention twins: the same skeleton as the ToST models with only the attention
    operator swapped, so a comparison measures the operator and nothing else;
  * the optimiser recipe shared by both trainers (AdamW with the official no-decay list, cosine
    schedule with warmup), provenance (package versions, file hashes, git commit), a progress bar
    and loss-curve plots.
"""

from __future__ import annotations

import bz2
import gzip
import argparse
import hashlib
import json
import lzma
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tost_reference as R  # noqa: E402

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def single_thread() -> None:
    """Train on one intra-op thread: the build machines have 2 cores shared with C++ builds, where
    extra threads mostly spin (measured for the parity fixtures: 2.9 s on 1 thread, 14.6 s on 2)."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # allowed once per process, before any parallel work; already set
        pass


# ---------------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------------


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_commit() -> Optional[str]:
    """The commit the training code was at (None outside a git checkout); '+dirty' if modified."""
    try:
        sha = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--", "tools"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def debian_package_version(package: str) -> Optional[str]:
    """Installed version of a Debian package, or None when dpkg does not know it."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                             text=True, timeout=10)
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment_provenance() -> Dict[str, Any]:
    return {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "threads": torch.get_num_threads(),
        "git_commit": git_commit(),
    }


# ---------------------------------------------------------------------------------------------
# Progress and plots
# ---------------------------------------------------------------------------------------------


def progress(total: int, desc: str):
    """A tqdm progress bar on stderr. Updates at most every 5 s so a nohup log stays readable."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, mininterval=5.0, dynamic_ncols=True, file=sys.stderr,
                smoothing=0.05)


def plot_curves(path: str, runs: Dict[str, Dict[str, Sequence[Tuple[int, float]]]], *, title: str,
                ylabel: str, xlabel: str = "step", ylim: Optional[Tuple[float, float]] = None,
                secondary: Optional[Dict[str, Sequence[Tuple[int, float]]]] = None,
                secondary_label: str = "") -> None:
    """Loss curves as a PNG. ``runs`` maps a model name to {"train": [(step, v)], "val": [...]}.

    Train curves are drawn thin, validation curves thick with markers, one colour per model.
    ``secondary`` (e.g. validation accuracy) goes on a right-hand axis, dashed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for (name, series), c in zip(runs.items(), colours):
        if series.get("train"):
            s, v = zip(*series["train"])
            ax.plot(s, v, color=c, alpha=0.35, linewidth=1, label=f"{name} train")
        if series.get("val"):
            s, v = zip(*series["val"])
            ax.plot(s, v, color=c, linewidth=2, marker="o", markersize=3, label=f"{name} validation")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if secondary:
        ax2 = ax.twinx()
        for (name, pts), c in zip(secondary.items(), colours):
            s, v = zip(*pts)
            ax2.plot(s, v, color=c, linestyle="--", linewidth=1.5, label=f"{name} {secondary_label}")
        ax2.set_ylabel(secondary_label)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Optimiser recipe
# ---------------------------------------------------------------------------------------------

# Parameters never decayed: the official LM excludes temp and denom_bias (docs/model-semantics.md
# §2.3), XCiT excludes cls_token; norms, biases and layer-scales (all 1-D) are excluded by rank.
NO_DECAY_LEAVES = ("temp", "denom_bias", "cls_token")


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied weights appear once
            continue
        seen.add(id(p))
        leaf = name.rsplit(".", 1)[-1]
        (no_decay if p.dim() < 2 or leaf in NO_DECAY_LEAVES else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def cosine_lr(step: int, total: int, warmup: int, peak: float, floor: float) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then cosine decay to ``floor`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * t))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ---------------------------------------------------------------------------------------------
# Runs: each trainer trains a ToST run and a softmax-twin run, possibly in separate concurrent
# invocations, into <work-dir>/<attention>/; a later invocation reports on and exports them.
# ---------------------------------------------------------------------------------------------

ATTENTIONS = ("tost", "softmax")


def add_run_arguments(ap: argparse.ArgumentParser, name: str, work_dir: str, curve_help: str) -> None:
    """The options both trainers share: where runs go, which to train, what to export."""
    ap.add_argument("--out", default=None, help="model repository to export the ToST model into "
                    "(e.g. models); omitted: nothing is exported")
    ap.add_argument("--name", default=name, help="model name (directory under --out)")
    ap.add_argument("--work-dir", default=work_dir, help="where every run's weights and metrics.json go")
    ap.add_argument("--curve-png", default=None, help=curve_help)
    ap.add_argument("--attention", default="tost,softmax",
                    help="comma-separated runs to train: tost and/or softmax (the twin); empty: train "
                         "nothing, report on and export the finished runs in --work-dir")


def parse_runs(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Sets args.runs from --attention, refusing anything but tost and softmax."""
    args.runs = [a for a in args.attention.split(",") if a]
    if any(a not in ATTENTIONS for a in args.runs):
        ap.error(f"--attention takes tost and/or softmax (or nothing, to report), got {args.attention!r}")


def save_run(work_dir: str, attention: str, model: nn.Module, metrics: Dict[str, Any],
             skip: Sequence[str] = ()) -> None:
    """<work-dir>/<attention>/model.safetensors (all tensors but `skip`) and metrics.json."""
    d = os.path.join(work_dir, attention)
    os.makedirs(d, exist_ok=True)
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if k not in skip}
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"attention": attention})
    with open(os.path.join(d, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=1)
        f.write("\n")


def finished_runs(work_dir: str) -> List[str]:
    """The attention types with a finished run in `work_dir`."""
    return [a for a in ATTENTIONS if os.path.exists(os.path.join(work_dir, a, "metrics.json"))]


def read_run(work_dir: str, attention: str, config: Dict[str, Any]) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """A finished run's weights and metrics; refused when it was trained with another config."""
    d = os.path.join(work_dir, attention)
    with open(os.path.join(d, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    if metrics["config"] != config:
        raise ValueError(f"{d}: trained with {metrics['config']}, this invocation asks for {config}")
    return load_file(os.path.join(d, "model.safetensors")), metrics


class Timer:
    def __init__(self) -> None:
        self.t0 = time.time()

    @property
    def seconds(self) -> float:
        return time.time() - self.t0


# ---------------------------------------------------------------------------------------------
# Softmax-attention twins (only the attention operator differs from the ToST model)
# ---------------------------------------------------------------------------------------------


class SoftmaxAttention(nn.Module):
    """Multi-head softmax self-attention over all tokens (timm ``Attention``, as in the official
    ``vit_cab_*`` baselines): qkv (3D, D) laid out [q | k | v], scale p^-1/2, proj (D, D)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, N, D))


class CausalSoftmaxAttention(nn.Module):
    """nanoGPT ``CausalSelfAttention``: c_attn (3C, C), causal softmax, c_proj (C, C)."""

    def __init__(self, cfg: R.LMConfig):
        super().__init__()
        C = cfg.n_embd
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(C, 3 * C, bias=cfg.bias)
        self.c_proj = nn.Linear(C, C, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def softmax_vision_twin(cfg: R.VisionConfig) -> R.TostVision:
    """A TostVision whose TSSA layers are replaced by softmax attention (the vit_cab skeleton).

    Stem, positional encoding, layer-scales, MLPs, class-attention tail and head are the same
    modules at the same init; attention weights get the same trunc_normal(0.02) init.
    """
    model = R.TostVision(cfg)
    for blk in model.blocks:
        blk.attn = SoftmaxAttention(cfg.embed_dim, cfg.num_heads)
        for lin in (blk.attn.qkv, blk.attn.proj):
            nn.init.trunc_normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)
    return model


def softmax_lm_twin(cfg: R.LMConfig) -> R.TostLM:
    """A TostLM whose causal TSSA layers are replaced by nanoGPT causal softmax attention.

    Embeddings, layer-scales (γ, init 1e-5), LayerNorms, MLPs and the tied head are unchanged; the
    attention projections get nanoGPT's init (N(0, 0.02); c_proj N(0, 0.02/sqrt(2 n_layer))).
    """
    model = R.TostLM(cfg)
    for blk in model.transformer.h:
        blk.attn = CausalSoftmaxAttention(cfg)
        nn.init.normal_(blk.attn.c_attn.weight, std=0.02)
        nn.init.normal_(blk.attn.c_proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))
        for lin in (blk.attn.c_attn, blk.attn.c_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
    return model


# ---------------------------------------------------------------------------------------------
# Data: scikit-learn digits
# ---------------------------------------------------------------------------------------------


def load_digits() -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
    """scikit-learn's bundled handwritten digits (UCI optdigits test set): images (1797, 8, 8)
    with integer values 0..16 (ink), labels (1797,). Returns (images float32, labels int64, provenance)."""
    import sklearn
    from sklearn import datasets

    d = datasets.load_digits()
    images = torch.tensor(d.images, dtype=torch.float32)
    labels = torch.tensor(d.target, dtype=torch.int64)
    csv = os.path.join(os.path.dirname(datasets.__file__), "data", "digits.csv.gz")
    prov = {
        "dataset": "handwritten digits (UCI ML optdigits, 8x8, 1797 images) bundled with scikit-learn",
        "package": "scikit-learn (PyPI)",
        "package_version": sklearn.__version__,
        "loader": "sklearn.datasets.load_digits()",
        "file_sha256": sha256_file(csv) if os.path.exists(csv) else None,
        "license": "CC BY 4.0 (UCI Machine Learning Repository)",
    }
    return images, labels, prov


# ---------------------------------------------------------------------------------------------
# Data: Jane Austen's novels from Debian's r-cran-janeaustenr (R lazy-load database)
# ---------------------------------------------------------------------------------------------

JANEAUSTENR_DIR = "/usr/lib/R/site-library/janeaustenr"
JANEAUSTENR_PACKAGE = "r-cran-janeaustenr"
AUSTEN_NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
                 "persuasion")  # publication order, 1811-1817; all public domain


class RUnserializeError(ValueError):
    pass


class _RReader:
    """Minimal reader of R's XDR serialisation format (version 2 and 3), enough for the plain
    vectors, lists and pairlists that lazy-load databases of data packages hold.

    Only data types are understood; closures, environments, bytecode and ALTREP objects are refused
    with an error naming the type, so a changed package cannot make us misread it silently.
    """

    NILVALUE, REFSXP, GLOBALENV, UNBOUND, MISSINGARG, BASENAMESPACE, EMPTYENV, BASEENV = (
        254, 255, 253, 252, 251, 247, 242, 241)
    SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19
    NA_INT = -(2 ** 31)

    def __init__(self, data: bytes, what: str):
        self.b = data
        self.i = 0
        self.what = what
        self.refs: List[Any] = []

    def _need(self, n: int) -> None:
        if self.i + n > len(self.b):
            raise RUnserializeError(f"{self.what}: truncated R serialisation at byte {self.i} "
                                    f"(needed {n} more of {len(self.b)})")

    def int(self) -> int:
        self._need(4)
        (v,) = struct.unpack_from(">i", self.b, self.i)
        self.i += 4
        return v

    def raw(self, n: int) -> bytes:
        self._need(n)
        out = self.b[self.i:self.i + n]
        self.i += n
        return out

    def header(self) -> None:
        fmt = self.raw(2)
        if fmt != b"X\n":
            raise RUnserializeError(f"{self.what}: expected XDR serialisation header b'X\\n', got {fmt!r}")
        version = self.int()
        self.int()  # writer R version
        self.int()  # minimal reader R version
        if version == 3:
            self.raw(self.int())  # native encoding name
        elif version != 2:
            raise RUnserializeError(f"{self.what}: serialisation version {version}, expected 2 or 3")

    def item(self) -> Any:
        flags = self.int()
        t = flags & 0xFF
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t in (self.NILVALUE, self.GLOBALENV, self.UNBOUND, self.MISSINGARG, self.BASENAMESPACE,
                 self.EMPTYENV, self.BASEENV):
            return None
        if t == self.REFSXP:
            idx = flags >> 8 if flags >> 8 else self.int()
            return self.refs[idx - 1]
        if t == self.SYMSXP:
            name = self.item()  # a CHARSXP
            self.refs.append(name)
            return name
        if t == self.CHARSXP:
            n = self.int()
            return None if n == -1 else self.raw(n).decode("utf-8")
        if t == self.LISTSXP:  # pairlist: attributes, tag, car, cdr (iterative along cdr)
            out: Dict[str, Any] = {}
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else f"[{len(out)}]"
                out[tag] = self.item()
                flags = self.int()
                t = flags & 0xFF
                if t == self.NILVALUE:
                    return out
                if t != self.LISTSXP:
                    raise RUnserializeError(f"{self.what}: pairlist ends in type {t}, expected NULL")
                has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t in (self.LGLSXP, self.INTSXP):
            n = self.int()
            vals = list(struct.unpack_from(f">{n}i", self.raw(4 * n)))
            value: Any = [None if v == self.NA_INT else v for v in vals]
        elif t == self.REALSXP:
            n = self.int()
            value = list(struct.unpack_from(f">{n}d", self.raw(8 * n)))
        elif t == self.STRSXP:
            n = self.int()
            value = [self.item() for _ in range(n)]
        elif t == self.VECSXP:
            n = self.int()
            value = [self.item() for _ in range(n)]
        else:
            raise RUnserializeError(f"{self.what}: R object of SEXP type {t} is not plain data "
                                    f"(expected a vector, list or pairlist)")
        if has_attr:
            attrs = self.item()
            names = attrs.get("names") if isinstance(attrs, dict) else None
            if t == self.VECSXP and names is not None:
                value = dict(zip(names, value))
        return value


def r_unserialize(data: bytes, what: str = "R data") -> Any:
    """Decode one XDR-serialised R object (character vectors -> list of str, named lists -> dict)."""
    r = _RReader(data, what)
    r.header()
    return r.item()


def _r_decompress(blob: bytes, compressed: Any, what: str) -> bytes:
    """One lazy-load DB record: 4-byte big-endian length, then (type 1) a zlib stream or
    (types 2, 3) a type byte '2' bzip2, 'Z' xz, '0' stored, and the stream."""
    if len(blob) < 5:
        raise RUnserializeError(f"{what}: record of {len(blob)} bytes is too short")
    (n,) = struct.unpack_from(">I", blob, 0)
    level = compressed[0] if isinstance(compressed, list) else compressed
    if level in (True, 1):
        out = zlib.decompress(blob[4:])
    else:
        kind, body = blob[4:5], blob[5:]
        out = {b"1": zlib.decompress, b"2": bz2.decompress, b"Z": lzma.decompress,
               b"0": bytes}.get(kind, lambda _: None)(body)
        if out is None:
            raise RUnserializeError(f"{what}: unknown record compression type {kind!r}")
    if len(out) != n:
        raise RUnserializeError(f"{what}: record decompresses to {len(out)} bytes, header says {n}")
    return out


def read_r_lazyload(filebase: str, names: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """Read variables from an R lazy-load database (``filebase``.rdx index + ``filebase``.rdb).

    The index is a gzip'd serialised list(variables = list(name = c(offset, length)), references,
    compressed); each variable is a compressed, serialised record at its offset in the .rdb file.
    """
    with gzip.open(filebase + ".rdx", "rb") as f:
        index = r_unserialize(f.read(), filebase + ".rdx")
    if not isinstance(index, dict) or "variables" not in index:
        raise RUnserializeError(f"{filebase}.rdx: expected a named list with 'variables', got {type(index).__name__}")
    variables = index["variables"]
    wanted = list(variables) if names is None else list(names)
    out = {}
    with open(filebase + ".rdb", "rb") as f:
        for name in wanted:
            if name not in variables:
                raise KeyError(f"{filebase}: no variable {name!r} (has {sorted(variables)})")
            offset, length = variables[name]
            f.seek(offset)
            blob = f.read(length)
            what = f"{filebase}.rdb[{name}]"
            out[name] = r_unserialize(_r_decompress(blob, index.get("compressed", True), what), what)
    return out


def load_austen(package_dir: str = JANEAUSTENR_DIR) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """Jane Austen's six novels as {name: text} (lines joined with '\\n'), plus provenance.

    The texts come from Project Gutenberg via the janeaustenr R package, which Debian ships as
    ``r-cran-janeaustenr`` (install: apt-get install --no-install-recommends r-cran-janeaustenr).
    """
    base = os.path.join(package_dir, "data", "Rdata")
    if not os.path.exists(base + ".rdx"):
        raise FileNotFoundError(
            f"{base}.rdx not found: the corpus comes from the Debian package {JANEAUSTENR_PACKAGE} "
            f"(apt-get install --no-install-recommends {JANEAUSTENR_PACKAGE}), or pass its directory")
    raw = read_r_lazyload(base, AUSTEN_NOVELS)
    texts = {}
    for name in AUSTEN_NOVELS:
        lines = raw[name]
        if not isinstance(lines, list) or not all(isinstance(s, str) or s is None for s in lines):
            raise RUnserializeError(f"{base}.rdb[{name}]: expected a character vector")
        texts[name] = "\n".join(s or "" for s in lines)
    prov = {
        "corpus": "Jane Austen's six completed novels (Project Gutenberg texts, public domain)",
        "package": f"{JANEAUSTENR_PACKAGE} (Debian)",
        "package_version": debian_package_version(JANEAUSTENR_PACKAGE),
        "files": {os.path.basename(base) + ext: sha256_file(base + ext) for ext in (".rdx", ".rdb")},
        "novels": {n: len(t.encode("utf-8")) for n, t in texts.items()},
        "license": "texts public domain; the janeaustenr package is MIT",
    }
    return texts, prov


# ---------------------------------------------------------------------------------------------
# Small image I/O (grey PNG via Pillow, a matplotlib dependency)
# ---------------------------------------------------------------------------------------------


def save_grey_png(path: str, pixels: torch.Tensor) -> None:
    """Write an (H, W) uint8 tensor as an 8-bit greyscale PNG."""
    from PIL import Image

    if pixels.dtype != torch.uint8 or pixels.dim() != 2:
        raise ValueError(f"{path}: expected an (H, W) uint8 tensor, got {tuple(pixels.shape)} {pixels.dtype}")
    Image.fromarray(pixels.numpy(), mode="L").save(path, optimize=True)


def load_grey_png(path: str) -> torch.Tensor:
    """Read a PNG as an (H, W) uint8 tensor of grey levels."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return torch.from_numpy(np.array(im.convert("L"), copy=True))
