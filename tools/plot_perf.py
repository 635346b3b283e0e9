#!/usr/bin/env python3
"""Draws the performance plots from a tools/perf_report.py results directory (run1/, run2/, ...)
into <dir>/plots/: every run on the same axes (run 1 solid, later runs dashed), so the spread shows.

  decode_latency_vs_position.png  ms/token at each position, ToST vs KV-cache GPT (generation.json)
  memory_per_session_vs_tokens.png  measured RSS growth per idle session / per KV cache (p5.json)
  throughput_vs_streams.png       aggregate tokens/s and inter-token latency p50/p99 (p6.json)
  classify_latency_vs_rate.png    p99 vs offered rate, tost_server vs the Python server (p3.json)

  tools/plot_perf.py build/perf/2026-11-23
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def runs(results_dir: str, name: str):
    out = []
    for d in sorted(glob.glob(os.path.join(results_dir, "run*"))):
        path = os.path.join(d, name)
        if os.path.exists(path):
            with open(path) as f:
                out.append((os.path.basename(d), json.load(f)))
    return out


def style(i: int) -> str:
    return "-" if i == 0 else "--"


def title_suffix(data: dict) -> str:
    return " (--quick: tooling check, not a measurement)" if data.get("quick") else ""


def save(fig, out_dir: str, name: str) -> str:
    """Writes `fig` as out_dir/name (120 dpi) and closes it; returns the path."""
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_decode(results_dir: str, out_dir: str):
    data = runs(results_dir, "generation.json")
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (run, g) in enumerate(data):
        p4 = g["p4"]
        ax.plot(p4["positions"], p4["tost_ms"], style(i), marker="o", color="C0", label=f"ToST (tssa_step), {run}")
        ax.plot(p4["positions"], p4["kv_ms"], style(i), marker="s", color="C3", label=f"KV-cache GPT (SDPA), {run}")
    lm = data[0][1]["lm"]
    ax.set_xlabel("position (tokens already in the sequence)")
    ax.set_ylabel("decode latency, ms/token (median)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Decode latency vs position, one sequence\n{lm['n_layer']} layers, C {lm['n_embd']}, "
                 f"{lm['n_head']} heads{title_suffix(data[0][1])}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out_dir, "decode_latency_vs_position.png")


def plot_memory(results_dir: str, out_dir: str):
    data = runs(results_dir, "p5.json")
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (run, p5) in enumerate(data):
        tost = sorted(p5["tost"].values(), key=lambda r: r["position"])
        kv = sorted(p5["kv"].values(), key=lambda r: r["tokens"])
        ax.plot([r["position"] for r in tost], [r["growth_per_session_bytes"] for r in tost], style(i),
                marker="o", color="C0", label=f"ToST session in tost_server (RSS growth), {run}")
        ax.plot([r["tokens"] for r in kv], [r["growth_per_cache_bytes"] for r in kv], style(i),
                marker="s", color="C3", label=f"KV cache, PyTorch (RSS growth), {run}")
        if i == 0:
            ax.plot([r["position"] for r in tost], [r["server_state_bytes"] for r in tost], ":",
                    color="C0", alpha=0.6, label="ToST state bytes the server reports")
            ax.plot([r["tokens"] for r in kv], [r["tensor_bytes_per_cache"] for r in kv], ":",
                    color="C3", alpha=0.6, label="KV tensor bytes")
    lm = data[0][1]["lm"]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the sequence")
    ax.set_ylabel("resident memory per idle session, bytes")
    ax.set_title(f"Memory per idle session vs tokens\n{lm['n_layer']} layers, C {lm['n_embd']}, {lm['n_head']} heads"
                 f"{title_suffix(data[0][1])}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, out_dir, "memory_per_session_vs_tokens.png")


def plot_streams(results_dir: str, out_dir: str):
    data = runs(results_dir, "p6.json")
    if not data:
        return None
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, (run, p6) in enumerate(data):
        pts = p6["points"]
        n = [p["streams"] for p in pts]
        ax.plot(n, [p["tokens_per_s"] for p in pts], style(i), marker="o", color="C0", label=run)
        ax2.plot(n, [p["itl_p50_ms"] for p in pts], style(i), marker="o", color="C2", label=f"p50, {run}")
        ax2.plot(n, [p["itl_p99_ms"] for p in pts], style(i), marker="^", color="C1", label=f"p99, {run}")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent Generate streams")
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=8)
    ax.set_ylabel("aggregate tokens/s")
    ax.set_ylim(bottom=0)
    ax2.set_ylabel("inter-token latency, ms (client side)")
    ax2.set_ylim(bottom=0)
    p6 = data[0][1]
    fig.suptitle(f"Decode through tost_server ({p6['model']}, {p6['tokens_per_stream']} tokens per stream)"
                 f"{title_suffix(p6)}", fontsize=10)
    return save(fig, out_dir, "throughput_vs_streams.png")


def plot_classify(results_dir: str, out_dir: str):
    data = runs(results_dir, "p3.json")
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (run, p3) in enumerate(data):
        for key, color, label in (("tost_server", "C0", "tost_server"), ("python_server", "C3", "Python gRPC server")):
            s = p3[key]
            sweep = sorted(s["sweep"], key=lambda r: r["rate_per_s"])
            ax.plot([r["rate_per_s"] for r in sweep], [r["p99_ms"] for r in sweep], style(i), marker="o",
                    color=color, label=f"{label} p99, {run}")
            if i == 0:
                ax.axhline(s["p99_bound_ms"], color=color, alpha=0.4, linestyle=":",
                           label=f"{label}: 2x unloaded latency")
    ax.set_yscale("log")
    ax.set_xlabel(f"offered calls/s (Poisson, {data[0][1]['batch_size']} image(s) each)")
    ax.set_ylabel("p99 latency, ms")
    ax.set_title(f"Classification p99 vs offered rate ({data[0][1]['model']})\n{title_suffix(data[0][1])}",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, out_dir, "classify_latency_vs_rate.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir")
    args = ap.parse_args()
    out_dir = os.path.join(args.results_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    for plot in (plot_decode, plot_memory, plot_streams, plot_classify):
        path = plot(args.results_dir, out_dir)
        print(f"wrote {path}" if path else f"{plot.__name__}: no data")


if __name__ == "__main__":
    main()
