#!/usr/bin/env python3
"""Fails when the docs link to, or a comment or doc names, a repository path that does not exist.

  scripts/check-doc-paths.py            # from anywhere; checks the checkout it lives in

Two checks, over the files git tracks (plus new files not yet added, minus ignored ones):
  links  every relative Markdown link in README.md, docs/**/*.md, client/python/README.md and
         deploy/**/*.md resolves to a file or folder, and its #anchor, if any, to a heading of the
         Markdown file it points at (GitHub's heading ids).
  paths  every repository path in a comment of the C++, CUDA, proto, Python, CMake, shell,
         Dockerfile and YAML sources, or in `code` or a code block of those docs, exists. A
         repository path is a token that starts with a top-level folder (model/, service/, ...,
         see TOP_LEVEL) not preceded by a path character, so build/service/tost_server and
         ../model/x are not taken for one; a token with a placeholder (<, *, {, $, ...) is a
         pattern, not a path, and is skipped; a Python name passes when its module exists
         (tools/tost_reference.load_model). A program in a build tree
         (build/tests/bench/tssa_bench) must be an add_executable of its source folder's
         CMakeLists.txt (tests/bench), so a renamed target shows.
Each failure is one line `file:line: what`. Paths that are right but do not exist in a checkout
(examples, build outputs) go in ALLOWED with the reason. Standard library only.
"""
from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOP_LEVEL = ("base", "imaging", "model", "service", "kernels", "tests", "tools", "scripts", "docs",
             "deploy", "client", "proto", "cmake", "models")

# Named on purpose although no checkout has them: path -> why.
ALLOWED: dict[str, str] = {
    "deploy/session.key": "a secret each deployment creates for docker compose (.gitignore)",
    "deploy/redis.password": "a secret each deployment creates for docker compose (.gitignore)",
    "deploy/k8s/base/session.key": "a secret each deployment creates for kustomize (.gitignore)",
    "deploy/k8s/components/session-store/redis.password":
        "a secret each deployment creates for kustomize (.gitignore)",
    "cmake/Codegen.cmake": "PyTorch's file, named for the compiler flags copied from it",
}

DOC_PATTERNS = (re.compile(r"^README\.md$"), re.compile(r"^docs/.*\.md$"),
                re.compile(r"^client/python/README\.md$"), re.compile(r"^deploy/.*\.md$"))
C_LIKE = (".cc", ".h", ".cu", ".cuh", ".proto")
HASH_COMMENTED = (".sh", ".cmake", ".yml", ".yaml", ".flags")
HASH_COMMENTED_NAMES = ("CMakeLists.txt", "Makefile", "Dockerfile", "Dockerfile.cuda",
                        ".dockerignore", ".gitignore", "requirements.txt",
                        "requirements-test.txt", "requirements-deploy.txt")

PATH_RE = re.compile(r"(?<![\w./~@:-])(?:%s)/[\w./<>*{}$@+~-]*" % "|".join(TOP_LEVEL))
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")
ALLOWED_SEEN: set[str] = set()
# A program in a build tree (build/, build-tsan/, ...), which mirrors the source tree.
BUILT_RE = re.compile(r"(?<![\w./~@:-])build(?:-\w+)?/([\w./-]+)")


def repo_files() -> list[str]:
    # What git lists, not what is on disk: build outputs and venvs in the checkout must neither be
    # checked nor make a stale reference look right.
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"check-doc-paths: needs git and a checkout to list the files ({e})")
    return [f for f in out.decode().split("\0") if f and os.path.exists(os.path.join(ROOT, f))]


class Index:
    """The checkout's files and the folders that hold them."""

    def __init__(self, files: list[str]):
        self.files = set(files)
        self.dirs = {""}
        for f in files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                self.dirs.add("/".join(parts[:i]))

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path).replace(os.sep, "/")
        return path in self.files or path in self.dirs


# ---- Markdown -------------------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def markdown_lines(text: str):
    """(line number, line, inside a fenced code block) for every line."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
                yield n, line, True
                continue
            if m.group(1).startswith(fence):
                fence = None
                yield n, line, True
                continue
        yield n, line, fence is not None


def heading_ids(text: str) -> set[str]:
    """The ids GitHub gives the headings of a Markdown file (lower case, punctuation dropped,
    spaces to hyphens, -1, -2, ... on repeats)."""
    ids: set[str] = set()
    seen: dict[str, int] = {}
    for _, line, in_code in markdown_lines(text):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_code or not m:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # links -> their text
        title = re.sub(r"<[^>]+>", "", title).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")


def check_markdown(path: str, text: str, index: Index, problems: list[str]) -> None:
    here = os.path.dirname(path)
    for n, line, in_code in markdown_lines(text):
        if in_code:  # commands and listings: the whole line is code
            check_paths(path, n, line, index, problems)
            continue
        spans = CODE_SPAN.findall(line)
        prose = CODE_SPAN.sub("", line)
        targets = LINK.findall(prose)
        ref = REF_DEF.match(prose)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            check_link(path, n, here, target, text, index, problems)
        for _, span in spans:
            check_paths(path, n, span, index, problems)


def check_link(path, n, here, target, text, index, problems) -> None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
        return  # http:, mailto: ...: not a file of this repository
    file_part, _, anchor = target.partition("#")
    file_part = urllib.parse.unquote(file_part)
    if file_part:
        resolved = os.path.normpath(os.path.join(here, file_part)).replace(os.sep, "/")
        if resolved.startswith("../") or not index.exists(resolved):
            problems.append(f"{path}:{n}: link to a missing file: {target}")
            return
    else:
        resolved = path
    if anchor and resolved.endswith(".md") and resolved in index.files:
        target_text = text if resolved == path else read(resolved)
        if urllib.parse.unquote(anchor).lower() not in heading_ids(target_text):
            problems.append(f"{path}:{n}: link to a missing heading: {target}")


# ---- source comments ------------------------------------------------------------------------

def c_comments(text: str):
    """(line, comment text) for the // and /* */ comments of C++, CUDA and proto sources."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield line, text[i + 2:end]
            i = end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                yield line + k, part
            line += text.count("\n", i, end)
            i = end + 2
            continue
        elif text.startswith('R"', i) and re.match(r'R"([^(\s]*)\(', text[i:]):
            delim = re.match(r'R"([^(\s]*)\(', text[i:]).group(1)
            end = text.find(")" + delim + '"', i)
            end = n if end < 0 else end
            line += text.count("\n", i, end)
            i = end + len(delim) + 2
            continue
        elif c in "\"'":
            # A string or character literal: skip it, escapes included ('"' and "//" are not
            # comments). A ' between digits is a digit separator (60'000), not a literal.
            if c == "'" and i > 0 and text[i - 1].isalnum():
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        i += 1


def hash_comments(text: str):
    """(line, comment text) for shell, CMake and Makefile sources: a # at a line's start or after
    a space ("${#array[@]}" and "a#b" are not comments)."""
    for n, line in enumerate(text.splitlines(), 1):
        m = re.search(r"(?:^|\s)#(.*)$", line)
        if m and not line.lstrip().startswith("#!"):
            yield n, m.group(1)


def python_comments(text: str):
    """(line, text) for the # comments and the docstrings of a Python source."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
    except (tokenize.TokenError, SyntaxError):
        pass
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                for k, part in enumerate(body[0].value.value.split("\n")):
                    yield body[0].lineno + k, part


def check_paths(path: str, n: int, text: str, index: Index, problems: list[str]) -> None:
    for m in PATH_RE.finditer(text):
        token = m.group(0)
        if PLACEHOLDER.search(token):
            continue  # a pattern (tests/fuzz/corpus/<target>, service/api/*.cc), not a path
        token = re.sub(r"(:\d+)+$", "", token.rstrip(".,:;"))  # sentence end, file:line
        if token in ALLOWED:
            ALLOWED_SEEN.add(token)
            continue
        if index.exists(token):
            continue
        module = re.match(r"^(.*)\.\w+$", token)
        if module and index.exists(module.group(1) + ".py"):
            continue  # a Python name: tools/tost_reference.load_model
        problem = f"{path}:{n}: no such path: {token}"
        if problem not in problems:
            problems.append(problem)
    for m in BUILT_RE.finditer(text):
        folder, _, name = m.group(1).rstrip(".,:;").rpartition("/")
        cmake = f"{folder}/CMakeLists.txt"
        if "." in name or cmake not in index.files:
            continue  # not a program of a source folder: build/deps.env, build/perf/DATE
        if not re.search(r"add_executable\(\s*%s[\s)]" % re.escape(name), read(cmake)):
            problem = f"{path}:{n}: {cmake} builds no program {name}: {m.group(0)}"
            if problem not in problems:
                problems.append(problem)


def read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def main() -> int:
    if len(sys.argv) > 1:
        print(__doc__, end="")
        return 0 if sys.argv[1] in ("-h", "--help") else 2
    files = repo_files()
    index = Index(files)
    problems: list[str] = []
    checked = 0
    for rel in sorted(files):
        base = os.path.basename(rel)
        if any(p.match(rel) for p in DOC_PATTERNS):
            check_markdown(rel, read(rel), index, problems)
        elif rel.endswith(C_LIKE):
            for n, text in c_comments(read(rel)):
                check_paths(rel, n, text, index, problems)
        elif rel.endswith(".py"):
            for n, text in python_comments(read(rel)):
                check_paths(rel, n, text, index, problems)
        elif rel.endswith(HASH_COMMENTED) or base in HASH_COMMENTED_NAMES or rel == ".ci/run":
            for n, text in hash_comments(read(rel)):
                check_paths(rel, n, text, index, problems)
        else:
            continue
        checked += 1
    for path in sorted(set(ALLOWED) - ALLOWED_SEEN):
        problems.append(f"scripts/check-doc-paths.py: ALLOWED names {path}, which nothing names "
                        f"any more: remove it")
    for line in problems:
        print(line)
    if problems:
        print(f"check-doc-paths: {len(problems)} stale references in {checked} files: fix the "
              f"reference (or, for an example or build output, add it to ALLOWED in "
              f"scripts/check-doc-paths.py with the reason)")
        return 1
    print(f"check-doc-paths: {checked} files, every link and repository path resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
