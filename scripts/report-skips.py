#!/usr/bin/env python3
"""Prints every skip of a ctest run with its reason, from the JUnit file ctest wrote
(--output-junit; `make test` runs this after ctest, pass or fail).

ctest shows a passing test's output only in its log files, so a skip inside one (a pytest case of
server_end_to_end, a GoogleTest case of the emulated kernels or of a sanitizer build) never reached
CI's log, and ctest's summary names the tests it counts as skipped without their reason. Read
here: the tests ctest skipped (SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION) with the line of their
output that says why, pytest's -ra summary lines (SKIPPED [n] file:line: reason), GoogleTest's
"file:line: Skipped" and the line after it, and the "skipped (Nx): ..." lines of
scripts/run-sanitizers.sh. ctest must keep whole outputs of passed tests in the file
(--test-output-size-passed; by default it cuts them at 1 KB).

  scripts/report-skips.py JUNIT_FILE
"""
import os
import re
import sys
import xml.etree.ElementTree as ET


def skips_in(output):
    """(where, reason) of every skip in one test's output, each once."""
    found = []
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"SKIPPED \[\d+\] (\S+?): (.*)$", line)
        if m:
            found.append((m.group(1), m.group(2)))
            continue
        m = re.match(r"(\S+:\d+): Skipped$", line)
        if m:
            reason = lines[i + 1].strip() if i + 1 < len(lines) else ""
            found.append((m.group(1), "(no reason given)" if reason.startswith("[  SKIPPED ]") else reason))
            continue
        m = re.match(r" +skipped \((\d+)x\): (\S+:\d+): Skipped (.*)$", line)
        if m:
            found.append((m.group(2), f"{m.group(3)} ({m.group(1)}x)"))
    return list(dict.fromkeys(found))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/report-skips.py JUNIT_FILE")
    path = sys.argv[1]
    if not os.path.exists(path):
        print(f"report-skips: no {path}: ctest wrote no results")
        return
    report = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        output = (case.findtext("system-out") or "")
        found = skips_in(output)
        skipped = case.find("skipped")
        if skipped is not None and not found:
            # A whole test skipped: the first line of its output that says so, else its last line.
            lines = [line.strip() for line in output.splitlines() if line.strip()]
            why = next((line for line in lines if "skip" in line.lower()),
                       lines[-1] if lines else skipped.get("message", ""))
            found = [("", why)]
        for where, reason in found:
            report.append(f"  {name}: {where + ': ' if where else ''}{reason}")
    print(f"=== [test] skips, with their reasons ({len(report)}):")
    print("\n".join(report) if report else "  none")


if __name__ == "__main__":
    main()
