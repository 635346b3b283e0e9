#!/usr/bin/env python3
"""Regenerates README.md's CPU performance table and the figures of its opening paragraph from the
committed raw output of the peer benchmark, so that neither can drift from what was measured.

Every `docs/perf/<date>-peers-<class>/peers.json` written by run_peers.py with `--isa-class` is one
block of the table: the class, the date, the CPU and its flags, the commit, the load, and per
precision tost_server's figures beside each peer's (llama-server at the better of flash attention
off and on, CTranslate2), then the acceptance targets, met or missed. A missed target needs its
reason, from a profile, in that directory's `misses.json` ({"<precision> <metric>": "reason", e.g.
"int8 prefill", or "constrained <dtype> <n> streams"});
without one the render fails. A `constrained-<dtype>.json` beside it (tools/bench/constrained.py)
adds constrained decoding's share of unconstrained tokens/s. Classes no run has measured are
listed as such (NOT_MEASURED).

The README holds two marked regions, each replaced whole:
  <!-- render_readme.py opening -->...<!-- /render_readme.py -->   the opening paragraph's figures
  <!-- render_readme.py table -->...<!-- /render_readme.py -->     the CPU table
Usage: render_readme.py [--check] [--readme README.md]
  --check: write nothing; fail (exit 1, with a diff) if README.md differs from the render.
"""
from __future__ import annotations

import argparse
import difflib
import glob
import json
import os
import re
import sys
import textwrap
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MODEL = "bench-lm"
MODEL_WORDS = "the bench LM (6 layers, C 384)"
# The classes the project's machines have not offered, said in the table as not measured.
NOT_MEASURED = "an AVX2-only CPU (Zen 2/3) or one with AMX (none available)"
# Precision classes: tost_server's engines, and each peer with its engines (llama-server's with
# flash attention off, then on).
PRECISIONS = [
    ("fp32", ["tost"], [("llama f32", ["llama-f32", "llama-f32-fa"]),
                        ("CTranslate2", ["ct2-float32"])]),
    ("16-bit", ["tost-bf16", "tost-fp16"], [("llama f16", ["llama-f16", "llama-f16-fa"])]),
    ("int8", ["tost-int8"], [("llama q8_0", ["llama-q8_0", "llama-q8_0-fa"]),
                             ("CTranslate2", ["ct2-int8"])]),
]
TOST_NAMES = {"tost": "", "tost-bf16": "bf16", "tost-fp16": "fp16", "tost-int8": ""}
START = "<!-- render_readme.py {} -->"
END = "<!-- /render_readme.py -->"


def wrap(text: str) -> str:
    """A paragraph wrapped at the README's 100 columns (at spaces only: links stay whole)."""
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def fmt(x: Optional[float], kind: str) -> str:
    if x is None:
        return "–"
    if kind == "ms":
        return f"{x:.2f}" if x < 10 else f"{x:.1f}"
    return f"{x:,.0f}".replace(",", " ")


class Run:
    """One run_peers.py JSON: its figures for MODEL, best of rounds (the JSON's own choice)."""

    def __init__(self, path: str):
        self.path = path
        self.dir = os.path.dirname(path)
        with open(path) as f:
            self.j = json.load(f)
        self.m = self.j["models"][MODEL]
        self.engines = self.j["engines"]
        self.misses_reasons: Dict[str, str] = {}
        p = os.path.join(self.dir, "misses.json")
        if os.path.exists(p):
            with open(p) as f:
                self.misses_reasons = json.load(f)

    @property
    def label(self) -> str:
        return self.j["isa_class"]

    def decode(self, engine: str, pos: str) -> Optional[float]:
        return self.m["decode_ms"].get(pos, {}).get(engine)

    def positions(self) -> List[str]:
        return list(self.m["decode_ms"])

    def prefill(self, engine: str) -> Optional[float]:
        return self.m["prefill_tps"].get(engine)

    def streams(self, engine: str, n: int) -> Optional[float]:
        r = self.m.get("streams", {}).get("16", {}).get(str(n), {}).get(engine)
        return r["tokens_per_s"] if r else None

    def rss(self, engine: str) -> Optional[float]:
        r = self.m.get("session_rss", {}).get(engine)
        return r["mib_per_session"] if r else None

    def best(self, engines: List[str], get, lower: bool) -> Tuple[Optional[float], Optional[str]]:
        vals = [(get(e), e) for e in engines if e in self.engines and get(e) is not None]
        if not vals:
            return None, None
        return (min if lower else max)(vals)

    def constrained(self) -> List[Tuple[str, dict]]:
        out = []
        for p in sorted(glob.glob(os.path.join(self.dir, "constrained-*.json"))):
            if p.endswith("-full.json"):  # the equal-length runs: for the reasons, not the table
                continue
            with open(p) as f:
                out.append((os.path.basename(p)[len("constrained-"):-len(".json")], json.load(f)))
        return out


def cell_decode(run: Run, engines: List[str]) -> str:
    """ms/token at each position: the best of `engines` at each (a * marks flash attention on)."""
    parts = []
    for pos in run.positions():
        v, e = run.best(engines, lambda x: run.decode(x, pos), True)
        parts.append(fmt(v, "ms") + ("\\*" if e and e.endswith("-fa") else ""))
    return " / ".join(parts)


def cell(run: Run, engines: List[str], get, lower: bool, kind: str) -> str:
    v, e = run.best(engines, get, lower)
    return fmt(v, kind) + ("\\*" if e and e.endswith("-fa") else "")


def targets(run: Run) -> Tuple[List[str], List[str]]:
    """(met, missed) acceptance targets of this run, each as words. Decode at each position at or
    below the best peer of the precision; prefill of the long prompt at least 2x the best peer's;
    64 streams at least 2x the best peer's tokens/s. tost_server's best engine of the precision
    counts (bf16 or fp16 for 16-bit)."""
    met, missed = [], []
    for name, tost, peers in PRECISIONS:
        tost = [e for e in tost if e in run.engines]
        peer_engines = [e for _, es in peers for e in es if e in run.engines]
        if not tost or not peer_engines:
            continue
        checks = [(f"decode @{p}", lambda e, p=p: run.decode(e, p), True, 1.0) for p in run.positions()]
        checks.append(("prefill", run.prefill, False, 2.0))
        checks.append(("64 streams", lambda e: run.streams(e, 64), False, 2.0))
        for metric, get, lower, factor in checks:
            t, _ = run.best(tost, get, lower)
            p, pe = run.best(peer_engines, get, lower)
            if t is None or p is None:
                continue
            ratio = p / t if lower else t / p  # >= factor is met
            key = f"{name} {metric}"
            words = f"{key} ({ratio:.2f}x the best peer, {pe})"
            (met if ratio >= factor else missed).append((key, words))
    return met, missed


def render_block(run: Run) -> str:
    j = run.j
    prov = j["provenance"]
    flags = [f for f in prov["cpu_flags"] if re.fullmatch(r"avx2|fma|f16c|avx512(f|_bf16|_vnni|_fp16)|avx_vnni|amx\w*", f)]
    amx = "" if any(f.startswith("amx") for f in flags) else ", no AMX"
    env = prov.get("env", {})
    cap = ""
    if env:  # the CPU's own flags are in the block of its native run
        flags = [f for f in flags if not f.startswith(("avx512", "avx_vnni", "amx"))]
        cap = f", AVX-512 off (`ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']}` and others)"
    rel = os.path.relpath(run.dir, ROOT)
    # Documentation and raw output (the run's own .txt is written while it runs, README.md is
    # rendered) are not changes to what was built.
    dirty = [f for f in prov.get("tree_dirty_files", [])
             if not re.match(r"docs/|README\.md$", f.strip().split(None, 1)[-1])]
    head = (f"**{run.label}**: {j['date_utc'][:10]}, {cpu_name(j)}, "
            f"`{compact_flags(flags)}`{amx if not env else ''}{cap}; commit `{prov['commit'][:7]}`"
            + (f" (+{len(dirty)} uncommitted files)" if dirty else "")
            + f" ([raw]({rel}/))")
    pos = " / ".join(run.positions())
    lines = [wrap(head), "",
             f"| weights | engine | ms/token @{pos} | prefill {run.m['prefill_len']}, tokens/s "
             "| 64 streams, tokens/s |",
             "| --- | --- | --- | --- | --- |"]
    for name, tost, peers in PRECISIONS:
        tost = [e for e in tost if e in run.engines]
        if not tost:
            continue
        names = " · ".join(TOST_NAMES[e] for e in tost if TOST_NAMES[e])
        lines.append(f"| {name} | **tost_server**{' ' + names if names else ''} | "
                     + " · ".join(cell_decode(run, [e]) for e in tost) + " | "
                     + " · ".join(cell(run, [e], run.prefill, False, "tps") for e in tost) + " | "
                     + " · ".join(cell(run, [e], lambda x: run.streams(x, 64), False, "tps") for e in tost)
                     + " |")
        present = [(pn, [e for e in es if e in run.engines]) for pn, es in peers]
        present = [(pn, es) for pn, es in present if es]
        if present:
            def streams_cell(es):
                if not any(run.streams(e, 64) is not None for e in es):
                    return "–"
                return cell(run, es, lambda x: run.streams(x, 64), False, "tps")
            streamed = [streams_cell(es) for _, es in present]
            lines.append(f"| | {' · '.join(pn for pn, _ in present)} | "
                         + " · ".join(cell_decode(run, es) for _, es in present) + " | "
                         + " · ".join(cell(run, es, run.prefill, False, "tps") for _, es in present) + " | "
                         + (" · ".join(c for c in streamed if c != "–") or "–") + " |")
    absent = [pn for _, _, peers in PRECISIONS for pn, es in peers if not any(e in run.engines for e in es)]
    lines.append("")
    notes = []
    if absent:
        notes.append("not run here: " + ", ".join(dict.fromkeys(absent)))
    met, missed = targets(run)
    for dtype, c in run.constrained():
        for n, r in sorted(c["ratios"].items(), key=lambda x: int(x[0])):
            key = f"constrained {dtype} {n} streams"
            (met if r["met"] else missed).append((key, key))
    unexplained = [k for k, _ in missed if k not in run.misses_reasons]
    if unexplained:
        raise SystemExit(f"render_readme.py: {run.path}: missed targets without a reason in "
                         f"{os.path.join(rel, 'misses.json')}: {unexplained}")
    shares = []
    for dtype, c in run.constrained():
        r = c["ratios"]
        shares.append(f"{dtype} " + " / ".join(f"{r[n]['constrained_vs_free']:.3f}" for n in sorted(r, key=int)))
    if shares:
        notes.append("JSON-schema / free tokens/s at 1 / 64 streams: " + ", ".join(shares))
    verdict = f"{len(met)} of {len(met) + len(missed)} targets met"
    if missed:
        verdict += "; missed: " + "; ".join(f"{w}: {run.misses_reasons[k]}" for k, w in missed)
    notes.append(verdict)
    lines.append(wrap(". ".join(n[0].upper() + n[1:] for n in notes) + "."))
    return "\n".join(lines)


def compact_flags(flags: List[str]) -> str:
    """The flags, AVX-512's written once: avx512f avx512_bf16 -> avx512f/bf16."""
    plain = [f for f in flags if not f.startswith("avx512")]
    wide = [f for f in flags if f.startswith("avx512")]
    if wide:
        plain.append("/".join([wide[0]] + [f[len("avx512_"):] if f.startswith("avx512_") else f[len("avx512"):]
                                           for f in wide[1:]]))
    return " ".join(plain)


def cpu_name(j: dict) -> str:
    """The CPU's model name without trademarks, clock and 'Processor'."""
    name = j["machine"].get("cpu_model", "CPU").split("@")[0]
    for w in ("(R)", "(TM)", " CPU", " Processor"):
        name = name.replace(w, "")
    return " ".join(name.split())


def runs(perf_dir: str) -> List[Run]:
    found = [Run(p) for p in sorted(glob.glob(os.path.join(perf_dir, "*-peers-*", "peers.json")))]
    found = [r for r in found if r.j.get("isa_class")]
    # Native runs first (no instruction-set cap in their environment), then by date.
    return sorted(found, key=lambda r: (bool(r.j["provenance"].get("env")), r.j["date_utc"]))


def render_table(found: List[Run]) -> str:
    blocks = [render_block(r) for r in found]
    blocks.append(wrap(f"Not measured: {NOT_MEASURED}."))
    return "\n\n".join(blocks)


def render_opening(found: List[Run]) -> str:
    native = [r for r in found if not r.j["provenance"].get("env")]
    if not native:
        raise SystemExit("render_readme.py: no native peers.json (without an instruction-set cap) to quote")
    r = native[-1]
    pos = r.positions()
    lo, hi = pos[0], pos[-1]
    llama = r.best(["llama-f32", "llama-f32-fa"], lambda e: r.decode(e, lo), True)[1]
    rss_t, rss_l = r.rss("tost"), r.best(["llama-f32", "llama-f32-fa"], r.rss, True)[0]
    cpu = cpu_name(r.j)
    article = "an" if cpu[:1].lower() in "aeio" else "a"
    text = (f"On one core of {article} {cpu} ({r.label}), {MODEL_WORDS} decodes in "
            f"**{fmt(r.decode('tost', lo), 'ms')} ms at position {lo} and "
            f"{fmt(r.decode('tost', hi), 'ms')} ms at {hi}** (fp32; llama-server on a same-size GPT-2: "
            f"{fmt(r.decode(llama, lo), 'ms')} → {fmt(r.decode(llama, hi), 'ms')} ms)")
    if rss_t is not None and rss_l is not None:
        text += (f", and a session at position {r.m['session_rss_tokens']} holds **{rss_t:.3f} MiB** of "
                 f"server memory against llama-server's **{rss_l:.1f} MiB**")
    return wrap(text + f" ([{r.j['date_utc'][:10]}](#performance-on-a-cpu)).")


def replace_region(text: str, name: str, body: str) -> str:
    start = START.format(name)
    i = text.find(start)
    j = text.find(END, i + len(start)) if i >= 0 else -1
    if i < 0 or j < 0:
        raise SystemExit(f"render_readme.py: README.md has no region {start} ... {END}")
    return text[:i + len(start)] + "\n" + body + "\n" + text[j:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if README.md differs from the render")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--perf", default=os.path.join(ROOT, "docs", "perf"), help="where the raw files are")
    args = ap.parse_args()
    with open(args.readme, encoding="utf-8") as f:
        old = f.read()
    found = runs(args.perf)
    new = replace_region(old, "opening", render_opening(found))
    new = replace_region(new, "table", render_table(found))
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       "README.md", "rendered"))
            print("render_readme.py --check: README.md differs from the raw files; run "
                  "tools/bench/peers/render_readme.py", file=sys.stderr)
            return 1
        print(f"render_readme.py --check: README.md matches {len(found)} peer run(s)")
        return 0
    if new != old:
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"render_readme.py: {'wrote' if new != old else 'unchanged'} {args.readme} from {len(found)} peer run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
