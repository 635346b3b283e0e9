"""Tests of the Python reference oracle (tools/tost_reference.py) and the fixture/model tools.

The reference is what the C++ server is judged against, so it is itself checked here against
independent, deliberately naive transcriptions of docs/model-semantics.md (loops and slices
instead of reshapes, explicit exp/sum instead of softmax), against the on-disk contract of
docs/model-repository.md (tensor names written out by hand), and against itself (streaming vs
parallel causal form). Everything runs in float64 on small models, in a few seconds on 2 cores.
"""

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import make_parity_fixtures as P
import make_random_models as M
import tost_reference as R

F64 = torch.float64


def rand_lm(bias=False, n_layer=3, n_head=4, n_embd=64, ctx=256, seed=1, dtype=F64):
    cfg = R.LMConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, context_length=ctx,
                     vocab_size=257, bias=bias)
    torch.manual_seed(seed)
    return P.randomize_(R.TostLM(cfg), seed).to(dtype).eval()


def rand_vision(seed=2, dtype=F64, **kw):
    args = dict(embed_dim=64, depth=3, num_heads=4, patch_size=4, in_chans=3, num_classes=10,
                image_height=32, image_width=48)
    args.update(kw)
    torch.manual_seed(seed)
    return P.randomize_(R.TostVision(R.VisionConfig(**args)), seed).to(dtype).eval()


# ---------------------------------------------------------------------------------------------
# TSSA operators against direct transcriptions of the spec
# ---------------------------------------------------------------------------------------------


def transcribe_vision_tssa(X, A, a, temp, Wout, bout, K):
    """§1.1 steps 1-8, literally: per batch b and head k, with explicit sums over j and c."""
    B, N, D = X.shape
    p = D // K
    W = X @ A.T + a  # step 1
    Y = torch.zeros_like(W)
    for b in range(B):
        S = torch.zeros(K, N, dtype=X.dtype)
        for k in range(K):
            w = W[b, :, k * p:(k + 1) * p]  # w[j, c] = W[b, j, k*p + c]
            nu = torch.sqrt((w**2).sum(dim=0)).clamp(min=1e-12)  # step 2, over tokens j
            S[k] = temp[k, 0] * ((w / nu) ** 2).sum(dim=1)  # step 3
        E = torch.exp(S)
        Pi = E / E.sum(dim=0, keepdim=True)  # step 4: over the head axis, per token
        for k in range(K):
            w = W[b, :, k * p:(k + 1) * p]
            n = Pi[k].sum()  # step 5
            dots = ((Pi[k] / (n + 1e-8))[:, None] * w**2).sum(dim=0)
            g = 1.0 / (1.0 + dots)  # step 6
            Y[b, :, k * p:(k + 1) * p] = -w * Pi[k][:, None] * g[None, :]  # step 7 (merge)
    return Y @ Wout.T + bout  # step 8


def test_vision_tssa_matches_spec_transcription():
    torch.manual_seed(0)
    B, N, D, K = 2, 9, 12, 3
    attn = R.AttentionTSSA(D, K).to(F64)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for prm in attn.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g, dtype=F64))
        attn.temp.copy_(torch.rand(K, 1, generator=g, dtype=F64) * 3 + 0.5)
    X = torch.randn(B, N, D, generator=g, dtype=F64)
    with torch.no_grad():
        got = attn(X)
        want = transcribe_vision_tssa(X, attn.qkv.weight, attn.qkv.bias, attn.temp,
                                      attn.to_out[0].weight, attn.to_out[0].bias, K)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # And the gate really is non-trivial in this test (otherwise it proves little).
    _, _, gate = R.tssa_vision(attn.qkv(X).reshape(B, N, K, D // K).permute(0, 2, 1, 3), attn.temp)
    assert gate.min() < 0.5


def transcribe_causal_tssa(X, A, temp, delta, K):
    """§2.1 steps 1-7 with explicit running sums over positions (no cumsum, no softmax)."""
    B, T, C = X.shape
    p = C // K
    W = X @ A.T
    Y = torch.zeros_like(W)
    for b in range(B):
        for t in range(T):
            s = torch.zeros(K, dtype=X.dtype)
            for k in range(K):
                wk = W[b, :t + 1, k * p:(k + 1) * p]
                S1 = (wk**2).sum(dim=0).clamp(min=1e-12)  # squared sum clamped
                u = wk[t] ** 2 / S1 + delta[k, t, 0]  # delta after the division
                s[k] = temp[k, 0] * u.sum()
            Pi_t = torch.exp(s) / torch.exp(s).sum()
            Y[b, t] = torch.nan  # filled below
            for k in range(K):
                num = torch.zeros(p, dtype=X.dtype)
                den = torch.zeros((), dtype=X.dtype)
                for s_ in range(t + 1):  # Pi of earlier tokens: recompute from their own prefixes
                    ws = W[b, :s_ + 1]
                    logits = torch.stack([
                        temp[kk, 0] * ((ws[s_, kk * p:(kk + 1) * p] ** 2)
                                       / (ws[:, kk * p:(kk + 1) * p] ** 2).sum(0).clamp(min=1e-12)
                                       + delta[kk, s_, 0]).sum()
                        for kk in range(K)])
                    pis = (torch.exp(logits) / torch.exp(logits).sum())[k]
                    num = num + pis * W[b, s_, k * p:(k + 1) * p] ** 2
                    den = den + pis
                dots = num / (den + 1e-8)
                Y[b, t, k * p:(k + 1) * p] = -W[b, t, k * p:(k + 1) * p] * Pi_t[k] / (1 + dots)
    return Y


def test_causal_tssa_matches_spec_transcription():
    g = torch.Generator().manual_seed(11)
    B, T, C, K = 2, 6, 8, 2
    X = torch.randn(B, T, C, generator=g, dtype=F64)
    A = torch.randn(C, C, generator=g, dtype=F64)
    temp = torch.rand(K, 1, generator=g, dtype=F64) * 2.5 + 0.5
    delta = torch.randn(K, 10, 1, generator=g, dtype=F64) * 0.5
    w = (X @ A.T).view(B, T, K, C // K).transpose(1, 2)
    y, _, _ = R.tssa_causal(w, temp, delta)
    got = y.transpose(1, 2).reshape(B, T, C)
    torch.testing.assert_close(got, transcribe_causal_tssa(X, A, temp, delta, K), rtol=1e-12, atol=1e-12)


def test_causal_tssa_first_token_pi_depends_only_on_temp_and_delta():
    """§2.1: at t = 0, w²/S1 = 1 for every non-zero channel, so s[k] = temp[k]·(p + p·δ[k,0])."""
    g = torch.Generator().manual_seed(3)
    B, K, p = 3, 4, 5
    temp = torch.rand(K, 1, generator=g, dtype=F64) * 2.5 + 0.5
    delta = torch.randn(K, 8, 1, generator=g, dtype=F64) * 0.5
    expected_pi = torch.softmax(temp[:, 0] * (p + p * delta[:, 0, 0]), dim=0)
    pis = []
    for scale in (1e-3, 1.0, 1e3):
        w = torch.randn(B, K, 1, p, generator=g, dtype=F64) * scale
        y, pi, gate = R.tssa_causal(w, temp, delta)
        torch.testing.assert_close(pi[:, :, 0], expected_pi.expand(B, K), rtol=1e-13, atol=1e-15)
        pis.append(pi)
        # dots at t = 0 is Π·w²/(Π + 1e-8): the second moment of the token itself.
        pi4 = pi.unsqueeze(-1)
        torch.testing.assert_close(gate, 1 / (1 + pi4 * w**2 / (pi4 + 1e-8)), rtol=1e-13, atol=0)
        torch.testing.assert_close(y, -w * pi4 * gate, rtol=1e-13, atol=0)
    # A token with an all-zero head: S1 clamps at 1e-12, u = 0 + δ, logit = temp·p·δ only.
    w = torch.randn(1, K, 1, p, generator=g, dtype=F64)
    w[0, 1] = 0
    _, pi, _ = R.tssa_causal(w, temp, delta)
    logits = temp[:, 0] * (p + p * delta[:, 0, 0])
    logits[1] = temp[1, 0] * p * delta[1, 0, 0]
    torch.testing.assert_close(pi[0, :, 0], torch.softmax(logits, 0), rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# Whole models
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
def test_streaming_step_equals_parallel_forward(bias):
    model = rand_lm(bias=bias)
    T = 200
    tok = torch.randint(0, 257, (2, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tok)
        state = model.init_state(2)
        steps = []
        for t in range(T):
            logits, state = model.step(tok[:, t], state)
            steps.append(logits)
    steps = torch.stack(steps, dim=1)
    assert state.pos == T
    assert all(s1.shape == (2, 64) and s2.shape == (2, 64) and s3.shape == (2, 4) for s1, s2, s3 in state.layers)
    torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)


def test_lm_is_causal():
    model = rand_lm(n_layer=2)
    g = torch.Generator().manual_seed(8)
    tok = torch.randint(0, 257, (1, 40), generator=g)
    tok2 = tok.clone()
    tok2[0, 25:] = torch.randint(0, 257, (15,), generator=g)
    with torch.no_grad():
        a, b = model(tok), model(tok2)
    torch.testing.assert_close(a[:, :25], b[:, :25], rtol=0, atol=1e-12)
    assert (a[:, 25:] - b[:, 25:]).abs().max() > 1e-3


def test_lm_context_limit():
    model = rand_lm(n_layer=1, ctx=16)
    with pytest.raises(ValueError):
        model(torch.zeros(1, 17, dtype=torch.long))
    state = model.init_state(1)
    with torch.no_grad():
        for _ in range(16):
            _, state = model.step(torch.zeros(1, dtype=torch.long), state)
        with pytest.raises(ValueError):
            model.step(torch.zeros(1, dtype=torch.long), state)


def test_wrong_variant_differs_materially():
    v = rand_vision()
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1), dtype=F64)
    lm = rand_lm()
    tok = torch.randint(0, 257, (2, 100), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for model, inp in ((v, x), (lm, tok)):
            right = model(inp)
            R.set_tssa_variant(model, "token_softmax")
            wrong = model(inp)
            R.set_tssa_variant(model, "official")
            rel = (wrong - right).abs().max() / right.abs().max()
            assert rel > 0.05, f"{type(model).__name__}: wrong TSSA only {rel:.3g} away"
            torch.testing.assert_close(model(inp), right, rtol=0, atol=0)  # switch back is exact
    with pytest.raises(ValueError):
        R.TostLM(R.LMConfig(n_layer=1), tssa_variant="nonsense")


def test_class_attention_block_quirks():
    """§1.2 step 5: patch rows end as 2·LN2(x + γ1 ⊙ LN1(x)); the cls row as y + γ2 ⊙ MLP(y)."""
    torch.manual_seed(0)
    D, K = 16, 4
    blk = R.ClassAttentionBlock(D, K, 4, 1.0).to(F64)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for prm in blk.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g, dtype=F64) * 0.5 + (1.0 if prm.dim() == 1 else 0))
    x = torch.randn(2, 7, D, generator=g, dtype=F64)

    def ln(m, z):
        mu = z.mean(-1, keepdim=True)
        var = ((z - mu) ** 2).mean(-1, keepdim=True)
        return (z - mu) / torch.sqrt(var + 1e-6) * m.weight + m.bias

    with torch.no_grad():
        out = blk(x)
        a = ln(blk.norm1, x)
        q, k, v = (a @ blk.attn.qkv.weight.T + blk.attn.qkv.bias).split(D, dim=-1)
        p = D // K
        heads = []
        for h in range(K):
            sl = slice(h * p, (h + 1) * p)
            logits = (k[:, :, sl] @ q[:, 0, sl].unsqueeze(-1)).squeeze(-1) / math.sqrt(p)  # (B, N+1)
            att = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
            heads.append((att.unsqueeze(-1) * v[:, :, sl]).sum(1))
        cls = torch.cat(heads, -1) @ blk.attn.proj.weight.T + blk.attn.proj.bias
        x1 = x.clone()
        x1[:, 0] = x[:, 0] + blk.gamma1 * cls
        x1[:, 1:] = x[:, 1:] + blk.gamma1 * a[:, 1:]  # patch rows pass LN1's output through
        y = ln(blk.norm2, x1)
        want = 2 * y
        want[:, 0] = y[:, 0] + blk.gamma2 * blk.mlp(y[:, 0])
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_positional_encoding_fourier_formula():
    Hp, Wp = 3, 5
    pe = R.positional_encoding_fourier(Hp, Wp, F64)
    assert pe.shape == (64, Hp, Wp)
    for i in range(Hp):
        for j in range(Wp):
            ya = (i + 1) / (Hp + 1e-6) * 2 * math.pi
            xa = (j + 1) / (Wp + 1e-6) * 2 * math.pi
            for c in range(32):
                dim_t = 10000 ** (2 * (c // 2) / 32)
                f = math.sin if c % 2 == 0 else math.cos
                assert pe[c, i, j].item() == pytest.approx(f(ya / dim_t), abs=1e-14)
                assert pe[32 + c, i, j].item() == pytest.approx(f(xa / dim_t), abs=1e-14)


def test_vision_structure_matches_official_counts():
    tiny = R.TostVision(R.VisionConfig(embed_dim=192, depth=12, num_heads=4, patch_size=16))
    assert sum(p.numel() for p in tiny.parameters()) == 5_769_328  # §1.3: 5.769M
    assert len(tiny.state_dict()) == 239  # including the 4 num_batches_tracked
    convs = [m for m in tiny.patch_embed.proj.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(3, 24), (24, 48), (48, 96), (96, 192)]
    assert [type(m).__name__ for m in tiny.patch_embed.proj] == ["Sequential", "GELU"] * 3 + ["Sequential"]
    p8 = R.VisionConfig(embed_dim=192, depth=12, num_heads=4, patch_size=8)
    assert p8.stem_channels() == [48, 96, 192]
    assert R.TostVision(R.VisionConfig(embed_dim=64, depth=1, num_heads=4, patch_size=2)).patch_embed.proj[0][0].out_channels == 64
    with pytest.raises(ValueError):
        R.VisionConfig(patch_size=12)


def test_vision_batch_elements_independent_and_nonsquare():
    v = rand_vision()
    x = torch.randn(3, 3, 32, 48, generator=torch.Generator().manual_seed(6), dtype=F64)
    with torch.no_grad():
        both = v(x)
        one = v(x[1:2])
    torch.testing.assert_close(both[1:2], one, rtol=1e-12, atol=1e-12)
    # 32x48 with patch 4 -> 8x12 patches in row-major order.
    with torch.no_grad():
        tokens, hw = v.patch_embed(x)
    assert hw == (8, 12) and tokens.shape == (3, 96, 64)


# ---------------------------------------------------------------------------------------------
# On-disk format
# ---------------------------------------------------------------------------------------------


def doc_vision_names(D=64, R_=256, K=4, C0=3, stem=(32, 64), depth=1, cab=2, classes=10):
    """The vision tensor table of docs/model-repository.md, written out by hand for one config."""
    names = {"cls_token": (1, 1, D), "pos_embeder.token_projection.weight": (D, 64, 1, 1),
             "pos_embeder.token_projection.bias": (D,), "norm.weight": (D,), "norm.bias": (D,),
             "head.weight": (classes, D), "head.bias": (classes,)}
    prev = C0
    for i, c in enumerate(stem):
        names[f"patch_embed.proj.{2 * i}.0.weight"] = (c, prev, 3, 3)
        for s in ("weight", "bias", "running_mean", "running_var"):
            names[f"patch_embed.proj.{2 * i}.1.{s}"] = (c,)
        prev = c
    for pfx, qkv in [(f"blocks.{l}.", D) for l in range(depth)] + [(f"cls_attn_blocks.{c}.", 3 * D) for c in range(cab)]:
        for n in ("gamma1", "gamma2", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"):
            names[pfx + n] = (D,)
        names.update({pfx + "attn.qkv.weight": (qkv, D), pfx + "attn.qkv.bias": (qkv,),
                      pfx + "mlp.fc1.weight": (R_, D), pfx + "mlp.fc1.bias": (R_,),
                      pfx + "mlp.fc2.weight": (D, R_), pfx + "mlp.fc2.bias": (D,)})
        if pfx.startswith("blocks"):
            names.update({pfx + "attn.temp": (K, 1), pfx + "attn.to_out.0.weight": (D, D),
                          pfx + "attn.to_out.0.bias": (D,)})
        else:
            names.update({pfx + "attn.proj.weight": (D, D), pfx + "attn.proj.bias": (D,)})
    return names


def doc_lm_names(bias, L=2, C=32, K=4, ctx=64, V=257):
    names = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (ctx, C), "transformer.ln_f.weight": (C,)}
    if bias:
        names["transformer.ln_f.bias"] = (C,)
    for l in range(L):
        p = f"transformer.h.{l}."
        names.update({p + "gamma1": (C,), p + "gamma2": (C,), p + "ln_1.weight": (C,), p + "ln_2.weight": (C,),
                      p + "attn.temp": (K, 1), p + "attn.denom_bias": (K, ctx, 1),
                      p + "attn.c_attn.weight": (C, C), p + "attn.c_proj.weight": (C, C),
                      p + "mlp.c_fc.weight": (4 * C, C), p + "mlp.c_proj.weight": (C, 4 * C)})
        if bias:
            names.update({p + "ln_1.bias": (C,), p + "ln_2.bias": (C,), p + "attn.c_attn.bias": (C,),
                          p + "attn.c_proj.bias": (C,), p + "mlp.c_fc.bias": (4 * C,), p + "mlp.c_proj.bias": (C,)})
    return names


def test_save_load_roundtrip_vision(tmp_path):
    cfg = R.VisionConfig(embed_dim=64, depth=1, num_heads=4, patch_size=4, in_chans=3, num_classes=10,
                         image_height=16, image_width=16)
    torch.manual_seed(0)
    model = P.randomize_(R.TostVision(cfg), 0)
    config = R.make_config("v", cfg, labels=[str(i) for i in range(10)], preprocess={"mean": [0.5] * 3, "std": [0.5] * 3})
    R.save_model(model, config, tmp_path / "v")
    on_disk = load_file(tmp_path / "v" / "model.safetensors")
    assert {k: tuple(t.shape) for k, t in on_disk.items()} == doc_vision_names()
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in on_disk.values())
    loaded, loaded_cfg = R.load_model(tmp_path / "v")
    assert loaded_cfg == json.loads((tmp_path / "v" / "config.json").read_text())
    assert loaded_cfg["name"] == "v" and loaded_cfg["dtype"] == "float32" and loaded_cfg["trained"] is False
    for k, t in model.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(loaded.state_dict()[k], t), k
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))


@pytest.mark.parametrize("bias", [False, True])
def test_save_load_roundtrip_lm(tmp_path, bias):
    cfg = R.LMConfig(n_layer=2, n_head=4, n_embd=32, context_length=64, vocab_size=257, bias=bias)
    torch.manual_seed(0)
    model = P.randomize_(R.TostLM(cfg), 0)
    R.save_model(model, R.make_config("lm", cfg), tmp_path / "lm")
    on_disk = load_file(tmp_path / "lm" / "model.safetensors")
    assert "lm_head.weight" not in on_disk
    assert {k: tuple(t.shape) for k, t in on_disk.items()} == doc_lm_names(bias)
    loaded, _ = R.load_model(tmp_path / "lm", dtype=F64)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # tie survives load + dtype change
    tok = torch.randint(0, 257, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tok).float(), model(tok), rtol=1e-5, atol=1e-5)


def test_load_checks_the_tensor_set(tmp_path):
    cfg = R.LMConfig(n_layer=1, n_head=4, n_embd=32, context_length=64)
    torch.manual_seed(0)
    model = P.randomize_(R.TostLM(cfg), 0)
    d = tmp_path / "lm"
    tensors = R.save_model(model, R.make_config("lm", cfg), d)
    path = d / "model.safetensors"

    def write_and_load(ts):
        save_file(ts, path)
        return R.load_model(d)

    # Tolerated: a tied lm_head equal to wte.
    write_and_load({**tensors, "lm_head.weight": tensors["transformer.wte.weight"].clone()})
    bad_cases = [
        {**tensors, "lm_head.weight": tensors["transformer.wte.weight"] + 1},
        {k: v for k, v in tensors.items() if k != "transformer.h.0.attn.temp"},
        {**tensors, "transformer.h.0.attn.extra": torch.zeros(1)},
        {**tensors, "transformer.h.0.attn.denom_bias": torch.zeros(4, 32, 1)},
        {**tensors, "transformer.h.0.gamma1": tensors["transformer.h.0.gamma1"].half()},
    ]
    for ts in bad_cases:
        with pytest.raises(ValueError):
            write_and_load(ts)


# ---------------------------------------------------------------------------------------------
# The tools end to end (small cases only, to stay fast)
# ---------------------------------------------------------------------------------------------


def test_parity_fixtures_reproduce(tmp_path):
    assert P.main(["--out", str(tmp_path), "--cases", "vision_small", "lm_bias"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [c["name"] for c in manifest["cases"]] == ["vision_small", "lm_bias"]
    for entry in manifest["cases"]:
        case_dir = tmp_path / entry["model_dir"]
        model, config = R.load_model(case_dir, dtype=F64)
        assert config["name"] == entry["name"]
        fx = load_file(case_dir / "fixture.safetensors")
        inp = fx["input"].to(F64) if "input" in fx else fx["tokens"]
        if "tokens" in fx:
            assert fx["tokens"].dtype == torch.int64
        with torch.no_grad():
            out = model(inp)
        torch.testing.assert_close(out.float(), fx["logits"], rtol=1e-6, atol=1e-6)
        assert (fx["logits_wrong_tssa"] - fx["logits"]).abs().max() > 0.05 * fx["logits"].abs().max()
        assert 0.0 < entry["gate_stats"]["gate_min"] < 0.5  # the gate departs clearly from 1
        assert entry["float32_reference_max_abs_err"] < 1e-4
    # Deterministic: same seed, same bytes.
    again = tmp_path / "again"
    P.main(["--out", str(again), "--cases", "vision_small"])
    assert (again / "vision_small" / "fixture.safetensors").read_bytes() == \
        (tmp_path / "vision_small" / "fixture.safetensors").read_bytes()


def test_random_models(tmp_path):
    assert M.main(["--out", str(tmp_path)]) == 0
    total = 0
    for name in ("tost-digits", "tost-bytes"):
        d = tmp_path / name
        total += sum(os.path.getsize(d / f) for f in ("config.json", "model.safetensors"))
        model, config = R.load_model(d)
        assert config["name"] == name and config["trained"] is False
        assert "make_random_models.py" in config["provenance"]["script"]
        with torch.no_grad():
            if name == "tost-digits":
                assert config["labels"] == [str(i) for i in range(10)]
                assert config["preprocess"] == {"mean": [0.5], "std": [0.5]}
                logits = model(torch.randn(2, 1, 32, 32))
                assert logits.shape == (2, 10)
                # tokens: 8x8 = 64
                assert model.patch_embed(torch.zeros(1, 1, 32, 32))[1] == (8, 8)
            else:
                assert config["tokenizer"] == {"type": "byte", "eos_token_id": 256}
                logits = model(torch.randint(0, 257, (1, 64)))
                assert logits.shape == (1, 64, 257)
                # Untrained at the official init: next-byte distribution close to uniform (the
                # tied embedding gives the current byte a small bump, as in any nanoGPT at init).
                logp = torch.log_softmax(logits, -1)
                entropy = -(logp.exp() * logp).sum(-1)
                assert entropy.min() > 0.95 * math.log(257)
    assert total < 5_000_000
