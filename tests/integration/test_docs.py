"""The documentation's commands, run: every fenced block marked runnable in README.md and docs/*.md.

A block whose info string is `sh runnable` or `python runnable` (GitHub renders it by its first
word) is a command the docs promise works. test_runnable_block (ctest doc_commands, label
integration) runs each one against a real tost_server (RunningServer, serving models/ on a free
port) in a scratch copy of the checkout, so nothing is written into the source tree:

  - the documented addresses are rewritten: 127.0.0.1:8500 and localhost:8500 to the test server's,
    127.0.0.1:8502 and localhost:8502 to its metrics endpoint, 127.0.0.1:8501 and localhost:8501 to
    its HTTP front end;
  - build/client/tost_cli there is a wrapper of the built tost_cli that adds --server=<the test
    server> to a command that names none (tost_cli's default is 127.0.0.1:8500), and
    build/service/tost_server the built server;
  - `python` and `pip` are a scratch virtual environment that sees this interpreter's packages
    (pip, grpcio, grpcio-tools, setuptools, numpy, tritonclient) through a .pth file, with
    tost-client installed into it from the copy, so `pip install ./client/python` works offline;
  - sh blocks run with `bash -euo pipefail`, python blocks with that environment's python, in the
    scratch copy, in file order, each with a timeout; a failure names the file and line of the
    block and shows its output.

The unit checks (ctest doc_layout, label unit) need no server: README.md stays within 15 KB, no
file the test does not scan has a block marked runnable (it would never run), and no marker is
misspelt or on a language the test cannot run.
"""
import glob
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile

import pytest

from conftest import SOURCE_DIR, RunningServer

README_LIMIT_BYTES = 15 * 1024
MARKER = "runnable"
LANGUAGES = ("sh", "python")
BLOCK_TIMEOUT_S = 300
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
# Documented address -> which of the test server's it becomes.
ADDRESSES = {"127.0.0.1:8500": "grpc", "localhost:8500": "grpc",
             "127.0.0.1:8502": "metrics", "localhost:8502": "metrics",
             "127.0.0.1:8501": "http", "localhost:8501": "http"}


def scanned_files():
    """The files whose runnable blocks are run, relative to SOURCE_DIR."""
    return ["README.md"] + sorted(os.path.relpath(p, SOURCE_DIR)
                                  for p in glob.glob(os.path.join(SOURCE_DIR, "docs", "*.md")))


def fenced_blocks(text):
    """(line of the opening fence, info string, body) for every fenced code block."""
    out, fence, start, info, body = [], None, 0, "", []
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, start, info, body = m.group(1), n, m.group(2).strip(), []
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            out.append((start, info, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line)
    return out


def runnable_blocks():
    """(file, line, language, body) of every runnable block of the scanned files, in file order."""
    blocks = []
    for rel in scanned_files():
        with open(os.path.join(SOURCE_DIR, rel), encoding="utf-8") as f:
            for line, info, body in fenced_blocks(f.read()):
                words = info.split()
                if MARKER in words[1:]:
                    blocks.append((rel, line, words[0], body))
    return blocks


def tracked_files():
    """What git lists in the checkout (tracked, and new files not ignored); without git, every file
    outside build trees and .git."""
    try:
        out = subprocess.run(["git", "-C", SOURCE_DIR, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout.decode()
        return [f for f in out.split("\0") if f and os.path.isfile(os.path.join(SOURCE_DIR, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(SOURCE_DIR):
            dirs[:] = [d for d in dirs if d != ".git" and not d.startswith("build")]
            files += [os.path.relpath(os.path.join(root, n), SOURCE_DIR) for n in names]
        return files


# ---- unit checks --------------------------------------------------------------------------------

def test_readme_fits_the_limit():
    size = os.path.getsize(os.path.join(SOURCE_DIR, "README.md"))
    assert size <= README_LIMIT_BYTES, (
        f"README.md is {size} bytes, over its {README_LIMIT_BYTES}-byte limit: move detail into docs/")


def test_no_marker_outside_the_scanned_files():
    scanned = set(scanned_files())
    stray = []
    for rel in tracked_files():
        if not rel.endswith((".md", ".markdown")) or rel in scanned:
            continue
        with open(os.path.join(SOURCE_DIR, rel), encoding="utf-8", errors="replace") as f:
            stray += [f"{rel}:{line}: ```{info}" for line, info, _ in fenced_blocks(f.read())
                      if MARKER in info.split()[1:]]
    assert not stray, ("blocks marked runnable in files test_docs.py does not scan (README.md, docs/*.md), "
                       "so they would never run:\n" + "\n".join(stray))


def test_markers_are_spelt_right_and_runnable():
    problems = []
    for rel in scanned_files():
        with open(os.path.join(SOURCE_DIR, rel), encoding="utf-8") as f:
            for line, info, _ in fenced_blocks(f.read()):
                words = info.split()
                for w in words[1:]:
                    if w != MARKER and re.fullmatch(r"run\w*|\w*nn?able", w):
                        problems.append(f"{rel}:{line}: '{w}' in ```{info}: did you mean '{MARKER}'?")
                if MARKER in words[1:] and words[0] not in LANGUAGES:
                    problems.append(f"{rel}:{line}: ```{info}: only {', '.join(LANGUAGES)} blocks can run")
                if words[:1] == [MARKER]:
                    problems.append(f"{rel}:{line}: ```{info}: the language comes first (```sh {MARKER})")
    assert not problems, "\n".join(problems)


def test_the_readme_has_runnable_blocks():
    assert any(rel == "README.md" for rel, *_ in runnable_blocks()), "README.md has no runnable block"


# ---- the blocks, run ----------------------------------------------------------------------------

CLI_WRAPPER = """#!/usr/bin/env bash
# test_docs.py: the built tost_cli, pointed at the test server unless the command names one.
real={real}
case "${{1:-}}" in models|classify|generate) ;; *) exec "$real" "$@" ;; esac
for a in "$@"; do case "$a" in --server|--server=*|--help|-h|--helpfull) exec "$real" "$@" ;; esac; done
exec "$real" "$@" --server={address}
"""


def _binary(var):
    path = os.environ.get(var)
    if not path or not os.path.exists(path):
        pytest.fail(f"{var} must point at the built binary (run through ctest)")
    return os.path.abspath(path)


@pytest.fixture(scope="module")
def docs_env():
    """The server, the scratch copy of the checkout and the environment the blocks run in."""
    server_bin, cli_bin = _binary("TOST_SERVER_BIN"), _binary("TOST_CLI_BIN")
    server = RunningServer(os.path.join(SOURCE_DIR, "models"))
    scratch = tempfile.mkdtemp(prefix="tost_docs_")
    try:
        work = os.path.join(scratch, "checkout")
        for rel in tracked_files():
            os.makedirs(os.path.dirname(os.path.join(work, rel)), exist_ok=True)
            shutil.copy2(os.path.join(SOURCE_DIR, rel), os.path.join(work, rel), follow_symlinks=False)
        os.makedirs(os.path.join(work, "build", "client"))
        os.makedirs(os.path.join(work, "build", "service"))
        cli = os.path.join(work, "build", "client", "tost_cli")
        with open(cli, "w") as f:
            f.write(CLI_WRAPPER.format(real=cli_bin, address=server.address))
        os.chmod(cli, 0o755)
        os.symlink(server_bin, os.path.join(work, "build", "service", "tost_server"))
        deps_env = os.path.join(os.path.dirname(os.path.dirname(server_bin)), "deps.env")
        if os.path.exists(deps_env):
            shutil.copy(deps_env, os.path.join(work, "build", "deps.env"))

        venv = os.path.join(scratch, "venv")
        # Without a pip of its own (ensurepip's would bring an old setuptools that shadows this
        # interpreter's): this interpreter's pip, through the .pth, installs into the new prefix.
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, capture_output=True,
                       timeout=120)
        (venv_site,) = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))
        with open(os.path.join(venv_site, "tost_docs_parent.pth"), "w") as f:
            f.write("\n".join(site.getsitepackages()) + "\n")
        for name in ("pip", "pip3"):
            with open(os.path.join(venv, "bin", name), "w") as f:
                f.write('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
            os.chmod(os.path.join(venv, "bin", name), 0o755)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=venv,
                   PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_CACHE_DIR=os.path.join(scratch, "pip-cache"),
                   TOST_CLIENT_CACHE_DIR=os.path.join(scratch, "stub-cache"), PYTHONDONTWRITEBYTECODE="1")
        p = subprocess.run(["python", "-m", "pip", "install", "-q", "./client/python"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert p.returncode == 0, f"installing tost-client into the scratch venv failed:\n{p.stdout}\n{p.stderr}"
        addresses = {"grpc": server.address, "metrics": f"127.0.0.1:{server.metrics_port}",
                     "http": f"127.0.0.1:{server.http_port}"}
        yield {"work": work, "env": env, "scratch": scratch,
               "addresses": {doc: addresses[kind] for doc, kind in ADDRESSES.items()}}
    finally:
        assert server.stop() == 0, "tost_server did not exit cleanly on SIGTERM"
        shutil.rmtree(scratch, ignore_errors=True)


BLOCKS = runnable_blocks()


@pytest.mark.parametrize("rel,line,language,body", BLOCKS, ids=[f"{rel}:{line}" for rel, line, *_ in BLOCKS])
def test_runnable_block(docs_env, rel, line, language, body):
    for documented, actual in docs_env["addresses"].items():
        body = body.replace(documented, actual)
    name = re.sub(r"\W", "_", rel)
    script = os.path.join(docs_env["scratch"], f"block_{name}_{line}")
    with open(script, "w") as f:
        f.write(body)
    cmd = ["bash", "-euo", "pipefail", script] if language == "sh" else ["python", script]
    try:
        p = subprocess.run(cmd, cwd=docs_env["work"], env=docs_env["env"], capture_output=True, text=True,
                           timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{rel}:{line}: the {language} block ran past {BLOCK_TIMEOUT_S} s\n"
                    f"--- stdout\n{e.stdout}\n--- stderr\n{e.stderr}", pytrace=False)
    if p.returncode != 0:
        pytest.fail(f"{rel}:{line}: the {language} block exited {p.returncode}\n--- block (addresses rewritten)\n"
                    f"{body}--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}", pytrace=False)
