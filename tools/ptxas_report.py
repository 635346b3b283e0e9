#!/usr/bin/env python3
"""Reads nvcc output compiled with -Xptxas=-v on stdin, prints registers, shared memory and spills
of every kernel per architecture, and exits 1 if any kernel spills or if no ptxas report was seen.

  ninja -C build <a kernels/cuda/*.cu.o target> 2>&1 | tools/ptxas_report.py
"""
import re
import subprocess
import sys

FUNC = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def demangle(names):
    """Readable kernel names via c++filt (binutils), shortened to the function and its template args."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        readable = out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        readable = list(names)
    return {n: re.sub(r"\(anonymous namespace\)::|tost::kernels::gpu::", "", r).split("(")[0]
            for n, r in zip(names, readable)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    rows, current = [], None
    for line in sys.stdin:
        if m := FUNC.search(line):
            current = {"kernel": m.group(1), "arch": m.group(2), "spill_st": 0, "spill_ld": 0, "regs": 0, "smem": 0}
            rows.append(current)
        elif current and (m := SPILL.search(line)):
            current["stack"], current["spill_st"], current["spill_ld"] = map(int, m.groups())
        elif current and (m := USED.search(line)):
            current["regs"] = int(m.group(1))
            current["smem"] = int(m.group(2) or 0)
    if not rows:
        print("ptxas_report: no ptxas report found (was the .cu compiled with -Xptxas=-v?)")
        return 1
    names = demangle([r["kernel"] for r in rows])
    print(f"{'arch':6} {'regs':>5} {'smem':>6} {'spill st':>9} {'spill ld':>9}  kernel")
    for r in sorted(rows, key=lambda r: (r["arch"], names[r["kernel"]])):
        print(f"{r['arch']:6} {r['regs']:5d} {r['smem']:6d} {r['spill_st']:9d} {r['spill_ld']:9d}  {names[r['kernel']][:100]}")
    spilling = [r for r in rows if r["spill_st"] or r["spill_ld"]]
    archs = sorted({r["arch"] for r in rows})
    print(f"ptxas_report: {len(rows)} kernel builds over {', '.join(archs)}; {len(spilling)} spill")
    return 1 if spilling else 0


if __name__ == "__main__":
    sys.exit(main())
