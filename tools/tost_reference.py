"""Plain-PyTorch reference ("oracle") of the two ToST model families tost-serve serves.

Why this file exists: the C++ server re-implements ToST with LibTorch ops and custom kernels. To know
that it is right we need an independent, readable implementation of the *exact* semantics of the
official code (``RobinWu218/ToST``), quirks included, that can run in float64. This module is that
implementation. It follows ``docs/model-semantics.md`` (section numbers below refer to it) and
produces state_dict keys identical to the on-disk contract in
``docs/model-repository.md``, so ``load_state_dict(..., strict=True)`` works on our safetensors files.

Contents
  * ``TostVision`` - XCiT skeleton with TSSA blocks (tost_vision/tost.py, §1).
  * ``TostLM``     - nanoGPT with causal TSSA (tost_lang/model_TSSA.py, §2), parallel ``forward``
                     and a streaming ``step`` form (§2.2) that keeps constant-size state per layer.
  * ``tssa_vision`` / ``tssa_causal`` / ``tssa_causal_step`` - the attention operators as pure
    functions, so tests can compare them with independent transcriptions.
  * ``tssa_variant="token_softmax"`` - a deliberately WRONG operator (softmax over tokens instead of
    over heads, the bug of third-party copies, §6), used to produce negative-control outputs that a
    correct server must NOT match.
  * ``load_model`` / ``save_model`` - our model-repository format (config.json + model.safetensors).

Nothing here is optimised; clarity and fidelity to the official code win over speed. Every module is
built and run in eval mode semantics (dropout rate 0, BatchNorm uses running statistics).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

__all__ = [
    "TSSA_VARIANTS",
    "VisionConfig",
    "LMConfig",
    "TostVision",
    "TostLM",
    "LMState",
    "tssa_vision",
    "tssa_causal",
    "tssa_causal_step",
    "positional_encoding_fourier",
    "make_config",
    "expected_tensor_names",
    "load_model",
    "save_model",
    "set_tssa_variant",
    "collect_gate_stats",
]

FORMAT_VERSION = 1

#: "official" = the semantics of the released code. "token_softmax" = the known third-party bug
#: (softmax of the membership logits over the token axis instead of the head axis); negative control.
TSSA_VARIANTS = ("official", "token_softmax")

# Epsilons of the official code. They are part of the semantics, not tuning knobs.
VISION_NORMALIZE_EPS = 1e-12  # F.normalize eps, clamps the column *norm* (§1.1 step 2)
CAUSAL_S1_CLAMP = 1e-12  # clamp_min on the *squared* prefix sum (§2.1 step 2)
GROUP_SIZE_EPS = 1e-8  # n + 1e-8 in the second-moment denominator (§1.1 step 5, §2.1 step 6)
VISION_LN_EPS = 1e-6  # every LayerNorm of the vision model (§1.2)
VISION_BN_EPS = 1e-5  # BatchNorm of the conv stem (§1.2 step 1)
LM_LN_EPS = 1e-5  # nanoGPT LayerNorm (§2.3)
POSENC_HIDDEN = 32  # PositionalEncodingFourier hidden_dim (§1.2 step 2)
POSENC_TEMPERATURE = 10000.0
POSENC_EPS = 1e-6


def _check_variant(variant: str) -> str:
    if variant not in TSSA_VARIANTS:
        raise ValueError(f"unknown tssa_variant {variant!r}; expected one of {TSSA_VARIANTS}")
    return variant


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


def _hidden(dim: int, mlp_ratio: Union[int, float]) -> int:
    """MLP hidden width R*D as timm/nanoGPT compute it (int truncation)."""
    return int(dim * mlp_ratio)


@dataclass
class VisionConfig:
    """The ``"vision"`` object of config.json (docs/model-repository.md)."""

    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 4
    mlp_ratio: Union[int, float] = 4
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    cls_attn_layers: int = 2
    image_height: int = 224
    image_width: int = 224

    def __post_init__(self) -> None:
        p = self.patch_size
        if p < 2 or p & (p - 1):
            raise ValueError(f"patch_size must be a power of two >= 2, got {p}")
        s = self.stem_stages
        if self.embed_dim % (2 ** (s - 1)):
            raise ValueError(f"embed_dim {self.embed_dim} not divisible by 2^(stages-1) = {2 ** (s - 1)}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} not divisible by num_heads {self.num_heads}")
        for f in ("depth", "num_heads", "in_chans", "num_classes", "image_height", "image_width"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1")
        if self.cls_attn_layers < 0:
            raise ValueError("cls_attn_layers must be >= 0")

    @property
    def stem_stages(self) -> int:
        return int(math.log2(self.patch_size))

    def stem_channels(self) -> List[int]:
        """Output channels of each stem stage: stage i gives D / 2^(S-1-i) (model-repository.md)."""
        s = self.stem_stages
        return [self.embed_dim // 2 ** (s - 1 - i) for i in range(s)]

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "VisionConfig":
        """Accepts either the whole config.json dict or its ``"vision"`` object."""
        if "vision" in d:
            d = d["vision"]
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown vision config fields: {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class LMConfig:
    """The ``"lm"`` object of config.json (docs/model-repository.md)."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    context_length: int = 1024
    vocab_size: int = 257
    bias: bool = False
    mlp_ratio: Union[int, float] = 4

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} not divisible by n_head {self.n_head}")
        for f in ("n_layer", "n_head", "n_embd", "context_length", "vocab_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "LMConfig":
        """Accepts either the whole config.json dict or its ``"lm"`` object."""
        if "lm" in d:
            d = d["lm"]
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown lm config fields: {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# TSSA operators (pure functions)
# ---------------------------------------------------------------------------------------------


def _head_softmax(logits: torch.Tensor, variant: str) -> torch.Tensor:
    """Pi from membership logits of shape (B, K, N).

    official: softmax over dim=1, the HEAD axis - each token gets a distribution over the K groups.
    token_softmax: softmax over dim=-1, the token axis (wrong; negative control only).
    """
    if variant == "official":
        return torch.softmax(logits, dim=1)
    return torch.softmax(logits, dim=-1)


def tssa_vision(
    w: torch.Tensor, temp: torch.Tensor, variant: str = "official"
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Vision TSSA on projected features, §1.1 steps 2-7 (AttentionTSSA.forward).

    Args:
      w:    (B, K, N, p) = qkv(x) split "b n (h d) -> b h n d".
      temp: (K, 1) per-head temperature.
    Returns:
      y (B, K, N, p) before the head merge and ``to_out``; Pi (B, K, N); gate (B, K, 1, p).

    The operations mirror the official code one to one (F.normalize over tokens, matmul for the
    Pi-weighted second moment of the RAW w, gate 1/(1+dots), minus sign) so float64 results agree
    with it to rounding.
    """
    _check_variant(variant)
    w_normed = F.normalize(w, dim=-2, eps=VISION_NORMALIZE_EPS)  # column norm over tokens
    logits = torch.sum(w_normed**2, dim=-1) * temp  # (B, K, N); temp (K,1) broadcasts over N
    pi = _head_softmax(logits, variant)
    n = pi.sum(dim=-1, keepdim=True)  # (B, K, 1) group sizes
    dots = torch.matmul((pi / (n + GROUP_SIZE_EPS)).unsqueeze(-2), w**2)  # (B, K, 1, p)
    gate = 1.0 / (1.0 + dots)
    y = -torch.mul(w.mul(pi.unsqueeze(-1)), gate)
    return y, pi, gate


def tssa_causal(
    w: torch.Tensor, temp: torch.Tensor, denom_bias: torch.Tensor, variant: str = "official"
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal TSSA on projected features, §2.1 steps 2-7 (CausalSelfAttention_TSSA.forward).

    Args:
      w:          (B, K, T, p) = c_attn(x) viewed per head.
      temp:       (K, 1).
      denom_bias: (K, context_length, 1); positions 0..T-1 are used (absolute positions).
    Returns:
      y (B, K, T, p); Pi (B, K, T); gate (B, K, T, p).

    Quirks kept on purpose: the clamp is on the SQUARED prefix sum (vision clamps the norm); the
    "denom_bias" delta is ADDED AFTER the division, once per channel, so it enters the logit as
    p*delta; the second moment uses two prefix sums with +1e-8 on the Pi prefix sum.

    With ``variant="token_softmax"`` Pi is a softmax over all T tokens, which is not even causal -
    that is the point of a negative control.
    """
    _check_variant(variant)
    T = w.shape[-2]
    w_sq = w**2
    denom = torch.cumsum(w_sq, dim=-2).clamp_min(CAUSAL_S1_CLAMP)  # S1
    u = (w_sq / denom) + denom_bias[:, :T, :]
    logits = torch.sum(u, dim=-1) * temp  # (B, K, T)
    pi = _head_softmax(logits, variant)
    dots = torch.cumsum(w_sq * pi.unsqueeze(-1), dim=-2) / (
        torch.cumsum(pi, dim=-1) + GROUP_SIZE_EPS
    ).unsqueeze(-1)
    gate = 1.0 / (1.0 + dots)
    y = -torch.mul(w.mul(pi.unsqueeze(-1)), gate)
    return y, pi, gate


def tssa_causal_step(
    w_t: torch.Tensor,
    s1: torch.Tensor,
    s2: torch.Tensor,
    s3: torch.Tensor,
    pos: int,
    temp: torch.Tensor,
    denom_bias: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token of causal TSSA in recurrent form (§2.2); official variant only.

    Args:
      w_t: (B, K, p) this token's projected features; s1, s2: (B, K, p) running Σw² and ΣΠw²;
      s3: (B, K) running ΣΠ; pos: absolute position of this token (indexes denom_bias).
    Returns:
      y (B, K, p), new s1, s2, s3, Pi (B, K), gate (B, K, p).

    S1 is kept unclamped; the clamp is applied when it is used, exactly like clamp_min on the
    cumsum in the parallel form, so the two forms agree to rounding.
    """
    w_sq = w_t**2
    s1 = s1 + w_sq
    u = w_sq / s1.clamp_min(CAUSAL_S1_CLAMP) + denom_bias[:, pos, :]  # (K,1) broadcasts over (B,K,p)
    logits = torch.sum(u, dim=-1) * temp[:, 0]  # (B, K)
    pi = torch.softmax(logits, dim=1)
    s2 = s2 + w_sq * pi.unsqueeze(-1)
    s3 = s3 + pi
    gate = 1.0 / (1.0 + s2 / (s3 + GROUP_SIZE_EPS).unsqueeze(-1))
    y = -torch.mul(w_t.mul(pi.unsqueeze(-1)), gate)
    return y, s1, s2, s3, pi, gate


# ---------------------------------------------------------------------------------------------
# Shared building blocks
# ---------------------------------------------------------------------------------------------


class Mlp(nn.Module):
    """timm 0.4.12 Mlp: fc1 -> GELU (exact erf) -> fc2, both with bias (keys mlp.fc1/fc2)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()  # approximate="none": exact erf
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _GateRecorder:
    """Mixin: optionally keep the last gate 1/(1+dots) and Pi, for diagnostics (gate statistics)."""

    record_stats: bool = False
    last_gate: Optional[torch.Tensor] = None
    last_pi: Optional[torch.Tensor] = None

    def _record(self, pi: torch.Tensor, gate: torch.Tensor) -> None:
        if self.record_stats:
            self.last_pi = pi.detach()
            self.last_gate = gate.detach()


# ---------------------------------------------------------------------------------------------
# Vision model (tost_vision/tost.py: XCiT skeleton, TSSA blocks, no LPI)
# ---------------------------------------------------------------------------------------------


class AttentionTSSA(nn.Module, _GateRecorder):
    """Keys: qkv.{weight,bias} (D,D), temp (K,1), to_out.0.{weight,bias} (D,D)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, variant: str = "official"):
        super().__init__()
        self.heads = num_heads
        self.variant = _check_variant(variant)
        self.qkv = nn.Linear(dim, dim, bias=qkv_bias)  # the single projection U^T (no q/k/v split)
        self.temp = nn.Parameter(torch.ones(num_heads, 1))
        self.to_out = nn.Sequential(nn.Linear(dim, dim))  # official: Sequential(Linear, Dropout(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        K = self.heads
        w = self.qkv(x).reshape(B, N, K, D // K).permute(0, 2, 1, 3)  # b n (h d) -> b h n d
        y, pi, gate = tssa_vision(w, self.temp, self.variant)
        self._record(pi, gate)
        y = y.permute(0, 2, 1, 3).reshape(B, N, D)  # b h n d -> b n (h d)
        return self.to_out(y)


class TSSABlock(nn.Module):
    """Pre-norm block: x += γ1 ⊙ TSSA(LN1 x); x += γ2 ⊙ MLP(LN2 x). LN eps 1e-6 (§1.2 step 3)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio, eta: float, variant: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=VISION_LN_EPS)
        self.attn = AttentionTSSA(dim, num_heads, qkv_bias=True, variant=variant)
        self.norm2 = nn.LayerNorm(dim, eps=VISION_LN_EPS)
        self.mlp = Mlp(dim, _hidden(dim, mlp_ratio))
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.gamma1 * self.attn(self.norm1(x))
        x = x + self.gamma2 * self.mlp(self.norm2(x))
        return x


class ClassAttention(nn.Module):
    """XCiT/CaiT class attention; only the cls row queries (§1.2 step 5).

    Returns [proj(cls head outputs) ; a_1..a_N]: the patch rows of its INPUT (the LN1 output) are
    passed through unchanged. That is the official behaviour and later steps depend on it.
    Keys: qkv.{weight,bias} (3D,D) laid out [q | k | v], each split into K heads; proj (D,D).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, K, N, p)
        qc = q[:, :, 0:1]  # cls query only
        attn_cls = ((qc * k).sum(dim=-1) * self.scale).softmax(dim=-1)  # over all N keys, cls included
        cls_tkn = (attn_cls.unsqueeze(2) @ v).transpose(1, 2).reshape(B, 1, C)
        cls_tkn = self.proj(cls_tkn)
        return torch.cat([cls_tkn, x[:, 1:]], dim=1)


class ClassAttentionBlock(nn.Module):
    """XCiT ClassAttentionBlock with tokens_norm=True, quirks included (§1.2 step 5):

      x <- x + γ1 ⊙ ClassAttention(LN1 x)   # patch rows: x_j + γ1 ⊙ LN1(x)_j
      x <- LN2(x)                           # over ALL tokens (tokens_norm=True)
      x <- x + [γ2 ⊙ MLP(x_cls) ; x_1..x_N] # patch rows become 2·LN2(x)_j
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio, eta: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=VISION_LN_EPS)
        self.attn = ClassAttention(dim, num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(dim, eps=VISION_LN_EPS)
        self.mlp = Mlp(dim, _hidden(dim, mlp_ratio))
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.gamma1 * self.attn(self.norm1(x))
        x = self.norm2(x)  # tokens_norm=True
        x_res = x
        cls_token = self.gamma2 * self.mlp(x[:, 0:1])
        x = torch.cat([cls_token, x[:, 1:]], dim=1)
        return x_res + x


class ConvPatchEmbed(nn.Module):
    """S = log2(patch) stages of [Conv3x3 s2 p1 no-bias, BatchNorm(eps 1e-5)], GELU between stages.

    Sequential indices: stages at 0, 2, 4, ...; GELUs at 1, 3, ... (keys proj.{2i}.0/1.*).
    """

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        layers: List[nn.Module] = []
        c_prev = cfg.in_chans
        chans = cfg.stem_channels()
        for i, c in enumerate(chans):
            layers.append(
                nn.Sequential(
                    nn.Conv2d(c_prev, c, kernel_size=3, stride=2, padding=1, bias=False),
                    nn.BatchNorm2d(c, eps=VISION_BN_EPS),
                )
            )
            if i < len(chans) - 1:
                layers.append(nn.GELU())
            c_prev = c
        self.proj = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(x)
        Hp, Wp = x.shape[2], x.shape[3]
        return x.flatten(2).transpose(1, 2), (Hp, Wp)  # tokens in row-major (h, w) order


def positional_encoding_fourier(
    Hp: int,
    Wp: int,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device] = None,
    hidden_dim: int = POSENC_HIDDEN,
    temperature: float = POSENC_TEMPERATURE,
) -> torch.Tensor:
    """The 64-channel Fourier features of XCiT's PositionalEncodingFourier, before the 1x1 conv.

    Returns (2*hidden_dim, Hp, Wp): channels [y-part (32) ; x-part (32)], each interleaved
    sin(a_0), cos(a_0), sin(a_1), cos(a_1), ... with a_i = pos / 10000^(2*floor(i/2)/32) and
    pos = idx / (Hp + 1e-6) * 2π for idx = 1..Hp (resolution-relative). The official code computes
    this in float32; here it is computed in ``dtype`` so float64 runs are exact.
    """
    scale = 2 * math.pi
    y_embed = torch.arange(1, Hp + 1, dtype=dtype, device=device)[:, None].expand(Hp, Wp)
    x_embed = torch.arange(1, Wp + 1, dtype=dtype, device=device)[None, :].expand(Hp, Wp)
    y_embed = y_embed / (Hp + POSENC_EPS) * scale
    x_embed = x_embed / (Wp + POSENC_EPS) * scale
    dim_t = torch.arange(hidden_dim, dtype=dtype, device=device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / hidden_dim)
    pos_x = x_embed[:, :, None] / dim_t
    pos_y = y_embed[:, :, None] / dim_t
    pos_x = torch.stack((pos_x[:, :, 0::2].sin(), pos_x[:, :, 1::2].cos()), dim=3).flatten(2)
    pos_y = torch.stack((pos_y[:, :, 0::2].sin(), pos_y[:, :, 1::2].cos()), dim=3).flatten(2)
    return torch.cat((pos_y, pos_x), dim=2).permute(2, 0, 1)


class PositionalEncodingFourier(nn.Module):
    """Fourier features of (Hp, Wp) followed by a 1x1 conv 64 -> D with bias (keys token_projection.*)."""

    def __init__(self, dim: int, hidden_dim: int = POSENC_HIDDEN, temperature: float = POSENC_TEMPERATURE):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.temperature = temperature
        self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)

    def forward(self, B: int, Hp: int, Wp: int) -> torch.Tensor:
        w = self.token_projection.weight
        feats = positional_encoding_fourier(Hp, Wp, w.dtype, w.device, self.hidden_dim, self.temperature)
        pos = self.token_projection(feats.unsqueeze(0))  # (1, D, Hp, Wp)
        return pos.expand(B, -1, -1, -1)


class TostVision(nn.Module):
    """ToST vision classifier (tost_vision/tost.py ``VisionTransformer``), eval semantics (§1.2).

    forward(images (B, in_chans, H, W)) -> logits (B, num_classes). Any H, W work (the model has no
    fixed resolution); all images of a batch share one size, as padding would change the outputs.
    """

    def __init__(self, cfg: Union[VisionConfig, Dict[str, Any]], tssa_variant: str = "official",
                 eta: Optional[float] = None):
        super().__init__()
        if not isinstance(cfg, VisionConfig):
            cfg = VisionConfig.from_dict(cfg)
        self.cfg = cfg
        D, K = cfg.embed_dim, cfg.num_heads
        if eta is None:
            # Official registrations: eta 1.0 for the 12-layer models, 1e-5 for the 24-layer ones.
            eta = 1.0 if cfg.depth <= 12 else 1e-5
        self.patch_embed = ConvPatchEmbed(cfg)
        self.pos_embeder = PositionalEncodingFourier(D)  # (sic) official spelling
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.blocks = nn.ModuleList(
            [TSSABlock(D, K, cfg.mlp_ratio, eta, tssa_variant) for _ in range(cfg.depth)]
        )
        self.cls_attn_blocks = nn.ModuleList(
            [ClassAttentionBlock(D, K, cfg.mlp_ratio, eta) for _ in range(cfg.cls_attn_layers)]
        )
        self.norm = nn.LayerNorm(D, eps=VISION_LN_EPS)
        self.head = nn.Linear(D, cfg.num_classes)
        self.reset_parameters()
        self.eval()

    def reset_parameters(self) -> None:
        """Official init (XCiT): trunc_normal(0.02) for Linear weights and cls_token, zero biases,
        LayerNorm (1, 0). Convs keep PyTorch's default init, BatchNorm (1, 0, mean 0, var 1)."""
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        x, (Hp, Wp) = self.patch_embed(x)
        pos = self.pos_embeder(B, Hp, Wp).reshape(B, -1, x.shape[1]).permute(0, 2, 1)
        x = x + pos  # patch tokens only; cls is appended later
        for blk in self.blocks:
            x = blk(x)
        x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)
        for blk in self.cls_attn_blocks:
            x = blk(x)
        return self.norm(x)[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


# ---------------------------------------------------------------------------------------------
# Causal LM (tost_lang/model_TSSA.py: nanoGPT with CausalSelfAttention_TSSA)
# ---------------------------------------------------------------------------------------------


class CausalSelfAttentionTSSA(nn.Module, _GateRecorder):
    """Keys: c_attn.weight (C,C) (+bias), c_proj.weight (C,C) (+bias), temp (K,1),
    denom_bias (K, context_length, 1)."""

    def __init__(self, cfg: LMConfig, variant: str = "official"):
        super().__init__()
        C, K = cfg.n_embd, cfg.n_head
        self.n_head = K
        self.variant = _check_variant(variant)
        self.c_attn = nn.Linear(C, C, bias=cfg.bias)
        self.c_proj = nn.Linear(C, C, bias=cfg.bias)
        self.temp = nn.Parameter(torch.ones(K, 1))
        self.denom_bias = nn.Parameter(torch.zeros(K, cfg.context_length, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        K = self.n_head
        w = self.c_attn(x).view(B, T, K, C // K).transpose(1, 2)  # (B, K, T, p)
        y, pi, gate = tssa_causal(w, self.temp, self.denom_bias, self.variant)
        self._record(pi, gate)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def step(
        self, x_t: torch.Tensor, state: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], pos: int
    ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """x_t (B, C) post-LN; state (S1 [B,C], S2 [B,C], S3 [B,K]) -> (out [B,C], new state)."""
        if self.variant != "official":
            raise ValueError("the streaming form exists only for the official TSSA")
        B, C = x_t.shape
        K = self.n_head
        s1, s2, s3 = state
        w_t = self.c_attn(x_t).view(B, K, C // K)
        y, s1n, s2n, s3n, pi, gate = tssa_causal_step(
            w_t, s1.view(B, K, C // K), s2.view(B, K, C // K), s3, pos, self.temp, self.denom_bias
        )
        self._record(pi, gate)
        return self.c_proj(y.reshape(B, C)), (s1n.reshape(B, C), s2n.reshape(B, C), s3n)


class LMMlp(nn.Module):
    """nanoGPT MLP: c_fc -> GELU (exact) -> c_proj; biases only when config bias=True."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        h = _hidden(cfg.n_embd, cfg.mlp_ratio)
        self.c_fc = nn.Linear(cfg.n_embd, h, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(h, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class LMBlock(nn.Module):
    """x += γ1 ⊙ TSSA(LN1 x); x += γ2 ⊙ MLP(LN2 x). LN eps 1e-5, weight-only when bias=False."""

    def __init__(self, cfg: LMConfig, variant: str):
        super().__init__()
        C = cfg.n_embd
        self.ln_1 = nn.LayerNorm(C, eps=LM_LN_EPS, bias=cfg.bias)
        self.attn = CausalSelfAttentionTSSA(cfg, variant)
        self.ln_2 = nn.LayerNorm(C, eps=LM_LN_EPS, bias=cfg.bias)
        self.mlp = LMMlp(cfg)
        # The official code hard-codes the layer-scale init at 1e-5 (§2.3).
        self.gamma1 = nn.Parameter(1e-5 * torch.ones(C))
        self.gamma2 = nn.Parameter(1e-5 * torch.ones(C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.gamma1 * self.attn(self.ln_1(x))
        x = x + self.gamma2 * self.mlp(self.ln_2(x))
        return x

    def step(self, x_t: torch.Tensor, state, pos: int):
        a, state = self.attn.step(self.ln_1(x_t), state, pos)
        x_t = x_t + self.gamma1 * a
        x_t = x_t + self.gamma2 * self.mlp(self.ln_2(x_t))
        return x_t, state


@dataclass
class LMState:
    """Streaming state of a TostLM: per layer (S1 [B,C], S2 [B,C], S3 [B,K]) and the next position.

    Its size is independent of the sequence length: 2C + K floats per layer and sequence.
    """

    layers: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    pos: int = 0


class TostLM(nn.Module):
    """ToST causal LM (nanoGPT GPT with TSSA=True), eval semantics (§2).

    forward(tokens (B, T) int64) -> logits (B, T, vocab) for ALL positions (nanoGPT computes only
    the last at inference; the server needs all for prefill and scoring). T <= context_length:
    wpe and denom_bias are indexed by absolute position, so longer inputs have no defined meaning.
    """

    def __init__(self, cfg: Union[LMConfig, Dict[str, Any]], tssa_variant: str = "official"):
        super().__init__()
        if not isinstance(cfg, LMConfig):
            cfg = LMConfig.from_dict(cfg)
        self.cfg = cfg
        C = cfg.n_embd
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, C),
                wpe=nn.Embedding(cfg.context_length, C),
                h=nn.ModuleList([LMBlock(cfg, tssa_variant) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(C, eps=LM_LN_EPS, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(C, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as in nanoGPT
        self.reset_parameters()
        self.eval()

    def reset_parameters(self) -> None:
        """nanoGPT init: Linear/Embedding N(0, 0.02), zero biases, LayerNorm (1, 0), and every
        ``c_proj.weight`` (attention and MLP) N(0, 0.02/sqrt(2·n_layer)). γ, temp, δ keep their
        constructor values (1e-5, 1, 0)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.cfg.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.cfg.context_length:
            raise ValueError(f"sequence length {T} exceeds context_length {self.cfg.context_length}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))

    def init_state(self, batch_size: int) -> LMState:
        """Empty streaming state (all sums zero, position 0) in the model's dtype and device."""
        p = self.lm_head.weight
        C, K = self.cfg.n_embd, self.cfg.n_head
        z = lambda *s: torch.zeros(*s, dtype=p.dtype, device=p.device)  # noqa: E731
        return LMState([(z(batch_size, C), z(batch_size, C), z(batch_size, K)) for _ in range(self.cfg.n_layer)], 0)

    def step(self, tokens: torch.Tensor, state: LMState) -> Tuple[torch.Tensor, LMState]:
        """Feed one token per sequence (tokens (B,) int64) -> (logits (B, vocab), new state).

        Equivalent to forward() on the whole prefix, taking the last position, but with constant
        work and memory per token (§2.2).
        """
        pos = state.pos
        if pos >= self.cfg.context_length:
            raise ValueError(f"position {pos} exceeds context_length {self.cfg.context_length}")
        x = self.transformer.wte(tokens) + self.transformer.wpe.weight[pos]
        new_layers = []
        for blk, st in zip(self.transformer.h, state.layers):
            x, st = blk.step(x, st, pos)
            new_layers.append(st)
        return self.lm_head(self.transformer.ln_f(x)), LMState(new_layers, pos + 1)


# ---------------------------------------------------------------------------------------------
# Utilities
# ---------------------------------------------------------------------------------------------


def set_tssa_variant(model: nn.Module, variant: str) -> None:
    """Switch every TSSA layer of a built model to ``variant`` (weights unchanged)."""
    _check_variant(variant)
    for m in model.modules():
        if isinstance(m, (AttentionTSSA, CausalSelfAttentionTSSA)):
            m.variant = variant


def collect_gate_stats(model: nn.Module, run) -> Dict[str, float]:
    """Run ``run()`` with gate recording on; return min/mean/max of the gate 1/(1+dots) and the
    mean over tokens of max_k Pi (1/K = uniform membership, 1 = hard assignment) over all layers."""
    layers = [m for m in model.modules() if isinstance(m, (AttentionTSSA, CausalSelfAttentionTSSA))]
    for m in layers:
        m.record_stats = True
    try:
        with torch.no_grad():
            run()
        gates = torch.cat([m.last_gate.flatten() for m in layers])
        pimax = torch.cat([m.last_pi.max(dim=1).values.flatten() for m in layers])
    finally:
        for m in layers:
            m.record_stats = False
            m.last_gate = m.last_pi = None
    return {
        "gate_min": gates.min().item(),
        "gate_mean": gates.mean().item(),
        "gate_max": gates.max().item(),
        "pi_max_mean": pimax.mean().item(),
        "pi_max_min": pimax.min().item(),
    }


def make_config(
    name: str,
    arch_cfg: Union[VisionConfig, LMConfig],
    *,
    version: str = "1",
    trained: bool = False,
    provenance: Optional[Dict[str, Any]] = None,
    labels: Optional[Sequence[str]] = None,
    preprocess: Optional[Dict[str, Any]] = None,
    tokenizer: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Build a config.json dict (docs/model-repository.md) for an architecture config."""
    cfg: Dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "version": version,
        "architecture": "tost_vision" if isinstance(arch_cfg, VisionConfig) else "tost_lm",
        "dtype": "float32",
        "trained": trained,
        "provenance": provenance or {},
    }
    if isinstance(arch_cfg, VisionConfig):
        cfg["vision"] = arch_cfg.to_dict()
        if labels is not None:
            if len(labels) != arch_cfg.num_classes:
                raise ValueError(f"{len(labels)} labels for {arch_cfg.num_classes} classes")
            cfg["labels"] = list(labels)
        if preprocess is not None:
            cfg["preprocess"] = preprocess
    else:
        cfg["lm"] = arch_cfg.to_dict()
        cfg["tokenizer"] = tokenizer or {"type": "byte", "eos_token_id": 256}
    return cfg


def build_model(config: Dict[str, Any], tssa_variant: str = "official") -> nn.Module:
    """Instantiate the architecture a config.json dict names (weights at their official init)."""
    arch = config.get("architecture")
    if arch == "tost_vision":
        return TostVision(VisionConfig.from_dict(config["vision"]), tssa_variant)
    if arch == "tost_lm":
        return TostLM(LMConfig.from_dict(config["lm"]), tssa_variant)
    raise ValueError(f"unknown architecture {arch!r}")


def expected_tensor_names(config: Dict[str, Any]) -> Dict[str, Tuple[int, ...]]:
    """Required tensor names and shapes implied by a config (the tables of model-repository.md).

    Optional tensors (``*.num_batches_tracked``, ``lm_head.weight``) are not included.
    """
    out: Dict[str, Tuple[int, ...]] = {}
    if config["architecture"] == "tost_vision":
        v = VisionConfig.from_dict(config["vision"])
        D, K, R = v.embed_dim, v.num_heads, _hidden(v.embed_dim, v.mlp_ratio)
        out["cls_token"] = (1, 1, D)
        c_prev = v.in_chans
        for i, c in enumerate(v.stem_channels()):
            out[f"patch_embed.proj.{2 * i}.0.weight"] = (c, c_prev, 3, 3)
            for s in ("weight", "bias", "running_mean", "running_var"):
                out[f"patch_embed.proj.{2 * i}.1.{s}"] = (c,)
            c_prev = c
        out["pos_embeder.token_projection.weight"] = (D, 2 * POSENC_HIDDEN, 1, 1)
        out["pos_embeder.token_projection.bias"] = (D,)

        def common(pfx: str) -> None:
            for n in ("gamma1", "gamma2", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"):
                out[pfx + n] = (D,)
            out[pfx + "mlp.fc1.weight"], out[pfx + "mlp.fc1.bias"] = (R, D), (R,)
            out[pfx + "mlp.fc2.weight"], out[pfx + "mlp.fc2.bias"] = (D, R), (D,)

        for l in range(v.depth):
            p = f"blocks.{l}."
            common(p)
            out[p + "attn.temp"] = (K, 1)
            out[p + "attn.qkv.weight"], out[p + "attn.qkv.bias"] = (D, D), (D,)
            out[p + "attn.to_out.0.weight"], out[p + "attn.to_out.0.bias"] = (D, D), (D,)
        for c in range(v.cls_attn_layers):
            p = f"cls_attn_blocks.{c}."
            common(p)
            out[p + "attn.qkv.weight"], out[p + "attn.qkv.bias"] = (3 * D, D), (3 * D,)
            out[p + "attn.proj.weight"], out[p + "attn.proj.bias"] = (D, D), (D,)
        out["norm.weight"], out["norm.bias"] = (D,), (D,)
        out["head.weight"], out["head.bias"] = (v.num_classes, D), (v.num_classes,)
    elif config["architecture"] == "tost_lm":
        m = LMConfig.from_dict(config["lm"])
        C, K, R, L = m.n_embd, m.n_head, _hidden(m.n_embd, m.mlp_ratio), m.context_length
        out["transformer.wte.weight"] = (m.vocab_size, C)
        out["transformer.wpe.weight"] = (L, C)

        def lin(name: str, shape: Tuple[int, int]) -> None:
            out[name + ".weight"] = shape
            if m.bias:
                out[name + ".bias"] = (shape[0],)

        def ln(name: str) -> None:
            out[name + ".weight"] = (C,)
            if m.bias:
                out[name + ".bias"] = (C,)

        for l in range(m.n_layer):
            p = f"transformer.h.{l}."
            out[p + "gamma1"], out[p + "gamma2"] = (C,), (C,)
            ln(p + "ln_1")
            ln(p + "ln_2")
            out[p + "attn.temp"] = (K, 1)
            out[p + "attn.denom_bias"] = (K, L, 1)
            lin(p + "attn.c_attn", (C, C))
            lin(p + "attn.c_proj", (C, C))
            lin(p + "mlp.c_fc", (R, C))
            lin(p + "mlp.c_proj", (C, R))
        ln("transformer.ln_f")
    else:
        raise ValueError(f"unknown architecture {config['architecture']!r}")
    return out


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_model(
    model_dir: Union[str, os.PathLike], dtype: torch.dtype = torch.float32, tssa_variant: str = "official"
) -> Tuple[nn.Module, Dict[str, Any]]:
    """Load ``model_dir/config.json`` + ``model.safetensors`` into a reference model (eval mode).

    The tensor set is checked against the config the same way the server does (missing, unexpected
    or misshapen tensors, wrong dtype are errors); tolerated optional tensors are
    ``*.num_batches_tracked`` and a tied ``lm_head.weight`` that must equal ``transformer.wte.weight``.
    Weights are converted to ``dtype`` (float64 for tight-tolerance tests). Returns (model, config).
    """
    model_dir = os.fspath(model_dir)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{model_dir}: unsupported format_version {config.get('format_version')!r}")
    file_dtype = _DTYPES.get(config.get("dtype", "float32"))
    if file_dtype is None:
        raise ValueError(f"{model_dir}: unsupported dtype {config.get('dtype')!r}")
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    expected = expected_tensor_names(config)
    problems = []
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None:
            problems.append(f"missing tensor {name}")
        elif tuple(t.shape) != shape:
            problems.append(f"tensor {name}: shape {tuple(t.shape)}, expected {shape}")
        elif t.dtype != file_dtype:
            problems.append(f"tensor {name}: dtype {t.dtype}, config says {config.get('dtype', 'float32')}")
    for name in tensors:
        if name in expected:
            continue
        if name.endswith(".num_batches_tracked") and name.startswith("patch_embed."):
            continue
        if name == "lm_head.weight" and config["architecture"] == "tost_lm":
            wte = tensors.get("transformer.wte.weight")
            if wte is not None and not torch.equal(tensors[name], wte):
                problems.append("lm_head.weight present but not equal to transformer.wte.weight")
            continue
        problems.append(f"unexpected tensor {name}")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))

    model = build_model(config, tssa_variant)
    sd = model.state_dict()
    new_sd = {}
    for key, ref in sd.items():
        if key in tensors:
            new_sd[key] = tensors[key]
        elif key == "lm_head.weight":
            new_sd[key] = tensors["transformer.wte.weight"]
        elif key.endswith("num_batches_tracked"):
            new_sd[key] = ref
        else:  # unreachable after the checks above, kept as a guard
            raise KeyError(key)
    model.load_state_dict(new_sd, strict=True)
    return model.to(dtype).eval(), config


def save_model(
    model: nn.Module, config: Dict[str, Any], model_dir: Union[str, os.PathLike],
    keep_num_batches_tracked: bool = False,
) -> Dict[str, torch.Tensor]:
    """Write ``config.json`` and ``model.safetensors`` (float32, contiguous, no shared storage).

    ``lm_head.weight`` is omitted (tied to wte; safetensors refuses shared storage anyway) and
    ``num_batches_tracked`` is dropped unless asked for (optional and ignored by the server). The
    tensor set written is verified against ``expected_tensor_names(config)``. Returns the tensors.
    """
    model_dir = os.fspath(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    config = dict(config)
    config["dtype"] = "float32"
    if config.get("name") != os.path.basename(os.path.normpath(model_dir)):
        raise ValueError(f"config name {config.get('name')!r} must equal the directory name of {model_dir}")
    tensors: Dict[str, torch.Tensor] = {}
    for key, t in model.state_dict().items():
        if key == "lm_head.weight":
            continue
        if key.endswith("num_batches_tracked"):
            if keep_num_batches_tracked:
                tensors[key] = t.detach().to(torch.int64).clone().contiguous()
            continue
        tensors[key] = t.detach().to(device="cpu", dtype=torch.float32).clone().contiguous()
    expected = expected_tensor_names(config)
    got = {k: tuple(v.shape) for k, v in tensors.items() if not k.endswith("num_batches_tracked")}
    if got != expected:
        raise ValueError(
            f"state_dict does not match the contract: missing {sorted(set(expected) - set(got))}, "
            f"unexpected {sorted(set(got) - set(expected))}, "
            f"misshapen {sorted(k for k in got if k in expected and got[k] != expected[k])}"
        )
    weights_path = os.path.join(model_dir, "model.safetensors")
    save_file(tensors, weights_path)
    # safetensors creates the file 0600; model files are data meant to be read by the server's
    # user, so give them the same permissions as config.json (subject to the umask).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(weights_path, 0o666 & ~umask)
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return tensors


def _main() -> None:
    import argparse

    ap = argparse.ArgumentParser(
        description="ToST reference oracle. As a script: load a model directory and run it on a "
        "random input (vision) or a short token sequence (LM), printing the output shape and a "
        "few values. Import it as a module for everything else."
    )
    ap.add_argument("model_dir", help="directory with config.json and model.safetensors")
    ap.add_argument("--float64", action="store_true", help="run in float64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model, config = load_model(args.model_dir, torch.float64 if args.float64 else torch.float32)
    dt = next(model.parameters()).dtype
    with torch.no_grad():
        if config["architecture"] == "tost_vision":
            v = model.cfg
            x = torch.randn(1, v.in_chans, v.image_height, v.image_width, dtype=dt)
            out = model(x)
        else:
            out = model(torch.randint(0, 256, (1, 16)))
    print(f"{config['name']}: {config['architecture']} output {tuple(out.shape)} "
          f"first values {out.flatten()[:5].tolist()}")


if __name__ == "__main__":
    _main()
