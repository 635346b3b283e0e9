#!/usr/bin/env python3
"""Fails when the build directory's ctest registration differs from tests/expected-tests.txt.

A test that needs a tool (promtool, nginx, redis-server, XGrammar's source, CUDA) is registered
only where CMake finds it, and says so on a STATUS line nobody reads in CI: without this check, a
machine whose install-deps.sh lost a package runs fewer tests and still passes. So `make test`
(ctest expected_tests) compares what `ctest --show-only=json-v1` lists with the committed list:

  - a listed test that is not registered fails, named, unless every tool it needs is one the
    configure was told may be missing (--without; TOST_EXPECTED_TESTS_WITHOUT);
  - a registered test that is not listed fails too, so that a new test is listed and cannot
    vanish unnoticed later;
  - GoogleTest cases are listed by binary (gtest:<binary>): each must contribute cases (a binary
    that is not built yet shows up as its <binary>_NOT_BUILT placeholder, which fails on its own);
  - the label `slow` (left out of `make test`) must be on exactly the tests listed as slow;
  - every pytest run must print its skips with their reasons (-rs, -ra or -rA), or a skip in a
    suite of hundreds of cases goes unseen.

  scripts/check-expected-tests.py --build DIR [--list FILE] [--ctest CTEST] [--without TOOL]...
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def shown(path):
    """`path` relative to the repository when it is inside it."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return path if rel.startswith("..") else rel
TOOLS = {"promtool", "nginx", "redis", "xgrammar", "cuda"}
TAGS = TOOLS | {"slow"}


def read_list(path):
    """{name: set of tags}; gtest binaries as gtest:<binary>."""
    expected = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            name, tags = words[0], set(words[1:])
            if tags - TAGS or name in expected:
                sys.exit(f"{path}:{number}: " + (f"unknown tag(s) {sorted(tags - TAGS)} (known: {sorted(TAGS)})"
                                                 if tags - TAGS else f"{name} is listed twice"))
            expected[name] = tags
    return expected


def registered(ctest, build):
    """{name: (command, labels)} of every test the build directory registers."""
    out = subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"ctest --show-only=json-v1 failed in {build}:\n{out.stderr}")
    tests = {}
    for t in json.loads(out.stdout)["tests"]:
        labels = [v for p in t.get("properties", []) if p["name"] == "LABELS" for v in p["value"]]
        tests[t["name"]] = (t.get("command", []), labels)
    return tests


def gtest_binary(name, command):
    """The binary of a GoogleTest case (gtest_discover_tests), or None for any other test."""
    if any(a.startswith("--gtest_filter=") for a in command[1:]):
        return os.path.basename(command[0])
    # A binary not built yet: gtest_discover_tests registers <binary>_NOT_BUILT, which runs a
    # command of that name (ctest lists none, as it does not exist) and so fails on its own.
    m = re.fullmatch(r"(.+)_NOT_BUILT", name)
    if m and (not command or os.path.basename(command[0]) == name):
        return m.group(1)
    return None


def shows_skips(command):
    """Whether a pytest command line prints the skip summary (-r with s, a or A)."""
    for i, a in enumerate(command):
        if a == "-r" and i + 1 < len(command) and re.search("[saA]", command[i + 1]):
            return True
        if re.fullmatch(r"-r[a-zA-Z]*[saA][a-zA-Z]*", a):
            return True
    return False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True, help="the build directory ctest reads")
    p.add_argument("--list", default=os.path.join(ROOT, "tests", "expected-tests.txt"))
    p.add_argument("--ctest", default="ctest")
    p.add_argument("--without", action="append", default=[], metavar="TOOL",
                   help=f"a tool the configure may lack ({', '.join(sorted(TOOLS))}); "
                        "repeatable, or comma- or semicolon-separated")
    args = p.parse_args()
    without = {w for arg in args.without for w in re.split("[,;]", arg) if w}
    if without - TOOLS:
        sys.exit(f"--without takes {', '.join(sorted(TOOLS))}; got {', '.join(sorted(without - TOOLS))}")

    expected = read_list(args.list)
    tests = registered(args.ctest, args.build)
    plain, binaries = {}, {}
    for name, (command, labels) in tests.items():
        binary = gtest_binary(name, command)
        if binary:
            binaries.setdefault(binary, []).append(name)
        else:
            plain[name] = (command, labels)
    present = set(plain) | {f"gtest:{b}" for b in binaries}

    failures, left_out = [], []
    for name, tags in sorted(expected.items()):
        if name in present:
            continue
        needs = tags & TOOLS
        if needs & without:
            left_out.append(f"{name} (needs {', '.join(sorted(needs))})")
        else:
            why = (f"; it needs {', '.join(sorted(needs))}, which the configure did not find "
                   "(scripts/install-deps.sh installs them)" if needs else "")
            failures.append(f"missing: {name} is in {shown(args.list)} but not registered{why}")
    for name in sorted(present - set(expected)):
        failures.append(f"not listed: {name} is registered but not in {shown(args.list)}: add a line "
                        "for it (with the tools it needs, and `slow` if `make test` leaves it out)")
    for name, (command, labels) in sorted(plain.items()):
        if name in expected and ("slow" in labels) != ("slow" in expected[name]):
            failures.append(f"label: {name} is " + ("labelled slow (left out of `make test`) but not listed as slow"
                                                    if "slow" in labels else
                                                    "listed as slow but not labelled slow: `make test` runs it"))
        if "pytest" in command and not shows_skips(command):
            failures.append(f"skips unseen: {name} runs pytest without -rs or -ra, so its skips and their "
                            "reasons are not printed")

    cases = sum(len(v) for v in binaries.values())
    print(f"{len(tests)} tests registered in {args.build}: {len(plain)} by name and {cases} GoogleTest cases "
          f"of {len(binaries)} binaries; {len(expected)} entries in {shown(args.list)}")
    for line in left_out:
        print(f"left out, as --without allows: {line}")
    for line in failures:
        print(f"FAIL: {line}")
    if failures:
        sys.exit(1)
    print("every expected test is registered, every registered test is listed, and every pytest run "
          "prints its skips")


if __name__ == "__main__":
    main()
