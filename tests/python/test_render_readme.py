"""tools/bench/peers/render_readme.py: README.md's CPU table and opening figures are what the
committed raw files render (so the README cannot drift from them), and the render's rules hold on a
synthetic run: the best of flash attention off and on, targets met and missed, a missed target
without a reason refused."""

import copy
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "bench", "peers", "render_readme.py")
sys.path.insert(0, os.path.dirname(SCRIPT))

import render_readme  # noqa: E402

ENGINES = ["tost", "tost-int8", "llama-f32", "llama-f32-fa", "llama-q8_0", "llama-q8_0-fa", "ct2-float32",
           "ct2-int8"]


def run_json():
    def by_engine(tost, tost8, peer):
        return {"tost": tost, "tost-int8": tost8, "llama-f32": peer, "llama-f32-fa": peer * 0.9,
                "llama-q8_0": peer, "llama-q8_0-fa": peer * 1.1, "ct2-float32": peer * 1.2, "ct2-int8": peer}

    return {
        "engines": ENGINES, "isa_class": "Test class", "date_utc": "2026-11-29 12:00:00Z",
        "machine": {"cpu_model": "Test CPU @ 2.0GHz"},
        "provenance": {"commit": "0123456789abcdef", "cpu_flags": ["avx2", "fma", "f16c", "sse4_2"], "env": {},
                       "start": {"uptime": "12:00:00 up 1:00,  0 users,  load average: 0.10, 0.20, 0.30"}},
        "models": {"bench-lm": {
            "prefill_len": 4000,
            "decode_ms": {"100": by_engine(1.0, 0.5, 2.0), "4000": by_engine(1.0, 0.5, 6.0)},
            "prefill_tps": by_engine(4000.0, 1000.0, 1000.0),
            "streams": {"16": {n: {e: {"tokens_per_s": v} for e, v in by_engine(*x).items()}
                               for n, x in (("1", (300.0, 900.0, 400.0)), ("64", (3000.0, 9000.0, 1000.0)))}},
            "session_rss_tokens": 4000,
            "session_rss": {"tost": {"mib_per_session": 0.018}, "llama-f32": {"mib_per_session": 37.9}},
        }},
    }


def write_run(tmp_path, j, misses=None, name="2026-11-29-peers-test"):
    d = tmp_path / "perf" / name
    d.mkdir(parents=True)
    (d / "peers.json").write_text(json.dumps(j))
    if misses is not None:
        (d / "misses.json").write_text(json.dumps(misses))
    return render_readme.Run(str(d / "peers.json"))


def test_the_readme_matches_the_raw_files():
    r = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr


def test_targets_take_the_best_peer_and_the_better_flash_attention(tmp_path):
    run = write_run(tmp_path, run_json(), misses={"int8 prefill": "a reason"})
    met, missed = render_readme.targets(run)
    met, missed = dict(met), dict(missed)
    # fp32 decode at 100: 1.0 against llama f32 with flash attention on, 1.8.
    assert "fp32 decode @100" in met and "1.80x" in met["fp32 decode @100"] and "llama-f32-fa" in met["fp32 decode @100"]
    # int8 prefill: 1000 against q8_0 with flash attention on, 1100: below 2x.
    assert list(missed) == ["int8 prefill"]
    block = " ".join(render_readme.render_block(run).split())  # the paragraphs are wrapped
    assert "int8 prefill (0.91x the best peer, llama-q8_0-fa): a reason" in block
    assert "1.80\\*" in block and "`avx2 fma f16c`, no AMX" in block and "commit `0123456`" in block


def test_a_missed_target_needs_a_reason(tmp_path):
    run = write_run(tmp_path, run_json())
    with pytest.raises(SystemExit, match="int8 prefill"):
        render_readme.render_block(run)


def test_regions_are_replaced_and_checked(tmp_path):
    write_run(tmp_path, run_json(), misses={"int8 prefill": "a reason"})
    capped = copy.deepcopy(run_json())
    capped["provenance"]["env"] = {"ATEN_CPU_CAPABILITY": "avx2"}
    capped["isa_class"] = "Capped class"
    write_run(tmp_path, capped, misses={"int8 prefill": "a reason"}, name="2026-11-29-peers-capped")
    readme = tmp_path / "README.md"
    readme.write_text("# t\n\n<!-- render_readme.py opening -->\nstale\n<!-- /render_readme.py -->\n\n"
                      "<!-- render_readme.py table -->\n<!-- /render_readme.py -->\n")
    args = [sys.executable, SCRIPT, "--readme", str(readme), "--perf", str(tmp_path / "perf")]
    assert subprocess.run(args + ["--check"], capture_output=True).returncode == 1
    subprocess.run(args, check=True, capture_output=True)
    assert subprocess.run(args + ["--check"], capture_output=True).returncode == 0
    text = " ".join(readme.read_text().split())  # the paragraphs are wrapped
    assert "stale" not in text
    # The native run first, and it alone is quoted in the opening.
    assert text.index("**Test class**") < text.index("**Capped class**")
    assert "decodes in **1.00 ms at position 100 and 1.00 ms at 4000**" in text
    assert "**0.018 MiB** of server memory against llama-server's **37.9 MiB**" in text
    assert "Not measured:" in text
