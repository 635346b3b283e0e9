"""tost_cli as a new user meets it: `--help` of the program and of every command names each flag
the command takes with its default and meaning, a mistake on the command line is one line on stderr
with exit status 2, and a wrong server address, an unknown model and a server still loading its
models are each one line on stderr saying what happened and what to do, with the exit status the
help documents for the class (3 unreachable, 4 not found, 5 unavailable)."""
import os
import re
import socket
import subprocess

import numpy as np
import pytest

from conftest import SOURCE_DIR, HeldLoading, _binary, port_while_loading
import tost_launch  # tools/pylib, on sys.path once conftest is imported

MODELS = os.path.join(SOURCE_DIR, "models")
USAGE, UNREACHABLE, NOT_FOUND, UNAVAILABLE = 2, 3, 4, 5

# Every flag each command takes, in the order its help lists them.
COMMAND_FLAGS = {
    "models": ["server", "timeout_s"],
    "classify": ["server", "timeout_s", "model", "image", "input", "top_k", "membership_png"],
    "generate": ["server", "timeout_s", "model", "prompt", "prompt_tokens", "max_new_tokens", "temperature", "top_k",
                 "top_p", "seed", "json_schema", "regex", "grammar", "choice", "resume", "state_every_tokens",
                 "max_retries", "retry_backoff_ms"],
}
# A flag line: "  --name=VALUE   meaning (default: X)".
FLAG_LINE = re.compile(r"^  --(\w+)=\S+\s+(\S.*) \(default: ([^)]*)\)$")


def cli(*args, timeout=60):
    return subprocess.run([_binary("TOST_CLI_BIN"), *args], capture_output=True, text=True, timeout=timeout)


def one_line(done):
    """The single line a failure writes on stderr."""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {done.stderr!r}"
    assert lines[0].startswith("tost_cli: "), lines[0]
    return lines[0]


def served_models():
    return sorted(d for d in os.listdir(MODELS) if os.path.isfile(os.path.join(MODELS, d, "config.json")))


def help_flags(text):
    """{flag: (meaning, default)} of the flag lines of a help text."""
    out = {}
    for line in text.splitlines():
        m = FLAG_LINE.match(line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


@pytest.mark.parametrize("command", sorted(COMMAND_FLAGS))
@pytest.mark.parametrize("form", [("{c}", "--help"), ("{c}", "-h"), ("help", "{c}"), ("--help", "{c}")])
def test_each_command_help_lists_its_flags_with_defaults(command, form):
    done = cli(*(a.format(c=command) for a in form))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith(f"usage: tost_cli {command} "), done.stdout
    flags = help_flags(done.stdout)
    assert list(flags) == COMMAND_FLAGS[command], done.stdout
    for name, (meaning, default) in flags.items():
        assert meaning.strip() and default.strip(), (name, meaning, default)
    assert flags["server"][1] == "127.0.0.1:8500"
    for code in (0, 1, USAGE, UNREACHABLE, NOT_FOUND, UNAVAILABLE):
        assert re.search(rf"^  {code}  \S", done.stdout, re.M), f"exit status {code} undocumented:\n{done.stdout}"


def test_overview_help_lists_every_command_and_flag():
    for args in (["--help"], ["help"], ["-h"]):
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        for command, flags in COMMAND_FLAGS.items():
            assert re.search(rf"^  {command}\s+\S", done.stdout, re.M), f"{command} missing:\n{done.stdout}"
            section = done.stdout.split(f"usage: tost_cli {command} ", 1)[1].split("\n\n", 1)[0]
            assert list(help_flags(section)) == flags, section
        assert "exit status:" in done.stdout


def test_every_flag_tost_cli_defines_is_documented():
    with open(os.path.join(SOURCE_DIR, "client", "cli_main.cc")) as f:
        defined = set(re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,", f.read()))
    documented = {flag for flags in COMMAND_FLAGS.values() for flag in flags}
    assert defined == documented, f"defined but not in any help: {defined - documented}; " \
                                  f"in the help but not defined: {documented - defined}"


@pytest.mark.parametrize("args,expected", [
    ([], "no command given; expected a command: models, classify or generate; see tost_cli --help"),
    (["frobnicate"], 'unknown command "frobnicate"; expected models, classify or generate; see tost_cli --help'),
    (["models", "--bogus=1"], "unknown flag --bogus; see tost_cli models --help"),
    (["--bogus", "models"], "unknown flag --bogus; see tost_cli models --help"),
    (["models", "--prompt=x"], "--prompt is not a flag of models (it is one of generate); see tost_cli models --help"),
    (["classify", "--input=x.npy"], "classify needs --model=NAME, got none"),
    (["generate", "--model=m", "--top_k=many"], '--top_k expects an integer, got "many"; see tost_cli generate --help'),
    (["generate", "--model=m", "--temperature=hot"], '--temperature expects a number, got "hot"'),
    (["generate", "--model=m", "--resume=maybe"], '--resume expects true or false, got "maybe"'),
    (["generate", "--model"], "--model needs a value"),
    (["models", "extra"], 'unexpected argument "extra" after the command models'),
    (["generate", "--model=m", "--prompt=a", "--prompt_tokens=1"], "give --prompt or --prompt_tokens, not both"),
    (["generate", "--model=m", "--prompt_tokens=1,x"], '--prompt_tokens takes comma-separated integers, got "x"'),
])
def test_a_usage_mistake_is_one_line_and_exit_status_2(args, expected):
    # Port 1 (nothing listens there): should a mistake get past the parser, no server answers.
    done = cli("--server=127.0.0.1:1", *args)
    assert done.returncode == USAGE, (done.returncode, done.stderr)
    line = one_line(done)
    assert expected in line, line
    assert "--help" in line or "tost_cli models" in line, line
    assert done.stdout == ""


def free_port():
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_models_lists_every_model_and_how_a_language_model_decodes(server):
    """One line per model; a language model's line ends with how its decode steps run, as
    ServerStatus says: "eager" on the CPU (on a GPU "cuda graphs", or "eager: " and why graphs were
    turned off)."""
    done = cli("models", f"--server={server.address}")
    assert done.returncode == 0, (done.returncode, done.stderr)
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert sorted(lines) == served_models(), done.stdout
    assert lines["tost-austen"].split() == ["tost-austen", "tost_lm", "ready", "trained", "decode:", "eager"], \
        lines["tost-austen"]
    assert "decode:" not in lines["tost-digits"], lines["tost-digits"]


@pytest.mark.parametrize("args", [["models"], ["classify", "--model=tost-digits"],
                                  ["generate", "--model=tost-austen", "--prompt=Hi"]],
                         ids=["models", "classify", "generate"])
def test_nothing_listening_is_one_line_and_exit_status_3(args):
    address = f"127.0.0.1:{free_port()}"
    done = cli(*args, f"--server={address}")
    assert done.returncode == UNREACHABLE, (done.returncode, done.stderr)
    assert one_line(done) == (f"tost_cli: cannot reach a tost_server at {address} (connection refused): "
                              "start one (make run) or pass --server=HOST:PORT")
    assert done.stdout == "", "a failed generate should not print its prompt"


def test_a_name_that_does_not_resolve_is_one_line_and_exit_status_3():
    # .invalid never resolves (RFC 2606); the resolver answers at once, or by --timeout_s.
    done = cli("models", "--server=no-such-host.invalid:8500", "--timeout_s=20", timeout=60)
    assert done.returncode == UNREACHABLE, (done.returncode, done.stderr)
    line = one_line(done)
    assert line.startswith("tost_cli: cannot reach a tost_server at no-such-host.invalid:8500 ("), line
    assert line.endswith("): start one (make run) or pass --server=HOST:PORT"), line


@pytest.mark.parametrize("args", [["classify", "--model=no-such-model"],
                                  ["classify", "--model=no-such-model", "--input={npy}"],
                                  ["generate", "--model=no-such-model", "--prompt=Hi"],
                                  ["generate", "--model=no-such-model", "--prompt=Hi", "--resume"]],
                         ids=["classify-synthetic", "classify-npy", "generate", "generate-resume"])
def test_an_unknown_model_is_one_line_and_exit_status_4(server, tmp_path, args):
    npy = tmp_path / "img.npy"
    np.save(npy, np.zeros((1, 32, 32), dtype=np.float32))
    done = cli(*(a.format(npy=npy) for a in args), f"--server={server.address}")
    assert done.returncode == NOT_FOUND, (done.returncode, done.stderr)
    assert one_line(done) == (f'tost_cli: model "no-such-model" is not served by {server.address}; '
                              f"served: {', '.join(served_models())} (tost_cli models)")
    assert done.stdout == ""


def test_a_server_still_loading_is_one_line_and_exit_status_5(tmp_path):
    """The server answers UNAVAILABLE ("still loading") from the moment its port opens until every
    model has loaded and warmed up. It is held inside its model loading (HeldLoading: its first
    open() under the repository waits) while tost_cli calls it; its log names the port before the
    first model loads. Released, it serves, and the same call succeeds."""
    held = HeldLoading(tmp_path)
    # Not waiting for the listening line: that comes once every model has loaded.
    server = tost_launch.TostServer(held.repo, binary=_binary("TOST_SERVER_BIN"), metrics=False,
                                    log_path=str(tmp_path / "server.log"), env=held.env, wait=False)
    with server:
        port = port_while_loading(server, "port")
        held.reached(server)
        address = f"127.0.0.1:{port}"
        done = cli("models", f"--server={address}")
        assert done.returncode == UNAVAILABLE, (done.returncode, done.stderr)
        assert one_line(done) == (f"tost_cli: the server at {address} is still loading its models; retry in a few "
                                  "seconds (it serves once grpc.health.v1 reports SERVING)")
        assert done.stdout == ""
        held.release()
        server.wait_ready()
        done = cli("models", f"--server={address}")
        assert done.returncode == 0 and "austen-00" in done.stdout, (done.returncode, done.stdout, done.stderr)
