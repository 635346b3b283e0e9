#!/usr/bin/env python3
"""Offline checks of the deployment files: docker-compose.yml, deploy/docker, deploy/k8s (kustomize
base, overlays and components), deploy/prometheus and docs/deploying.md. Nothing here
needs a network, a Docker engine or a cluster.

  check_manifests.py SOURCE_DIR TOST_SERVER --venv DEPLOY_VENV [--only SECTION ...]
  check_manifests.py SOURCE_DIR TOST_SERVER --venv DEPLOY_VENV --self-test

Sections:
  static   every YAML parses and passes yamllint (.yamllint); no secret is committed, and every file
           a secret is generated from is ignored by git; no reference to a moved path is left.
  images   the Dockerfiles: pinned bases, COPY sources that exist, the documented install
           (scripts/install-deps.sh, with every file it reads copied first, then make build), a
           non-root USER, a grpc.health.v1 HEALTHCHECK, real flags, the Debian packages of the
           runtime stage cover the libraries tost_server links.
  compose  docker-compose.yml against the compose specification's schema (check-jsonschema
           --builtin-schema vendor.compose-spec), and what the schema cannot know: flags, grace
           period, hardening, the GPU profile's device reservation, paths that exist, and for a
           server with a shared --session_store, the store service it names (same profile, same
           password secret, append-only file on a volume, a health check, not published).
  k8s      every kustomization (base, overlays/*, each overlay with each component it does not
           already have) renders with `kubectl kustomize` from a temporary copy holding freshly
           generated secret inputs; every rendered built-in object validates with
           `kubernetes-validate --strict` against Kubernetes
           K8S_VERSION, every custom resource against its CRD schema in deploy/schemas (a JSON
           schema, or an upstream CRD whose openAPIV3Schema becomes one); and the objects agree:
           flags (the ConfigMap's flag files as the container reads them) exist and are accepted by
           tost_server, ports, probes, drain vs grace period, secret mounts, securityContext,
           Services, ServiceMonitor, NetworkPolicy, PDB, HPA and its metric or the KEDA
           ScaledObject and its query, the InferencePool and InferenceObjectives;
           with a shared --session_store, the StatefulSet it names (one replica, a volume, the
           append-only file, the same password Secret as the server's, probes, hardening, memory
           limit vs maxmemory) and the NetworkPolicies between the server and the store.
  docs     docs/deploying.md covers compose, both overlays, load balancing and the offline checks,
           and every deploy path it names exists.

Flags are checked twice: by name against `tost_server --helpfull`, and by value by starting
tost_server with them (paths replaced by temporary files, and a model repository that does not
exist, so it stops right after validating them).

--self-test breaks a copy of the tree in several ways (an unknown flag, a bad flag value, a
too-short grace period, an unknown field in a Deployment, in the ServiceMonitor and in the compose
file, a COPY of a missing file, a lint error, a session store open to every pod, split over two
replicas, or without the server's password, a field of the InferencePool, the InferenceObjective, the
KEDA ScaledObject and the queued-requests HPA broken) and fails unless each one is caught.

Prints one line per check and a closing 'N passed, M failed'; exits 1 on any failure, 77 (ctest's
skip) when the validators' venv is missing. Runs on Debian's /usr/bin/python3 with python3-yaml."""
import argparse
import glob
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile

import yaml

K8S_VERSION = "1.32.0"
SECTIONS = ("static", "images", "compose", "k8s", "docs")
# Custom resources and the schema each validates against (relative to SOURCE_DIR): a JSON schema, or
# an upstream CustomResourceDefinition (.yaml) whose version's openAPIV3Schema is turned into one
# (crd_json_schema).
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "deploy/schemas/servicemonitor-monitoring.coreos.com-v1.json",
    ("inference.networking.k8s.io/v1", "InferencePool"): "deploy/schemas/inference.networking.k8s.io_inferencepools.yaml",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"):
        "deploy/schemas/inference.networking.x-k8s.io_inferenceobjectives.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "deploy/schemas/keda.sh_scaledobjects.yaml",
}
# Flags whose value is a file the server opens: replaced by temporary files when tost_server is
# started to validate a flag set.
PATH_FLAGS = ("model_repository", "session_key_file", "tls_cert_file", "tls_key_file", "tls_client_ca_file",
              "api_keys_file", "session_store_password_file")
SKIP = 77


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def __call__(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}", flush=True)
        return ok


check = Checks()


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# --------------------------------------------------------------------------------------------
# Flags

def parse_flag(arg):
    m = re.match(r"--([A-Za-z0-9_]+)(?:=(.*))?$", arg)
    return (m.group(1), m.group(2)) if m else None


def flag_lines(text):
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def expand_flags(args, files, where):
    """args in order, with every --flagfile=a,b replaced by the flags of those files (absl's order).
    files: container path -> content. Returns [(name, value, origin)] and a list of problems."""
    out, problems = [], []
    for a in args:
        f = parse_flag(a)
        if f is None:
            problems.append(f"{where}: '{a}' is not a --flag")
            continue
        if f[0] == "flagfile":
            for path in (f[1] or "").split(","):
                if path not in files:
                    problems.append(f"{where}: --flagfile {path} is not a mounted file")
                    continue
                sub, p = expand_flags(flag_lines(files[path]), files, f"{where} {path}")
                out += sub
                problems += p
        else:
            out.append((f[0], f[1], where))
    return out, problems


# tost_server's --http_port default, for manifests that leave it implicit.
HTTP_PORT_DEFAULT = "8501"


def effective(flags):
    eff = {}
    for name, value, _ in flags:
        if name.startswith("no") and name[2:] in eff and value is None:
            eff[name[2:]] = "false"
        else:
            eff[name] = "true" if value is None else value
    return eff


class Server:
    def __init__(self, binary, work):
        self.binary = binary
        self.work = work
        out = run([binary, "--helpfull"]).stdout
        self.known = set(re.findall(r"^\s+--([a-z_]+) \(", out, re.M))
        self.cache = {}
        self.key = os.path.join(work, "session.key")
        with open(self.key, "wb") as f:
            f.write(secrets.token_bytes(32))
        self.cert, self.tls_key = tls_pair(work)
        self.api_keys = os.path.join(work, "api_keys")
        with open(self.api_keys, "w") as f:
            f.write("check 0123456789abcdef0123456789abcdef\n")
        self.store_password = os.path.join(work, "store_password")
        with open(self.store_password, "w") as f:
            f.write(secrets.token_hex(32) + "\n")

    def unknown(self, flags):
        return sorted({n for n, _, _ in flags if n not in self.known and not (
            n.startswith("no") and n[2:] in self.known)})

    def accepts(self, flags):
        """Starts tost_server with the flags (files replaced, repository absent): (ok, detail)."""
        key = tuple((n, v) for n, v, _ in flags)
        if key not in self.cache:
            self.cache[key] = self._accepts(flags)
        return self.cache[key]

    def _accepts(self, flags):
        eff = effective(flags)
        argv = [self.binary] + [f"--{n}" + ("" if v is None else f"={v}") for n, v, _ in flags]
        repl = {"model_repository": os.path.join(self.work, "no-such-repository"),
                "session_key_file": self.key, "tls_cert_file": self.cert, "tls_key_file": self.tls_key,
                "tls_client_ca_file": self.cert, "api_keys_file": self.api_keys,
                "session_store_password_file": self.store_password}
        argv += [f"--{n}={repl[n]}" for n in PATH_FLAGS if n in eff and (eff[n] or n == "model_repository")]
        argv += ["--port=0", "--metrics_port=-1", "--http_port=-1"]

        def attempt(extra):
            try:
                r = run(argv + extra, timeout=60)
            except subprocess.TimeoutExpired:
                return None, "tost_server did not stop within 60 s"
            return r, (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]

        r, last = attempt([])
        if r is None:
            return False, last
        text = r.stdout + r.stderr
        if "model repository" in text and "is not a directory" in text:
            return True, ""
        if re.search(r"sees 0 CUDA device", text) and eff.get("device", "").startswith("cuda"):
            # No GPU here: everything up to the device check was accepted; check the rest on the CPU.
            r, last = attempt(["--device=cpu"])
            if r is not None and "model repository" in r.stdout + r.stderr:
                return True, ""
        got = last[0] if last else ""
        return False, f"expected tost_server to reject only the missing model repository, got: {got}"


def tls_pair(work):
    cert, key = os.path.join(work, "tls.crt"), os.path.join(work, "tls.key")
    r = run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=tost-serve",
             "-addext", "subjectAltName=DNS:tost-serve.tost-serve.svc,DNS:localhost", "-keyout", key, "-out", cert])
    if r.returncode != 0:
        raise SystemExit(f"openssl could not make a test certificate: {r.stderr}")
    return cert, key


# --------------------------------------------------------------------------------------------
# Dockerfiles

class Dockerfile:
    def __init__(self, path):
        self.path = path
        text = open(path).read()
        self.text = text
        lines, cur = [], ""
        for raw in text.splitlines():
            if not cur and raw.lstrip().startswith("#"):
                continue
            if raw.rstrip().endswith("\\"):
                cur += raw.rstrip()[:-1] + " "
                continue
            cur += raw
            if cur.strip():
                lines.append(cur.strip())
            cur = ""
        self.instructions = []  # (stage index, INSTRUCTION, rest)
        self.stages = []        # (image, alias)
        for ln in lines:
            instr, _, rest = ln.partition(" ")
            instr = instr.upper()
            if instr == "FROM":
                m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
                self.stages.append((m.group(1), m.group(2)))
            self.instructions.append((len(self.stages) - 1, instr, rest.strip()))

    def final(self, instr):
        last = len(self.stages) - 1
        return [r for s, i, r in self.instructions if s == last and i == instr]

    def exec_form(self, instr):
        found = self.final(instr)
        if not found:
            return []
        try:
            return json.loads(found[-1])
        except json.JSONDecodeError:
            return found[-1].split()


def copy_sources(rest):
    parts = rest.split()
    opts = [p for p in parts if p.startswith("--")]
    args = [p for p in parts if not p.startswith("--")]
    if rest.startswith("["):
        args = json.loads(rest)
    return opts, args[:-1], args[-1] if args else None


def apt_packages(run_text):
    m = re.search(r"apt-get install ([^&;|]*)", run_text)
    if not m:
        return set()
    return {p for p in m.group(1).split() if not p.startswith("-")}


def package_closure(pkgs):
    """The packages and everything they depend on, as installed on this (Debian 12) machine."""
    deps = {}
    for ln in run(["dpkg-query", "-W", "-f=${Package}\t${Depends},${Pre-Depends}\n"]).stdout.splitlines():
        name, _, dep = ln.partition("\t")
        deps[name] = [a.split("|")[0].strip().split(" ")[0].split(":")[0] for a in dep.split(",")]
    seen, todo = set(), list(pkgs)
    while todo:
        p = todo.pop()
        if p and p not in seen:
            seen.add(p)
            todo += deps.get(p, [])
    return seen


def linked_packages(binaries):
    """Debian packages that provide the libraries the binaries load from /lib or /usr/lib."""
    r = run(["ldd"] + binaries)
    paths = sorted({m for m in re.findall(r"=> (/\S+)", r.stdout) if re.match(r"/(usr/)?lib", m)})
    owners = {}
    for p in paths:
        q = run(["dpkg", "-S", os.path.realpath(p)])
        if q.returncode != 0:
            q = run(["dpkg", "-S", p])
        if q.returncode == 0:
            owners[p] = q.stdout.split(":")[0].strip()
    return owners


def check_images(src, server, compose_images):
    install = open(os.path.join(src, "scripts", "install-deps.sh")).read()
    reads = sorted(f for f in set(re.findall(r'"\$here/([A-Za-z0-9_.-]+)"', install))
                   if os.path.isfile(os.path.join(src, f)))
    dfs = sorted(glob.glob(os.path.join(src, "deploy", "docker", "Dockerfile*")))
    check("deploy/docker has a CPU and a CUDA Dockerfile",
          {os.path.basename(d) for d in dfs} >= {"Dockerfile", "Dockerfile.cuda"}, f"found {dfs}")
    builder_bins = [server.binary,
                    os.path.join(os.path.dirname(os.path.dirname(server.binary)), "client", "tost_cli")]
    needed = linked_packages([b for b in builder_bins if os.path.exists(b)]) if shutil.which("dpkg") else {}
    required = set(run(["dpkg-query", "-W", "-f=${Package} ${Priority}\\n"]).stdout.split("\n"))
    required = {ln.split()[0] for ln in required if ln.endswith(" required")}
    out = {}
    for path in dfs:
        rel = os.path.relpath(path, src)
        df = Dockerfile(path)
        out[rel] = df
        for image, _ in df.stages:
            aliases = {a for _, a in df.stages if a}
            pinned = image in aliases or "@sha256:" in image or re.search(r":[^:]*\d+\.\d+", image)
            check(f"{rel}: base {image} is pinned to a release", bool(pinned),
                  f"expected name:VERSION (a point release) or a digest, got '{image}'")
        for _, instr, rest in df.instructions:
            if instr not in ("COPY", "ADD"):
                continue
            opts, srcs, _ = copy_sources(rest)
            if any(o.startswith("--from") for o in opts):
                continue
            for s in srcs:
                check(f"{rel}: COPY source {s} exists", bool(glob.glob(os.path.join(src, s))),
                      f"{os.path.join(src, s)} does not exist in the build context")
        runs = [(i, r) for i, (_, instr, r) in enumerate(df.instructions) if instr == "RUN"]
        inst = [i for i, r in runs if "scripts/install-deps.sh" in r]
        check(f"{rel}: installs with scripts/install-deps.sh (as the README does)", bool(inst),
              "expected a RUN of scripts/install-deps.sh")
        check(f"{rel}: builds with make build", any(re.search(r"\bmake build\b", r) for _, r in runs),
              "expected a RUN of `make build`")
        if inst:
            copied = set()
            for _, instr, rest in df.instructions[:inst[0]]:
                if instr == "COPY":
                    copied |= {os.path.normpath(s) for s in copy_sources(rest)[1]}
            for f in reads + ["scripts/install-deps.sh"]:
                check(f"{rel}: {f} is copied before install-deps.sh runs", f in copied or "." in copied,
                      f"install-deps.sh reads {f}; COPYs before it: {sorted(copied)}")
        cuda = rel.endswith(".cuda")
        build = " ".join(r for _, r in runs)
        check(f"{rel}: make build CUDA={'ON' if cuda else 'OFF'}", f"CUDA={'ON' if cuda else 'OFF'}" in build,
              f"expected `make build CUDA={'ON' if cuda else 'OFF'}`")
        if cuda:
            archs = re.search(r'CUDAARCHS="?([0-9;]+)', df.text)
            check(f"{rel}: kernels for sm_80 and sm_90", archs and set(archs.group(1).split(";")) >= {"80", "90"},
                  f"expected ENV CUDAARCHS=\"80;90\", got {archs.group(1) if archs else 'none'}")
        user = (df.final("USER") or ["root"])[-1].split(":")[0]
        check(f"{rel}: runs as a non-root numeric USER", user.isdigit() and user != "0", f"USER is '{user}'")
        entry, cmd = df.exec_form("ENTRYPOINT"), df.exec_form("CMD")
        flags, problems = expand_flags(entry[1:] + cmd, {}, f"{rel} ENTRYPOINT+CMD")
        check(f"{rel}: ENTRYPOINT runs tost_server", entry[:1] == ["tost_server"], f"ENTRYPOINT is {entry}")
        check(f"{rel}: ENTRYPOINT/CMD flags exist in tost_server --helpfull",
              not problems and not server.unknown(flags), f"unknown: {server.unknown(flags)} {problems}")
        ok, detail = server.accepts(flags)
        check(f"{rel}: tost_server accepts the ENTRYPOINT/CMD flags", ok, detail)
        eff = effective(flags)
        check(f"{rel}: CMD picks the device with --device=auto", eff.get("device") == "auto",
              f"expected --device=auto, got {eff.get('device')}")
        exposed = set(" ".join(df.final("EXPOSE")).split())
        check(f"{rel}: EXPOSE has --port and --metrics_port", {eff.get("port"), eff.get("metrics_port")} <= exposed,
              f"expected {eff.get('port')} and {eff.get('metrics_port')}, EXPOSE has {sorted(exposed)}")
        check(f"{rel}: EXPOSE has --http_port (the OpenAI-compatible API)",
              eff.get("http_port", HTTP_PORT_DEFAULT) in exposed,
              f"expected {eff.get('http_port', HTTP_PORT_DEFAULT)}, EXPOSE has {sorted(exposed)}")
        hc = " ".join(df.final("HEALTHCHECK"))
        hc_cmd = json.loads(hc[hc.index("["):]) if "CMD [" in hc else []
        check(f"{rel}: HEALTHCHECK runs tost_health_check (grpc.health.v1) on --port",
              hc_cmd[:1] == ["tost_health_check"] and f"--address=127.0.0.1:{eff.get('port')}" in hc_cmd,
              f"expected [\"tost_health_check\", \"--address=127.0.0.1:{eff.get('port')}\", ...], got {hc_cmd}")
        copies = [copy_sources(r) for r in df.final("COPY")]
        check(f"{rel}: the health check script is installed as tost_health_check",
              any(d == "/usr/local/bin/tost_health_check" for _, _, d in copies),
              "expected COPY deploy/docker/grpc_health_check.py /usr/local/bin/tost_health_check")
        check(f"{rel}: HOME and TMPDIR point at /tmp (read-only root filesystem)",
              re.search(r"ENV .*HOME=/tmp", df.text) and re.search(r"ENV .*TMPDIR=/tmp", df.text),
              "expected ENV HOME=/tmp TMPDIR=/tmp")
        final_pkgs = set().union(*[apt_packages(r) for r in df.final("RUN")] or [set()])
        check(f"{rel}: the runtime stage installs python3-grpcio (the health check)", "python3-grpcio" in final_pkgs,
              f"runtime packages: {sorted(final_pkgs)}")
        if needed:
            have = package_closure(final_pkgs) | required
            missing = sorted({f"{pkg} ({os.path.basename(lib)})" for lib, pkg in needed.items() if pkg not in have})
            check(f"{rel}: runtime packages provide every Debian library tost_server/tost_cli link", not missing,
                  f"not installed by the runtime stage (nor required by Debian): {missing}")
    for image, dockerfile in compose_images.items():
        check(f"docker-compose.yml: image {image} builds from an existing Dockerfile", dockerfile in out,
              f"{dockerfile} is not one of {sorted(out)}")
    return out


# --------------------------------------------------------------------------------------------
# compose

PROXY_ENTRYPOINT = ["tost-grpc-proxy"]
PROXY_PORT_DEFAULT = "8500"


PROXY_ENTRYPOINT_SCRIPT = "deploy/proxy/entrypoint.sh"
PROXY_TLS_VARIABLES = ("TOST_PROXY_TLS_CERT_FILE", "TOST_PROXY_TLS_KEY_FILE")
# Values an operator might type that must not reach nginx.conf: each refused by the variable's name.
PROXY_HOSTILE_ENV = [
    ("TOST_GRPC_UPSTREAM", "127.0.0.1:8400; } server { listen 9"),
    ("TOST_GRPC_UPSTREAM", "127.0.0.1"),
    ("TOST_GRPC_UPSTREAM", "127.0.0.1:70000"),
    ("TOST_GRPC_PROXY_PORT", "0"),
    ("TOST_GRPC_PROXY_PORT", "8500 ssl"),
    ("TOST_PROXY_CALLS_PER_SECOND", "1k"),
    ("TOST_PROXY_CALLS_PER_SECOND", "1000r/s; limit_req_zone"),
    ("TOST_PROXY_CALL_BURST", "-1"),
    ("TOST_PROXY_CONNECTIONS_PER_CLIENT", "0"),
    ("TOST_PROXY_UPSTREAM_MAX_CONNS", "99999999999999999999"),
    ("TOST_PROXY_WORKERS", "auto; user root"),
    ("TOST_PROXY_RUN_DIR", "relative/dir"),
    ("TOST_PROXY_RUN_DIR", "/tmp/a b"),
    ("TOST_PROXY_ACCESS_LOG", "/var/log/a.log combined; return 200"),
    ("TOST_PROXY_ACCESS_LOG", "syslog:server=10.0.0.1"),
    ("TOST_PROXY_TLS_CERT_FILE", "/no/such/cert.pem"),
]


READABLE_FILE = "<a readable file>"  # in run_proxy_entrypoint's env: replaced by an empty file's path


def run_proxy_entrypoint(src, env):
    """The edge proxy's entrypoint, run up to nginx (which is `true` here) with `env` over the
    defaults. Returns (exit status, stderr, the nginx.conf it rendered or None)."""
    with tempfile.TemporaryDirectory(prefix="tost-proxy-env-") as d:
        readable = os.path.join(d, "readable")
        open(readable, "w").close()
        full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TOST_NGINX_BIN": "true",
                "TOST_GRPC_UPSTREAM": "127.0.0.1:8400", "TOST_PROXY_RUN_DIR": os.path.join(d, "run")}
        full.update({k: readable if v == READABLE_FILE else v for k, v in env.items() if v is not None})
        r = subprocess.run(["sh", os.path.join(src, PROXY_ENTRYPOINT_SCRIPT)], env=full, capture_output=True,
                           text=True, timeout=30)
        conf = os.path.join(d, "run", "nginx.conf")
        return r.returncode, r.stderr.strip(), open(conf).read() if os.path.exists(conf) else None


def check_proxy_env(where, src, env):
    """The proxy's environment in a manifest is one its entrypoint accepts (its TLS files, mounted
    from a Secret there, stand in as readable files)."""
    env = {k: READABLE_FILE if k in PROXY_TLS_VARIABLES else v for k, v in env.items() if k.startswith("TOST_")}
    rc, err, _ = run_proxy_entrypoint(src, env)
    check(f"{where}: its TOST_* environment passes {PROXY_ENTRYPOINT_SCRIPT}'s checks", rc == 0,
          f"exit {rc}: {err}")


def check_proxy_entrypoint(src):
    rc, err, conf = run_proxy_entrypoint(src, {"TOST_PROXY_CALLS_PER_SECOND": "250"})
    check(f"{PROXY_ENTRYPOINT_SCRIPT} renders nginx.conf with the defaults and an override",
          rc == 0 and conf is not None and "rate=250r/s" in conf and "127.0.0.1:8400" in conf, f"exit {rc}: {err}")
    for name, value in PROXY_HOSTILE_ENV:
        env = {name: value}
        if name in PROXY_TLS_VARIABLES:  # the other one of the pair is there
            env.update({other: READABLE_FILE for other in PROXY_TLS_VARIABLES if other != name})
        rc, err, conf = run_proxy_entrypoint(src, env)
        check(f"{PROXY_ENTRYPOINT_SCRIPT} refuses {name}={value!r}, naming it, before nginx.conf is written",
              rc == 2 and name in err and conf is None, f"exit {rc}: {err or 'no message'}")


def check_compose_grpc_proxy(src, where, name, s, eff, services, published):
    """A server's gRPC port is published only through a grpc-proxy service in front of it: same
    profiles, the server's image, hardened like it, forwarding to the server's --port."""
    upstream = f"{name}:{eff.get('port')}"
    proxies = [(n, p) for n, p in services.items() if p.get("entrypoint") == PROXY_ENTRYPOINT
               and (p.get("environment") or {}).get("TOST_GRPC_UPSTREAM") == upstream]
    if not check(f"{where}: a grpc-proxy service forwards to its --port ({upstream})", len(proxies) == 1,
                 f"services with entrypoint {PROXY_ENTRYPOINT} and TOST_GRPC_UPSTREAM={upstream}: "
                 f"{[n for n, _ in proxies]}"):
        return
    pname, p = proxies[0]
    pwhere = f"docker-compose.yml service {pname}"
    check_proxy_env(pwhere, src, {k: str(v) for k, v in (p.get("environment") or {}).items()})
    check(f"{where}: does not publish --port (clients go through {pname})", eff.get("port") not in published,
          f"published container ports {sorted(published)}")
    listen = (p.get("environment") or {}).get("TOST_GRPC_PROXY_PORT", PROXY_PORT_DEFAULT)
    check(f"{pwhere}: publishes its port {listen}", listen in {x.split(":")[-1] for x in p.get("ports", [])},
          f"ports {p.get('ports')}")
    check(f"{pwhere}: the profiles of {name}", sorted(p.get("profiles", [])) == sorted(s.get("profiles", [])),
          f"{p.get('profiles')} vs {s.get('profiles')}")
    check(f"{pwhere}: the image of {name}", p.get("image") == s.get("image"), f"{p.get('image')} vs {s.get('image')}")
    check(f"{pwhere}: read-only root filesystem with a tmpfs /tmp, all capabilities dropped",
          p.get("read_only") is True and "/tmp" in p.get("tmpfs", []) and "ALL" in p.get("cap_drop", []),
          f"read_only={p.get('read_only')} tmpfs={p.get('tmpfs')} cap_drop={p.get('cap_drop')}")


def check_compose(src, server, venv):
    path = os.path.join(src, "docker-compose.yml")
    check("docker-compose.yml is at the repository root", os.path.exists(path), f"{path} missing")
    check("deploy/docker-compose.yml is gone (moved to the root)",
          not os.path.exists(os.path.join(src, "deploy", "docker-compose.yml")), "deploy/docker-compose.yml exists")
    if not os.path.exists(path):
        return {}
    r = run([os.path.join(venv, "bin", "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", path])
    check("docker-compose.yml validates against the compose specification", r.returncode == 0,
          (r.stdout + r.stderr).strip())
    doc = yaml.safe_load(open(path))
    services = doc.get("services", {})
    images = {}
    servers = {n: s for n, s in services.items() if "build" in s}
    check("docker-compose.yml has a CPU server and a gpu-profile server",
          any("gpu" not in s.get("profiles", []) for s in servers.values())
          and any("gpu" in s.get("profiles", []) for s in servers.values()),
          f"servers: {sorted(servers)}")
    for name, s in servers.items():
        where = f"docker-compose.yml service {name}"
        b = s["build"]
        ctx = os.path.normpath(os.path.join(src, b.get("context", ".")))
        dockerfile = os.path.normpath(os.path.join(ctx, b.get("dockerfile", "Dockerfile")))
        check(f"{where}: builds from the repository root", ctx == os.path.normpath(src), f"context is {ctx}")
        check(f"{where}: Dockerfile exists", os.path.exists(dockerfile), f"{dockerfile} missing")
        images[s.get("image", "")] = os.path.relpath(dockerfile, src)
        df = Dockerfile(dockerfile) if os.path.exists(dockerfile) else None
        entry = df.exec_form("ENTRYPOINT")[1:] if df else []
        flags, problems = expand_flags(entry + s.get("command", []), {}, where)
        unknown = server.unknown(flags)
        check(f"{where}: flags exist in tost_server --helpfull", not unknown and not problems,
              f"unknown: {unknown} {problems}")
        ok, detail = server.accepts(flags)
        check(f"{where}: tost_server accepts its flags", ok, detail)
        eff = effective(flags)
        grace = int(str(s.get("stop_grace_period", "10s")).rstrip("s"))
        drain = int(eff.get("drain_timeout_s", 30))
        check(f"{where}: stop_grace_period exceeds --drain_timeout_s + 1 s", grace > drain + 1,
              f"expected more than {drain + 1}s, got {grace}s")
        key = eff.get("session_key_file", "")
        check(f"{where}: --session_key_file is one of its secrets",
              key.startswith("/run/secrets/") and key.rsplit("/", 1)[-1] in s.get("secrets", []),
              f"--session_key_file={key}, secrets {s.get('secrets')}")
        if eff.get("session_store", "memory") != "memory":
            check_compose_store(where, s, eff, services, doc.get("volumes") or {})
        check(f"{where}: read-only root filesystem with a tmpfs /tmp",
              s.get("read_only") is True and "/tmp" in s.get("tmpfs", []), f"read_only={s.get('read_only')} "
              f"tmpfs={s.get('tmpfs')}")
        check(f"{where}: drops all capabilities", "ALL" in s.get("cap_drop", []), f"cap_drop={s.get('cap_drop')}")
        ports = {p.split(":")[-1] for p in s.get("ports", [])}
        check(f"{where}: publishes --metrics_port", eff.get("metrics_port") in ports,
              f"expected container port {eff.get('metrics_port')}, got {sorted(ports)}")
        check_compose_grpc_proxy(src, where, name, s, eff, services, ports)
        check(f"{where}: publishes --http_port", eff.get("http_port", HTTP_PORT_DEFAULT) in ports,
              f"expected container port {eff.get('http_port', HTTP_PORT_DEFAULT)}, got {sorted(ports)}")
        if "gpu" in s.get("profiles", []):
            devs = s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
            check(f"{where}: reserves an NVIDIA GPU",
                  any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devs),
                  f"deploy.resources.reservations.devices is {devs}")
            check(f"{where}: built from the CUDA Dockerfile", dockerfile.endswith(".cuda"), dockerfile)
            check(f"{where}: --device asks for CUDA", eff.get("device", "").startswith("cuda")
                  or eff.get("device") == "auto", f"--device={eff.get('device')}")
    for name, s in services.items():
        for v in s.get("volumes", []):
            host = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if host.startswith("."):
                check(f"docker-compose.yml service {name}: volume {host} exists",
                      os.path.exists(os.path.join(src, host)), f"{os.path.join(src, host)} missing")
    for name, sec in doc.get("secrets", {}).items():
        f = sec.get("file", "")
        check(f"docker-compose.yml secret {name} is read from deploy/", f.startswith("./deploy/"), f"file: {f}")
    prom = yaml.safe_load(open(os.path.join(src, "deploy", "prometheus", "prometheus.yml")))
    names = set()
    for job in prom.get("scrape_configs", []):
        for sd in job.get("dns_sd_configs", []):
            names |= set(sd.get("names", []))
        for sc in job.get("static_configs", []):
            names |= {t.split(":")[0] for t in sc.get("targets", [])}
    check("deploy/prometheus/prometheus.yml scrapes every compose server", set(servers) <= names,
          f"expected {sorted(servers)}, scrapes {sorted(names)}")
    return images


# A shared --session_store: redis://[user[:password]@]host[:port][/db].
REDIS_URL = re.compile(r"redis://(?:([^@/]*)@)?(\[[^\]]+\]|[^:/@]+)(?::(\d+))?(?:/(\d+))?$")


def store_url(where, url):
    """(host, port) of a --session_store URL, or None (a failed check)."""
    m = REDIS_URL.match(url)
    if not check(f"{where}: --session_store is a redis:// URL", m is not None, f"--session_store={url}"):
        return None
    check(f"{where}: the --session_store URL holds no password (--session_store_password_file does)",
          not (m.group(1) and ":" in m.group(1)), "the URL has user:password@: it shows in the command line")
    return m.group(2), int(m.group(3) or 6379)


def redis_command(cmd):
    """A redis-server command line (a list, or the shell text that execs it): (its text, the file
    --requirepass reads with $(cat FILE), or None)."""
    text = " ".join(cmd) if isinstance(cmd, list) else str(cmd)
    m = re.search(r'--requirepass\s+"?\$\$?\(cat ([^)\s]+)\)', text)
    return text, (m.group(1) if m else None)


def redis_port(text):
    m = re.search(r"--port (\d+)", text)
    return int(m.group(1)) if m else 6379


def check_compose_store(where, s, eff, services, volumes):
    url = store_url(where, eff["session_store"])
    if url is None:
        return
    host, port = url
    store = services.get(host)
    if not check(f"{where}: --session_store names a compose service", store is not None,
                 f"no service {host}; services: {sorted(services)}"):
        return
    sn = f"docker-compose.yml service {host}"
    profiles, store_profiles = set(s.get("profiles", [])), set(store.get("profiles", []))
    check(f"{where}: its store starts whenever it does (the store's profiles cover its own)",
          not store_profiles or (profiles and profiles <= store_profiles),
          f"server profiles {sorted(profiles)}, store profiles {sorted(store_profiles)}")
    deps = s.get("depends_on", {})
    deps = {d: {} for d in deps} if isinstance(deps, list) else deps
    check(f"{where}: waits for its store to be healthy", deps.get(host, {}).get("condition") == "service_healthy",
          f"depends_on {s.get('depends_on')}")
    pw = eff.get("session_store_password_file", "")
    secret = pw.rsplit("/", 1)[-1]
    check(f"{where}: --session_store_password_file is one of its secrets",
          pw.startswith("/run/secrets/") and secret in s.get("secrets", []),
          f"--session_store_password_file={pw}, secrets {s.get('secrets')}")
    text, reads = redis_command(store.get("command", []))
    check(f"{sn}: --requirepass reads the server's password secret ({pw})",
          reads == pw and secret in store.get("secrets", []),
          f"--requirepass reads {reads}, secrets {store.get('secrets')}")
    check(f"{sn}: listens on the port the server dials ({port})", redis_port(text) == port,
          f"redis-server --port {redis_port(text)}")
    check(f"{sn}: append-only file on (--appendonly yes)", "--appendonly yes" in text, text)
    check(f"{sn}: --maxmemory with --maxmemory-policy noeviction (no session dropped silently)",
          re.search(r"--maxmemory \d", text) and "--maxmemory-policy noeviction" in text, text)
    mounts = [v.split(":") for v in store.get("volumes", []) if isinstance(v, str)]
    check(f"{sn}: /data on a named volume", any(len(v) >= 2 and v[1] == "/data" and v[0] in volumes for v in mounts),
          f"volumes {store.get('volumes')}, named volumes {sorted(volumes)}")
    test = store.get("healthcheck", {}).get("test", [])
    test = " ".join(test) if isinstance(test, list) else str(test)
    check(f"{sn}: health check pings with redis-cli and the password", "redis-cli" in test and "ping" in test
          and pw in test, f"healthcheck test {test}")
    check(f"{sn}: not published on the host (plaintext: only the servers reach it)", not store.get("ports"),
          f"ports {store.get('ports')}")
    user = str(store.get("user", "")).split(":")[0]
    check(f"{sn}: runs as a non-root user, read-only, all capabilities dropped",
          user not in ("", "0", "root") and store.get("read_only") is True and "ALL" in store.get("cap_drop", []),
          f"user={store.get('user')} read_only={store.get('read_only')} cap_drop={store.get('cap_drop')}")


# --------------------------------------------------------------------------------------------
# Kubernetes

def kustomizations(k8s):
    out = []
    for root, _, files in os.walk(k8s):
        for f in files:
            if f in ("kustomization.yaml", "kustomization.yml"):
                doc = yaml.safe_load(open(os.path.join(root, f)))
                out.append((os.path.relpath(root, k8s), doc.get("kind", "Kustomization"), doc))
    return sorted(out)


def generator_inputs(k8s):
    """(directory, file) of every secretGenerator input of every kustomization and component."""
    out = []
    for rel, _, doc in kustomizations(k8s):
        for gen in doc.get("secretGenerator", []):
            for f in gen.get("files", []):
                out.append((rel, f.split("=", 1)[-1]))
    return out


def included_components(k8s, rel):
    """The components a kustomization uses, itself or through the kustomizations it builds on."""
    path = os.path.join(k8s, rel, "kustomization.yaml")
    if not os.path.exists(path):
        return set()
    doc = yaml.safe_load(open(path)) or {}
    out = {os.path.normpath(os.path.join(rel, c)) for c in doc.get("components", [])}
    for r in doc.get("resources", []):
        d = os.path.normpath(os.path.join(rel, r))
        if os.path.isdir(os.path.join(k8s, d)):
            out |= included_components(k8s, d)
    return out


def fill_secret_inputs(k8s, work):
    cert, key = tls_pair(work)
    for rel, f in generator_inputs(k8s):
        dst = os.path.join(k8s, rel, f)
        if f.endswith(".crt") or f.endswith(".pem"):
            shutil.copy(cert, dst)
        elif f.endswith(".key") and "tls" in f:
            shutil.copy(key, dst)
        else:
            with open(dst, "wb") as fh:
                fh.write(secrets.token_bytes(32))


def render_variants(src, work, only_variants=None):
    """Renders every kustomization, and every overlay with every component: {variant: objects}."""
    k8s = os.path.join(work, "k8s")
    shutil.copytree(os.path.join(src, "deploy", "k8s"), k8s)
    fill_secret_inputs(k8s, work)
    found = kustomizations(k8s)
    variants = [rel for rel, kind, _ in found if kind == "Kustomization"]
    components = [rel for rel, kind, _ in found if kind == "Component"]
    for o in [v for v in variants if v.startswith("overlays" + os.sep)]:
        for c in components:
            if c in included_components(k8s, o):
                continue  # overlays/cpu-shared-sessions has the session-store component already
            d = os.path.join(k8s, "variants", f"{os.path.basename(o)}+{os.path.basename(c)}")
            os.makedirs(d)
            with open(os.path.join(d, "kustomization.yaml"), "w") as fh:
                yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                "resources": [f"../../{o}"], "components": [f"../../{c}"]}, fh)
            variants.append(os.path.relpath(d, k8s))
    check("deploy/k8s has a base and the overlays cpu and gpu",
          {"base", os.path.join("overlays", "cpu"), os.path.join("overlays", "gpu")} <= set(variants),
          f"kustomizations: {variants}")
    out = {}
    for v in variants:
        if only_variants and v not in only_variants:
            continue
        r = run(["kubectl", "kustomize", os.path.join(k8s, v)])
        if check(f"deploy/k8s/{v} renders with kubectl kustomize", r.returncode == 0, r.stderr.strip()):
            out[v] = [d for d in yaml.safe_load_all(r.stdout) if d]
    return out


def structural_to_json_schema(node):
    """A CRD's structural schema as a JSON schema that refuses what the API server would refuse with
    strict field validation: an object with `properties` takes no other field unless it says so
    (additionalProperties, x-kubernetes-preserve-unknown-fields); int-or-string is either. The CEL
    rules (x-kubernetes-validations) are left out: no offline validator runs them, and the semantic
    checks below test what they protect."""
    if isinstance(node, list):
        return [structural_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k.startswith("x-kubernetes-"):
            continue
        if k in ("properties", "patternProperties"):
            out[k] = {name: structural_to_json_schema(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not"):
            out[k] = structural_to_json_schema(v)
        else:
            out[k] = v
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if "properties" in out and "additionalProperties" not in out \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def crd_json_schema(crd_path, api_version, kind):
    """The JSON schema of `api_version` `kind` from the CustomResourceDefinition at crd_path: its
    version's openAPIV3Schema (structural_to_json_schema), with apiVersion and kind pinned."""
    crd = next(d for d in yaml.safe_load_all(open(crd_path)) if d)
    group, version = api_version.split("/")
    if crd["spec"]["group"] != group or crd["spec"]["names"]["kind"] != kind:
        raise ValueError(f"{crd_path} defines {crd['spec']['group']} {crd['spec']['names']['kind']}, not {group} {kind}")
    served = [v for v in crd["spec"]["versions"] if v["name"] == version and v.get("served")]
    if not served:
        raise ValueError(f"{crd_path} serves no version {version}")
    schema = structural_to_json_schema(served[0]["schema"]["openAPIV3Schema"])
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema.setdefault("properties", {})
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
    return schema


def schema_file(src, rel, api_version, kind, work):
    """A JSON schema file for check-jsonschema: `rel` itself, or the one made from its CRD."""
    if not rel.endswith((".yaml", ".yml")):
        return os.path.join(src, rel)
    out = os.path.join(work, "schemas", os.path.basename(rel) + ".json")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as fh:
            json.dump(crd_json_schema(os.path.join(src, rel), api_version, kind), fh, indent=1)
    return out


def validate_objects(src, venv, variant, objs, work):
    d = os.path.join(work, "objects", variant.replace(os.sep, "_"))
    os.makedirs(d)
    builtin, custom = [], []
    for i, o in enumerate(objs):
        key = (o.get("apiVersion"), o.get("kind"))
        path = os.path.join(d, f"{i:02d}-{o['kind']}-{o['metadata']['name']}.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(o, fh)
        # inference.networking.k8s.io is a CRD group in the k8s.io domain: the schema list decides.
        is_custom = key in CRD_SCHEMAS or ("." in key[0].split("/")[0] and "k8s.io" not in key[0])
        (custom if is_custom else builtin).append((o, path))
    kv = os.path.join(venv, "bin", "kubernetes-validate")
    r = run([kv, "--strict", "-k", K8S_VERSION] + [p for _, p in builtin])
    lines = (r.stdout + r.stderr).splitlines()
    for o, p in builtin:
        name = f"{o['kind']}/{o['metadata']['name']}"
        mine = [ln for ln in lines if f" {p} " in ln]
        ok = any(" passed " in ln for ln in mine) and not any(ln.startswith(("ERROR", "WARN")) for ln in mine)
        check(f"deploy/k8s/{variant}: {name} validates against Kubernetes {K8S_VERSION} (strict)", ok,
              "; ".join(ln.split(f" {p} ", 1)[-1] for ln in mine) or "no result from kubernetes-validate")
    cj = os.path.join(venv, "bin", "check-jsonschema")
    for o, p in custom:
        name = f"{o['kind']}/{o['metadata']['name']}"
        schema = CRD_SCHEMAS.get((o["apiVersion"], o["kind"]))
        if not check(f"deploy/k8s/{variant}: {name} has a CRD schema in deploy/schemas", schema is not None,
                     f"no schema for {o['apiVersion']} {o['kind']}; known: {sorted(CRD_SCHEMAS)}"):
            continue
        try:
            schema_path = schema_file(src, schema, o["apiVersion"], o["kind"], work)
        except (ValueError, KeyError, StopIteration, yaml.YAMLError) as e:
            check(f"deploy/k8s/{variant}: {name}: the CRD {schema} gives a schema", False, str(e))
            continue
        r = run([cj, "--schemafile", schema_path, p])
        check(f"deploy/k8s/{variant}: {name} validates against {schema}", r.returncode == 0,
              (r.stdout + r.stderr).strip().replace("\n", " "))


def selects(selector, labels):
    ml = (selector or {}).get("matchLabels", selector or {})
    return bool(ml) and all(labels.get(k) == v for k, v in ml.items())


def adapter_metrics(src):
    path = os.path.join(src, "deploy", "prometheus", "adapter-rules.yml")
    if not os.path.exists(path):
        return {}, path
    out = {}
    for rule in yaml.safe_load(open(path)).get("rules", []):
        name = rule.get("name", {}).get("as") or re.match(r"\w+", rule.get("seriesQuery", "")).group(0)
        out[name] = rule
    return out, path


def service_metric_names(src):
    names = set()
    for root, _, files in os.walk(os.path.join(src, "service")):
        for f in files:
            if f.endswith((".cc", ".h")):
                names |= set(re.findall(r'"(tost_[a-z_]+)"', open(os.path.join(root, f), errors="replace").read()))
    return names


def quantity_bytes(q):
    """A Kubernetes memory quantity (1Gi, 512M, 1073741824) in bytes; 0 when unreadable."""
    m = re.match(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$", str(q))
    units = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9,
             "T": 10**12}
    return float(m.group(1)) * units[m.group(2)] if m else 0


def redis_bytes(number, unit):
    """Redis' memory units: k, m, g are powers of 1000; kb, mb, gb powers of 1024."""
    return int(number) * {"": 1, "k": 10**3, "kb": 2**10, "m": 10**6, "mb": 2**20, "g": 10**9,
                          "gb": 2**30}[(unit or "").lower()]


def secret_files(pod, container, sec):
    """{path in the container: Secret name} of the container's Secret volume mounts."""
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        sv = vols.get(m["name"], {}).get("secret")
        if sv:
            keys = ([i["path"] for i in sv["items"]] if sv.get("items")
                    else list(sec.get(sv["secretName"], {}).get("data", {})))
            for k in keys:
                out[f"{m['mountPath']}/{k}"] = sv["secretName"]
    return out


def check_k8s_store(where, by_kind, eff, secret_mounts, labels, np, sec):
    """With a shared --session_store: the StatefulSet it names, and the NetworkPolicies between the
    server's pods and it. Without one: no store rendered for nobody."""
    sts = by_kind.get("StatefulSet", [])
    store = eff.get("session_store", "memory")
    if store == "memory":
        check(f"{where}: no session store rendered while --session_store=memory", not sts,
              f"StatefulSets {[o['metadata']['name'] for o in sts]}")
        return
    url = store_url(where, store)
    if url is None:
        return
    host, port = url
    name = host.split(".")[0]
    svc = next((s for s in by_kind.get("Service", []) if s["metadata"]["name"] == name), None)
    if not check(f"{where}: --session_store names a rendered Service ({name})", svc is not None,
                 f"Services {[s['metadata']['name'] for s in by_kind.get('Service', [])]}"):
        return
    sport = next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
    check(f"{where} Service/{name}: has the port the server dials ({port})", sport is not None,
          f"ports {svc['spec']['ports']}")
    st = next((o for o in sts if selects(svc["spec"].get("selector"), o["spec"]["template"]["metadata"]["labels"])),
              None)
    if not check(f"{where} Service/{name}: selects the pods of a StatefulSet", st is not None,
                 f"selector {svc['spec'].get('selector')}, StatefulSets {[o['metadata']['name'] for o in sts]}"):
        return
    n = f"{where} StatefulSet/{st['metadata']['name']}"
    spec, pod = st["spec"], st["spec"]["template"]["spec"]
    store_labels = spec["template"]["metadata"]["labels"]
    check(f"{n}: one replica (more pods behind the Service would be separate stores, each with some sessions)",
          spec.get("replicas", 1) == 1, f"replicas {spec.get('replicas')}")
    check(f"{n}: governed by the headless Service {name}",
          spec.get("serviceName") == name and svc["spec"].get("clusterIP") == "None",
          f"serviceName {spec.get('serviceName')}, clusterIP {svc['spec'].get('clusterIP')}")
    c = pod["containers"][0]
    cports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
    text, reads = redis_command(c.get("command", []) + c.get("args", []))
    listen = redis_port(text)
    check(f"{n}: Redis listens on a container port ({listen})", listen in cports, f"container ports {cports}")
    if sport:
        target = sport.get("targetPort", port)
        check(f"{where} Service/{name}: port {port} targets Redis' port", target in (listen, cports.get(listen)),
              f"targetPort {target}, Redis listens on {listen} ({cports.get(listen)})")
    check(f"{n}: append-only file on (--appendonly yes)", "--appendonly yes" in text, text)
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    m = re.search(r"--dir (\S+)", text)
    data = m.group(1) if m else "/data"
    check(f"{n}: Redis' directory {data} is a volumeClaimTemplate's volume",
          any(vm["mountPath"] == data and vm["name"] in claims for vm in c.get("volumeMounts", [])),
          f"mounts {c.get('volumeMounts')}, claim templates {sorted(claims)}")
    pw = eff.get("session_store_password_file", "")
    check(f"{where}: --session_store_password_file is a mounted Secret key", pw in secret_mounts,
          f"--session_store_password_file={pw}, Secret files: {sorted(secret_mounts)}")
    mine = secret_files(pod, c, sec)
    check(f"{n}: --requirepass reads the Secret the server's --session_store_password_file comes from",
          reads in mine and mine[reads] == secret_mounts.get(pw),
          f"--requirepass reads {reads} ({mine.get(reads)}), the server's password is {secret_mounts.get(pw)}")
    mm = re.search(r"--maxmemory (\d+)([kmg]b?)?(?:\s|$)", text, re.I)
    check(f"{n}: --maxmemory with --maxmemory-policy noeviction (no session dropped silently)",
          mm and "--maxmemory-policy noeviction" in text, text)
    res = c.get("resources", {})
    check(f"{n}: requests CPU and memory, limits memory",
          {"cpu", "memory"} <= set(res.get("requests", {})) and "memory" in res.get("limits", {}), f"resources {res}")
    if mm and "memory" in res.get("limits", {}):
        check(f"{n}: memory limit at least twice --maxmemory (an append-only file rewrite forks)",
              quantity_bytes(res["limits"]["memory"]) >= 2 * redis_bytes(*mm.groups()),
              f"limit {res['limits']['memory']}, --maxmemory {mm.group(0).strip()}")
    for probe in ("readinessProbe", "livenessProbe"):
        cmd = " ".join(c.get(probe, {}).get("exec", {}).get("command", []))
        check(f"{n}: {probe} pings with redis-cli and the password", "redis-cli" in cmd and "ping" in cmd
              and bool(reads) and reads in cmd, f"{probe} {c.get(probe)}")
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    check(f"{n}: non-root, seccomp RuntimeDefault (the namespace's restricted Pod Security Standard)",
          psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0
          and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"securityContext {psc}")
    check(f"{n}: read-only root filesystem, no privilege escalation, all capabilities dropped",
          csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
          and "ALL" in csc.get("capabilities", {}).get("drop", []), f"securityContext {csc}")

    # The store holds every session in plaintext connections: only the server's pods reach it, and
    # the server's policy lets them (and their DNS lookups) out.
    ports_ok = (listen, cports.get(listen))
    snp = [x for x in by_kind.get("NetworkPolicy", []) if selects(x["spec"]["podSelector"], store_labels)]
    if check(f"{where}: one NetworkPolicy selects the store's pods", len(snp) == 1,
             f"{[x['metadata']['name'] for x in snp]}"):
        rules = snp[0]["spec"].get("ingress", [])
        only = "Ingress" in snp[0]["spec"].get("policyTypes", ["Ingress"]) and bool(rules) and all(
            r.get("from") and all(set(f) == {"podSelector"} and selects(f["podSelector"], labels) for f in r["from"])
            and r.get("ports") and all(p.get("port") in ports_ok for p in r["ports"]) for r in rules)
        check(f"{where} NetworkPolicy/{snp[0]['metadata']['name']}: admits tost-serve's pods only, on the store's "
              "port", only, f"ingress {rules}")
    if np and "Egress" in np["spec"].get("policyTypes", []):
        egress = np["spec"].get("egress", [])
        to_store = any((not r.get("ports") or any(p.get("port") in ports_ok and p.get("protocol", "TCP") == "TCP"
                                                  for p in r["ports"]))
                       and (not r.get("to") or any("ipBlock" not in t and "namespaceSelector" not in t
                                                   and selects(t.get("podSelector"), store_labels) for t in r["to"]))
                       for r in egress)
        dns = any(not r.get("ports") or any(p.get("port") == 53 and p.get("protocol", "TCP") == "UDP"
                                            for p in r["ports"]) for r in egress)
        check(f"{where} NetworkPolicy/{np['metadata']['name']}: lets the server reach the store and DNS",
              to_store and dns, f"egress {egress}")


def check_k8s_grpc_proxy(src, where, dname, proxy, c, eff, vols, sec):
    """The grpc-proxy sidecar in front of the server's loopback gRPC port; returns its gRPC port."""
    pname = f"{where} initContainer grpc-proxy"
    env = {e["name"]: e.get("value") for e in proxy.get("env", [])}
    check_proxy_env(pname, src, env)
    check(f"{pname}: a native sidecar (restartPolicy Always: up before the server, down after its drain)",
          proxy.get("restartPolicy") == "Always", f"restartPolicy={proxy.get('restartPolicy')}")
    check(f"{pname}: runs tost-grpc-proxy from the server's image",
          proxy.get("command") == PROXY_ENTRYPOINT and proxy.get("image") == c.get("image"),
          f"command {proxy.get('command')}, image {proxy.get('image')} vs {c.get('image')}")
    check(f"{pname}: forwards to --port on the loopback the server alone listens on (--host=127.0.0.1)",
          env.get("TOST_GRPC_UPSTREAM") == f"127.0.0.1:{eff.get('port')}" and eff.get("host") == "127.0.0.1",
          f"TOST_GRPC_UPSTREAM={env.get('TOST_GRPC_UPSTREAM')}, --port={eff.get('port')}, --host={eff.get('host')}")
    pports = {p["name"]: p["containerPort"] for p in proxy.get("ports", [])}
    listen = env.get("TOST_GRPC_PROXY_PORT", PROXY_PORT_DEFAULT)
    check(f"{pname}: its grpc containerPort is TOST_GRPC_PROXY_PORT", str(pports.get("grpc")) == listen,
          f"expected {listen}, got {pports.get('grpc')}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check(f"{pname}: {probe} connects to its port",
              proxy.get(probe, {}).get("tcpSocket", {}).get("port") in (pports.get("grpc"), "grpc"), f"{proxy.get(probe)}")
    csc = proxy.get("securityContext", {})
    check(f"{pname}: read-only root filesystem, no privilege escalation, all capabilities dropped",
          csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
          and "ALL" in csc.get("capabilities", {}).get("drop", []), f"securityContext {csc}")
    mounts = {m["mountPath"]: m["name"] for m in proxy.get("volumeMounts", [])}
    check(f"{pname}: writable emptyDir at /tmp", "emptyDir" in vols.get(mounts.get("/tmp"), {}), f"mounts {mounts}")
    check(f"{pname}: a memory limit", bool(proxy.get("resources", {}).get("limits", {}).get("memory")),
          f"resources {proxy.get('resources')}")
    # TLS at the proxy: both files, each a key of a mounted Secret.
    tls_files = [env.get(k) for k in ("TOST_PROXY_TLS_CERT_FILE", "TOST_PROXY_TLS_KEY_FILE")]
    if any(tls_files):
        for f in tls_files:
            mount = next((mp for mp in mounts if f and f.startswith(mp.rstrip("/") + "/")), None)
            v = vols.get(mounts.get(mount), {})
            name = v.get("secret", {}).get("secretName")
            key = f[len(mount.rstrip("/")) + 1:] if mount and f else None
            check(f"{pname}: TLS file {f} is a key of a mounted Secret",
                  name in sec and key in sec[name].get("data", {}), f"mount {mount}, Secret {name}")
    return pports.get("grpc")


def check_k8s_semantics(src, server, variant, objs, dockerfiles, compose_images):
    where = f"deploy/k8s/{variant}"
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    one = lambda kind: (by_kind.get(kind) or [None])[0]  # noqa: E731
    for kind in ("Namespace", "Deployment", "ConfigMap", "Secret", "Service", "NetworkPolicy", "ServiceMonitor",
                 "PodDisruptionBudget"):
        check(f"{where}: renders a {kind}", kind in by_kind, f"kinds rendered: {sorted(by_kind)}")
    # Two autoscalers of one Deployment undo each other: the base's HPA, or KEDA's ScaledObject
    # (components/keda removes the HPA; KEDA makes its own).
    autoscalers = by_kind.get("HorizontalPodAutoscaler", []) + by_kind.get("ScaledObject", [])
    check(f"{where}: renders one autoscaler (a HorizontalPodAutoscaler or a KEDA ScaledObject)", len(autoscalers) == 1,
          f"rendered {[o['kind'] + '/' + o['metadata']['name'] for o in autoscalers]}")
    dep = one("Deployment")
    if dep is None:
        return
    ns = one("Namespace")["metadata"]["name"] if one("Namespace") else None
    stray = [f"{o['kind']}/{o['metadata']['name']}" for o in objs
             if o["kind"] != "Namespace" and o["metadata"].get("namespace") != ns]
    check(f"{where}: every object is in namespace {ns}", not stray, f"outside it: {stray}")
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    c = pod["containers"][0]
    dname = f"{where} Deployment/{dep['metadata']['name']} container {c['name']}"
    check(f"{where}: Deployment selector matches its pod labels", selects(dep["spec"]["selector"], labels),
          f"selector {dep['spec']['selector']} vs labels {labels}")

    # The image, and the Dockerfile it is built from (compose's image -> Dockerfile).
    image = c["image"]
    dockerfile = compose_images.get(image)
    check(f"{dname}: image {image} is one docker-compose.yml builds", dockerfile is not None,
          f"expected one of {sorted(compose_images)}")
    df = dockerfiles.get(dockerfile)
    entry = df.exec_form("ENTRYPOINT") if df else ["tost_server"]

    # Files the container sees: ConfigMap and Secret volumes.
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in by_kind.get("ConfigMap", [])}
    sec = {o["metadata"]["name"]: o for o in by_kind.get("Secret", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    files, secret_mounts = {}, {}
    for m in c.get("volumeMounts", []):
        v = vols.get(m["name"])
        if not check(f"{dname}: volumeMount {m['name']} has a volume", v is not None, f"volumes: {sorted(vols)}"):
            continue
        if "configMap" in v:
            name = v["configMap"]["name"]
            if check(f"{dname}: ConfigMap {name} of volume {m['name']} is rendered", name in cms,
                     f"ConfigMaps: {sorted(cms)}"):
                for k, text in cms[name].items():
                    files[f"{m['mountPath']}/{k}"] = text
        if "secret" in v:
            name = v["secret"]["secretName"]
            if check(f"{dname}: Secret {name} of volume {m['name']} is rendered", name in sec,
                     f"Secrets: {sorted(sec)}"):
                keys = set(sec[name].get("data", {}))
                items = v["secret"].get("items")
                paths = {i["path"]: i["key"] for i in items} if items else {k: k for k in keys}
                for p, k in paths.items():
                    check(f"{dname}: Secret {name} has key {k}", k in keys, f"keys: {sorted(keys)}")
                    secret_mounts[f"{m['mountPath']}/{p}"] = name

    flags, problems = expand_flags(entry[1:] + c.get("args", []), files, f"{dname} args")
    check(f"{dname}: --flagfile files are mounted and hold flags", not problems, "; ".join(problems))
    unknown = server.unknown(flags)
    check(f"{dname}: flags (ENTRYPOINT, args and flag files) exist in tost_server --helpfull", not unknown,
          f"unknown: {unknown} (from {sorted({w for n, _, w in flags if n in unknown})})")
    if not unknown and not problems:
        ok, detail = server.accepts(flags)
        check(f"{dname}: tost_server accepts the flags", ok, detail)
    eff = effective(flags)
    check(f"{dname}: --session_key_file is a mounted Secret key", eff.get("session_key_file") in secret_mounts,
          f"--session_key_file={eff.get('session_key_file')}, Secret files: {sorted(secret_mounts)}")
    tls = bool(eff.get("tls_cert_file"))
    for f in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        if eff.get(f):
            check(f"{dname}: --{f} is a mounted Secret key", eff[f] in secret_mounts,
                  f"--{f}={eff[f]}, Secret files: {sorted(secret_mounts)}")

    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    proxy = next((x for x in pod.get("initContainers", []) if x.get("name") == "grpc-proxy"), None)
    if proxy is not None:
        ports["grpc"] = check_k8s_grpc_proxy(src, where, dname, proxy, c, eff, vols, sec)
    else:
        check(f"{dname}: grpc containerPort is --port", str(ports.get("grpc")) == eff.get("port"),
              f"expected {eff.get('port')}, got {ports.get('grpc')}")
    check(f"{dname}: metrics containerPort is --metrics_port", str(ports.get("metrics")) == eff.get("metrics_port"),
          f"expected {eff.get('metrics_port')}, got {ports.get('metrics')}")
    check(f"{dname}: http containerPort is --http_port", str(ports.get("http")) == eff.get("http_port", HTTP_PORT_DEFAULT),
          f"expected {eff.get('http_port', HTTP_PORT_DEFAULT)}, got {ports.get('http')}")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        p = c.get(probe, {})
        if proxy is not None:
            # The kubelet cannot reach a gRPC port on the pod's loopback: the HTTP health routes.
            path = "/v1/health/live" if probe == "livenessProbe" else "/v1/health/ready"
            get = p.get("httpGet", {})
            check(f"{dname}: {probe} is GET {path} on the http port",
                  get.get("path") == path and get.get("port") in ("http", ports.get("http")), f"got {p}")
        elif tls:
            cmd = p.get("exec", {}).get("command", [])
            ca = next((a.split("=", 1)[1] for a in cmd if a.startswith("--tls_ca=")), None)
            check(f"{dname}: {probe} runs grpc.health.v1 over TLS (the kubelet's gRPC probe is plaintext)",
                  "grpc" not in p and cmd[:1] == ["tost_health_check"]
                  and f"--address=127.0.0.1:{ports.get('grpc')}" in cmd and ca in secret_mounts,
                  f"expected exec tost_health_check --address=127.0.0.1:{ports.get('grpc')} --tls_ca=<mounted CA>, "
                  f"got {p}")
        else:
            check(f"{dname}: {probe} is a grpc.health.v1 probe on the gRPC port",
                  p.get("grpc", {}).get("port") == ports.get("grpc"),
                  f"expected grpc.port {ports.get('grpc')}, got {p}")

    grace = pod.get("terminationGracePeriodSeconds", 30)
    pre = c.get("lifecycle", {}).get("preStop", {})
    pre_s = pre.get("sleep", {}).get("seconds", 0)
    drain = int(eff.get("drain_timeout_s", 30))
    check(f"{where}: terminationGracePeriodSeconds exceeds preStop + --drain_timeout_s + 1 s",
          grace > pre_s + drain + 1, f"expected more than {pre_s} + {drain} + 1 = {pre_s + drain + 1}, got {grace}")

    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    want_uid = (df.final("USER") or ["?"])[-1].split(":")[0] if df else "?"
    check(f"{where}: pod runs as non-root uid {want_uid} (the image's USER)",
          psc.get("runAsNonRoot") is True and str(psc.get("runAsUser")) == want_uid,
          f"runAsNonRoot={psc.get('runAsNonRoot')} runAsUser={psc.get('runAsUser')}")
    check(f"{where}: pod seccompProfile is RuntimeDefault",
          psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"got {psc.get('seccompProfile')}")
    check(f"{dname}: read-only root filesystem, no privilege escalation, all capabilities dropped",
          csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
          and "ALL" in csc.get("capabilities", {}).get("drop", []), f"securityContext {csc}")
    tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
    check(f"{dname}: writable emptyDir at /tmp", bool(tmp) and "emptyDir" in vols.get(tmp[0]["name"], {}),
          f"mounts: {[m['mountPath'] for m in c.get('volumeMounts', [])]}")

    gpu = "gpu" in variant.split(os.sep)[-1].split("+")[0]
    limits = c.get("resources", {}).get("limits", {})
    if gpu:
        check(f"{dname}: requests an nvidia.com/gpu", int(limits.get("nvidia.com/gpu", 0)) >= 1, f"limits {limits}")
        check(f"{where}: tolerates the nvidia.com/gpu taint",
              any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])), f"{pod.get('tolerations')}")
        check(f"{where}: selects GPU nodes", bool(pod.get("nodeSelector")), f"nodeSelector {pod.get('nodeSelector')}")
        check(f"{dname}: --device=cuda", eff.get("device", "").startswith("cuda"), f"--device={eff.get('device')}")
        check(f"{dname}: --dtype=bf16", eff.get("dtype") == "bf16", f"--dtype={eff.get('dtype')}")
        check(f"{dname}: the CUDA image", (dockerfile or "").endswith(".cuda"), f"{image} builds from {dockerfile}")
    elif variant.startswith("overlays") or variant.startswith("variants"):
        check(f"{dname}: --device=cpu", eff.get("device") == "cpu", f"--device={eff.get('device')}")
        check(f"{dname}: no GPU requested", "nvidia.com/gpu" not in limits, f"limits {limits}")
        check(f"{dname}: the CPU image", dockerfile == os.path.join("deploy", "docker", "Dockerfile"),
              f"{image} builds from {dockerfile}")

    # The server's Services; a session store's (selecting a StatefulSet's pods) is checked with the store.
    store_pods = [o["spec"]["template"]["metadata"]["labels"] for o in by_kind.get("StatefulSet", [])]
    svcs = [s for s in by_kind.get("Service", [])
            if not any(selects(s["spec"].get("selector"), lb) for lb in store_pods)]
    headless = [s for s in svcs if s["spec"].get("clusterIP") == "None"]
    cluster = [s for s in svcs if s["spec"].get("clusterIP") != "None"]
    check(f"{where}: a headless Service and a ClusterIP Service", len(headless) == 1 and len(cluster) == 1,
          f"headless {[s['metadata']['name'] for s in headless]}, ClusterIP {[s['metadata']['name'] for s in cluster]}")
    for s in svcs:
        n = f"{where} Service/{s['metadata']['name']}"
        check(f"{n}: selects the pods", selects(s["spec"]["selector"], labels), f"{s['spec']['selector']} vs {labels}")
        for p in s["spec"]["ports"]:
            check(f"{n}: port {p['name']} targets a container port", p["targetPort"] in ports
                  or p["targetPort"] in ports.values(), f"targetPort {p['targetPort']}, container ports {ports}")
        check(f"{n}: serves gRPC", any(p["targetPort"] in ("grpc", ports.get("grpc")) for p in s["spec"]["ports"]),
              f"ports {s['spec']['ports']}")
    for s in cluster:
        n = f"{where} Service/{s['metadata']['name']}"
        check(f"{n}: a port named http serves the HTTP front end",
              any(p["name"] == "http" and p["targetPort"] in ("http", ports.get("http")) for p in s["spec"]["ports"]),
              f"ports {s['spec']['ports']}")

    sm = one("ServiceMonitor")
    if sm:
        chosen = [s for s in svcs if selects(sm["spec"]["selector"], s["metadata"].get("labels", {}))]
        check(f"{where} ServiceMonitor/{sm['metadata']['name']}: selects exactly one Service", len(chosen) == 1,
              f"selector {sm['spec']['selector']} matches {[s['metadata']['name'] for s in chosen]}")
        for ep in sm["spec"].get("endpoints", []):
            check(f"{where} ServiceMonitor/{sm['metadata']['name']}: endpoint port {ep.get('port')} is a Service port "
                  "on the metrics container port",
                  any(p["name"] == ep.get("port") and p["targetPort"] in ("metrics", ports.get("metrics"))
                      for s in chosen for p in s["spec"]["ports"]),
                  f"Services {[s['metadata']['name'] for s in chosen]}")

    np = next((x for x in by_kind.get("NetworkPolicy", []) if selects(x["spec"]["podSelector"], labels)),
              one("NetworkPolicy"))
    if np:
        n = f"{where} NetworkPolicy/{np['metadata']['name']}"
        check(f"{n}: selects the pods", selects(np["spec"]["podSelector"], labels), f"{np['spec']['podSelector']}")
        allowed = {p.get("port") for rule in np["spec"].get("ingress", []) for p in rule.get("ports", [])}
        for name in ("grpc", "metrics"):
            check(f"{n}: admits the {name} port", name in allowed or ports.get(name) in allowed,
                  f"ingress ports {sorted(map(str, allowed))}")

    check_k8s_store(where, by_kind, eff, secret_mounts, labels, np, sec)

    pdb = one("PodDisruptionBudget")
    hpa = one("HorizontalPodAutoscaler")
    if pdb:
        check(f"{where} PodDisruptionBudget: selects the pods", selects(pdb["spec"]["selector"], labels),
              f"{pdb['spec']['selector']}")
    if hpa:
        n = f"{where} HorizontalPodAutoscaler/{hpa['metadata']['name']}"
        ref = hpa["spec"]["scaleTargetRef"]
        check(f"{n}: scales the Deployment", ref["kind"] == "Deployment" and ref["name"] == dep["metadata"]["name"],
              f"scaleTargetRef {ref}")
        check(f"{n}: at least 2 replicas", hpa["spec"].get("minReplicas", 1) >= 2,
              f"minReplicas {hpa['spec'].get('minReplicas')}")
        if pdb and "minAvailable" in pdb["spec"]:
            check(f"{where}: PodDisruptionBudget minAvailable is below the HPA's minReplicas",
                  int(pdb["spec"]["minAvailable"]) < hpa["spec"].get("minReplicas", 1),
                  f"minAvailable {pdb['spec']['minAvailable']}, minReplicas {hpa['spec'].get('minReplicas')}")
        metrics = hpa["spec"].get("metrics", [])
        custom = [m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"]
        rules, rules_path = adapter_metrics(src)
        check(f"{n}: scales on a serving signal (a Pods metric)", bool(custom), f"metrics {metrics}")
        real = service_metric_names(src)
        for name in custom:
            rule = rules.get(name)
            if check(f"{n}: Pods metric {name} is defined in {os.path.relpath(rules_path, src)}", rule is not None,
                     f"adapter rules define {sorted(rules)}"):
                used = set(re.findall(r"\btost_[a-z_]+", rule.get("seriesQuery", "") + rule.get("metricsQuery", "")))
                check(f"{n}: the adapter rule for {name} reads real tost_server metrics", used and used <= real,
                      f"not exported by service/: {sorted(used - real)}")
        check(f"{n}: CPU utilisation is the fallback metric",
              any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in metrics), f"metrics {metrics}")
    check_k8s_keda(src, where, one("ScaledObject"), dep, pdb, ns)
    check_k8s_inference_pool(where, by_kind, labels, ports, eff)


def check_k8s_keda(src, where, so, dep, pdb, ns):
    """A KEDA ScaledObject: it scales the Deployment from 2 replicas, on queued generations per replica
    read from Prometheus (real tost_server series, this namespace), with CPU beside."""
    if not so:
        return
    n = f"{where} ScaledObject/{so['metadata']['name']}"
    spec = so["spec"]
    ref = spec["scaleTargetRef"]
    check(f"{n}: scales the Deployment", ref.get("kind", "Deployment") == "Deployment" and ref["name"] == dep["metadata"]["name"],
          f"scaleTargetRef {ref}")
    lowest = spec.get("minReplicaCount", 0)
    check(f"{n}: at least 2 replicas", lowest >= 2, f"minReplicaCount {lowest}")
    if pdb and "minAvailable" in pdb["spec"]:
        check(f"{where}: PodDisruptionBudget minAvailable is below the ScaledObject's minReplicaCount",
              int(pdb["spec"]["minAvailable"]) < lowest, f"minAvailable {pdb['spec']['minAvailable']}, minReplicaCount {lowest}")
    triggers = spec.get("triggers", [])
    prometheus = [t for t in triggers if t.get("type") == "prometheus"]
    check(f"{n}: scales on a serving signal per replica (a prometheus trigger, metricType AverageValue)",
          bool(prometheus) and all(t.get("metricType", "AverageValue") == "AverageValue" for t in prometheus),
          f"triggers {triggers}")
    real = service_metric_names(src)
    for t in prometheus:
        query = t.get("metadata", {}).get("query", "")
        used = set(re.findall(r"\btost_[a-z_]+", query))
        check(f"{n}: trigger {t.get('name')} reads real tost_server metrics", bool(used) and used <= real,
              f"query {query!r}: not exported by service/: {sorted(used - real)}")
        check(f"{n}: trigger {t.get('name')} reads this namespace's pods", f'namespace="{ns}"' in query, f"query {query!r}")
        check(f"{n}: trigger {t.get('name')} has a threshold", float(t.get("metadata", {}).get("threshold", "0")) > 0,
              f"metadata {t.get('metadata')}")
    check(f"{n}: CPU utilisation is a second trigger", any(t.get("type") == "cpu" for t in triggers), f"triggers {triggers}")


def check_k8s_inference_pool(where, by_kind, labels, ports, eff):
    """The Gateway API Inference Extension's objects: the InferencePool selects the pods on the HTTP
    front end's port, names its endpoint picker with a port (the CRD's CEL rule, which no offline
    validator runs), the picker can read the metrics (vLLM's names on, the metrics port admitted) and
    the gateway reach the pool's port; every InferenceObjective names a rendered pool."""
    pools = by_kind.get("InferencePool", [])
    admitted = {}
    for np in by_kind.get("NetworkPolicy", []):
        if not selects(np["spec"]["podSelector"], labels):
            continue
        for rule in np["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                port = p.get("port")
                admitted.setdefault(ports.get(port, port), []).append(rule.get("from"))
    for pool in pools:
        n = f"{where} InferencePool/{pool['metadata']['name']}"
        spec = pool["spec"]
        check(f"{n}: selects the pods", selects(spec["selector"], labels), f"{spec['selector']} vs {labels}")
        numbers = [p["number"] for p in spec.get("targetPorts", [])]
        check(f"{n}: targets the HTTP front end's container port", numbers == [ports.get("http")],
              f"targetPorts {numbers}, http containerPort {ports.get('http')}")
        epp = spec.get("endpointPickerRef") or {}
        check(f"{n}: names its endpoint picker, with a port when it is a Service",
              bool(epp.get("name")) and (epp.get("kind", "Service") != "Service" or "number" in (epp.get("port") or {})),
              f"endpointPickerRef {epp}")
        check(f"{n}: the server exports the protocol's gauges under vLLM's names (--metrics_vllm_names)",
              eff.get("metrics_vllm_names") == "true", f"--metrics_vllm_names={eff.get('metrics_vllm_names')}")
        check(f"{n}: a NetworkPolicy admits the gateway to port {ports.get('http')}", ports.get("http") in admitted,
              f"admitted ports {sorted(map(str, admitted))}")
        check(f"{n}: a NetworkPolicy admits the endpoint picker to the metrics port",
              any(sources for sources in admitted.get(ports.get("metrics"), [])
                  if any("podSelector" in s for s in sources)), f"metrics port sources {admitted.get(ports.get('metrics'))}")
    names = {p["metadata"]["name"] for p in pools}
    for obj in by_kind.get("InferenceObjective", []):
        ref = obj["spec"].get("poolRef", {})
        check(f"{where} InferenceObjective/{obj['metadata']['name']}: names a rendered InferencePool",
              ref.get("name") in names and ref.get("group", "inference.networking.k8s.io") == "inference.networking.k8s.io"
              and ref.get("kind", "InferencePool") == "InferencePool", f"poolRef {ref}, pools {sorted(names)}")


# --------------------------------------------------------------------------------------------
# static and docs

def git_tracked(src):
    r = run(["git", "-C", src, "ls-files", "--", "deploy", "docker-compose.yml"])
    return r.stdout.split() if r.returncode == 0 else None


def secret_inputs(src):
    """Files secrets are made from, which each deployment creates: kustomize secretGenerator inputs
    and compose secret files (relative to SOURCE_DIR)."""
    out = {os.path.normpath(os.path.join("deploy", "k8s", d, f))
           for d, f in generator_inputs(os.path.join(src, "deploy", "k8s"))}
    compose = yaml.safe_load(open(os.path.join(src, "docker-compose.yml"))) or {}
    out |= {os.path.normpath(s["file"]) for s in compose.get("secrets", {}).values() if "file" in s}
    return out


def check_static(src, venv):
    check_proxy_entrypoint(src)
    paths = [os.path.join(src, "docker-compose.yml")]
    for root, _, files in os.walk(os.path.join(src, "deploy")):
        paths += [os.path.join(root, f) for f in files if f.endswith((".yml", ".yaml"))]
    for p in sorted(paths):
        try:
            list(yaml.safe_load_all(open(p)))
            check(f"{os.path.relpath(p, src)} parses", True)
        except (yaml.YAMLError, OSError) as e:
            check(f"{os.path.relpath(p, src)} parses", False, str(e).replace("\n", " "))
    conf = os.path.join(src, ".yamllint")
    r = run([os.path.join(venv, "bin", "yamllint"), "--strict", "-f", "parsable", "-c", conf,
             os.path.join(src, "docker-compose.yml"), os.path.join(src, "deploy")])
    check("yamllint (.yamllint) passes on docker-compose.yml and deploy/", r.returncode == 0,
          " | ".join(ln.replace(src + "/", "") for ln in r.stdout.splitlines()))
    # Secrets: none committed, none written as a Secret object, every generator input ignored by git.
    for root, _, files in os.walk(os.path.join(src, "deploy")):
        for f in files:
            if f.endswith((".yml", ".yaml")):
                p = os.path.join(root, f)
                try:
                    kinds = [d.get("kind") for d in yaml.safe_load_all(open(p)) if isinstance(d, dict)]
                except yaml.YAMLError:
                    continue
                check(f"{os.path.relpath(p, src)} holds no Secret object (secrets are generated)",
                      "Secret" not in kinds, "found kind: Secret")
    tracked = git_tracked(src)
    if tracked is None:
        print("NOTE git checks skipped: SOURCE_DIR is not a git work tree")
        return
    leaked = [t for t in tracked if re.search(r"(\.key|\.pem|\.crt|\.p12|\.password)$", t)]
    check("no key, certificate or password is committed under deploy/", not leaked, f"tracked: {leaked}")
    for f in sorted(secret_inputs(src)):
        ignored = run(["git", "-C", src, "check-ignore", "-q", "--no-index", f]).returncode == 0
        check(f"secret input {f} is ignored by git", ignored and f not in tracked,
              "expected a .gitignore entry for it" if not ignored else "it is tracked")
    stale = run(["git", "-C", src, "grep", "-n", "-I", "deploy/docker-compose.yml", "--", "README.md", "docs",
                 "tests", "deploy", ":!tests/deploy/check_manifests.py"])
    check("nothing refers to deploy/docker-compose.yml (moved to the root)", stale.stdout.strip() == "",
          stale.stdout.strip().replace("\n", " | "))
    old_layout = r"deploy/k8s(/(deployment|service|hpa|pdb|namespace)\.yaml|[ `)]|$)"
    stale = run(["git", "-C", src, "grep", "-n", "-I", "-E", old_layout, "--", "README.md", "docs", "tests", "deploy",
                 ":!tests/deploy/check_manifests.py"])
    check("nothing applies deploy/k8s itself (a base and overlays now)", stale.stdout.strip() == "",
          stale.stdout.strip().replace("\n", " | "))


def check_deploy_doc(src):
    rel = os.path.join("docs", "deploying.md")
    if not check(f"{rel} exists", os.path.exists(os.path.join(src, rel)), "no deployment page"):
        return
    sec = open(os.path.join(src, rel)).read()
    for needle in ("docker compose up", "--profile gpu", "kubectl apply -k deploy/k8s/overlays/cpu",
                   "deploy/k8s/overlays/gpu", "round_robin", "dns:///", "--max_connection_age_ms",
                   "sessions.md#streams-that-survive-the-loss-of-a-replica", "tests/integration/test_failover.py",
                   "statically", "--profile shared-sessions", "kubectl apply -k deploy/k8s/overlays/cpu-shared-sessions",
                   "appendfsync", "deploy/k8s/components/inference-extension", "deploy/k8s/components/keda",
                   "deploy/k8s/components/hpa-queued-requests", "--model-server-metrics-port=8502"):
        check(f"{rel} mentions {needle}", needle in sec, f"'{needle}' not in the page")
    path_re = r"(?<![\w/])((?:deploy|tests|scripts)/[A-Za-z0-9_./+-]*[A-Za-z0-9_]|docker-compose\.yml)"
    for p in sorted(set(re.findall(path_re, sec))):
        if p == "tests/integration/test_failover.py":
            continue  # written by the failover work
        check(f"{rel}: {p} exists", os.path.exists(os.path.join(src, p)) or p in secret_inputs(src),
              f"{os.path.join(src, p)} does not exist (and is not a secret input each deployment creates)")


# --------------------------------------------------------------------------------------------

def run_checks(src, server_bin, venv, only, only_variants=None):
    work = tempfile.mkdtemp(prefix="tost-deploy-check-")
    try:
        server = Server(server_bin, work)
        check("tost_server --helpfull lists its flags", {"port", "model_repository", "flagfile"} <= server.known,
              f"{len(server.known)} flags found")
        compose_images = {}
        if "static" in only:
            check_static(src, venv)
        if {"compose", "images", "k8s"} & set(only):
            compose_images = check_compose(src, server, venv) if "compose" in only else quiet_compose_images(src)
        dockerfiles = {}
        if {"images", "k8s"} & set(only):
            dockerfiles = check_images(src, server, compose_images) if "images" in only else {
                os.path.relpath(p, src): Dockerfile(p)
                for p in glob.glob(os.path.join(src, "deploy", "docker", "Dockerfile*"))}
        if "k8s" in only:
            rendered = render_variants(src, work, only_variants)
            for variant, objs in rendered.items():
                validate_objects(src, venv, variant, objs, work)
                check_k8s_semantics(src, server, variant, objs, dockerfiles, compose_images)
        if "docs" in only:
            check_deploy_doc(src)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{check.passed} passed, {check.failed} failed")
    return 1 if check.failed else 0


def quiet_compose_images(src):
    doc = yaml.safe_load(open(os.path.join(src, "docker-compose.yml")))
    return {s.get("image", ""): os.path.normpath(os.path.join(s["build"].get("context", "."),
                                                              s["build"].get("dockerfile", "Dockerfile")))
            for s in doc.get("services", {}).values() if "build" in s}


# Each: (what it breaks, section[:kustomization], file, old text, new text, a text the FAIL line must
# contain). Only the section (and kustomization) concerned is checked, to keep the self-test short.
MUTATIONS = [
    ("the proxy's entrypoint no longer checks its call rate", "static", PROXY_ENTRYPOINT_SCRIPT,
     'whole_number TOST_PROXY_CALLS_PER_SECOND "$TOST_PROXY_CALLS_PER_SECOND" 1000000\n', "",
     "refuses TOST_PROXY_CALLS_PER_SECOND='1k'"),
    ("a compose proxy with a call rate its entrypoint refuses", "compose", "docker-compose.yml",
     'environment: {TOST_GRPC_UPSTREAM: "tost-serve:8500"}',
     'environment: {TOST_GRPC_UPSTREAM: "tost-serve:8500", TOST_PROXY_CALL_BURST: "2k"}',
     "passes deploy/proxy/entrypoint.sh's checks"),
    ("unknown flag in the gpu overlay's flag file", "k8s:overlays/gpu", "deploy/k8s/overlays/gpu/device.flags",
     "--dtype=bf16", "--dtype=bf16\n--no_such_flag=1", "unknown: ['no_such_flag']"),
    ("bad --device value in the cpu overlay", "k8s:overlays/cpu", "deploy/k8s/overlays/cpu/device.flags",
     "--device=cpu", "--device=gpu", "tost_server accepts the flags"),
    ("grace period shorter than the drain", "k8s:overlays/cpu", "deploy/k8s/base/deployment.yaml",
     "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds exceeds"),
    ("unknown Deployment field", "k8s:overlays/gpu", "deploy/k8s/base/deployment.yaml",
     "automountServiceAccountToken: false", "automountServiceAccountTokens: false",
     "'automountServiceAccountTokens' was unexpected"),
    ("unknown ServiceMonitor endpoint field", "k8s:base", "deploy/k8s/base/servicemonitor.yaml",
     "scrapeTimeout: 4s", "scrapeTimeoutt: 4s", "servicemonitor-monitoring.coreos.com-v1.json"),
    ("unknown compose service key", "compose", "docker-compose.yml",
     "    image: tost-serve:0.1.0\n", "    image: tost-serve:0.1.0\n    restart_policy: always\n",
     "validates against the compose specification"),
    ("unknown flag in compose", "compose", "docker-compose.yml",
     "--drain_timeout_s=20\n      - --batch_invariant_decode=true\n    ports: [\"8501",
     "--drain_timeout_s=20\n      - --batch_invariant_decoding=true\n    ports: [\"8501",
     "unknown: ['batch_invariant_decoding']"),
    ("compose proxy forwarding to the wrong port", "compose", "docker-compose.yml",
     'TOST_GRPC_UPSTREAM: "tost-serve:8500"', 'TOST_GRPC_UPSTREAM: "tost-serve:8501"',
     "a grpc-proxy service forwards to its --port"),
    ("sidecar forwarding to the wrong port", "k8s:overlays/cpu", "deploy/k8s/base/deployment.yaml",
     'value: "127.0.0.1:8400"', 'value: "127.0.0.1:8500"', "forwards to --port on the loopback"),
    ("server gRPC on every address behind the sidecar", "k8s:overlays/gpu", "deploy/k8s/base/server.flags",
     "--host=127.0.0.1", "--host=0.0.0.0", "forwards to --port on the loopback"),
    ("COPY of a missing file", "images", "deploy/docker/Dockerfile",
     "COPY models /models", "COPY modelz /models", "COPY source modelz exists"),
    ("install-deps.sh input not copied first", "images", "deploy/docker/Dockerfile.cuda",
     "COPY requirements.txt requirements-test.txt requirements-deploy.txt ./",
     "COPY requirements.txt requirements-test.txt ./",
     "requirements-deploy.txt is copied before install-deps.sh"),
    ("lint error", "static", "deploy/k8s/base/pdb.yaml", "maxUnavailable: 1", "maxUnavailable: 1   ", "yamllint"),
    ("session store open to every pod", "k8s:overlays/cpu-shared-sessions",
     "deploy/k8s/components/session-store/networkpolicy.yaml", "            matchLabels: {app: tost-serve}",
     "            matchLabels: {}", "admits tost-serve's pods only"),
    ("session store split over two replicas", "k8s:overlays/cpu-shared-sessions",
     "deploy/k8s/components/session-store/statefulset.yaml", "  replicas: 1", "  replicas: 2", "one replica"),
    ("store password file not mounted", "k8s:overlays/cpu-shared-sessions",
     "deploy/k8s/components/session-store/session-store.flags", "/etc/tost/redis/password", "/etc/tost/redis/passwd",
     "--session_store_password_file is a mounted Secret key"),
    ("compose store without the server's password", "compose", "docker-compose.yml",
     "    secrets: [redis_password]\n", "    secrets: [session_key]\n", "--requirepass reads the server's password"),
    # The custom resources of the routing and autoscaling components, against their vendored CRDs.
    ("InferencePool field misspelt", "k8s:variants/cpu+inference-extension",
     "deploy/k8s/components/inference-extension/inferencepool.yaml", "  targetPorts:\n", "  targetPort:\n",
     "validates against deploy/schemas/inference.networking.k8s.io_inferencepools.yaml"),
    ("InferenceObjective priority not an integer", "k8s:variants/cpu+inference-extension",
     "deploy/k8s/components/inference-extension/inferenceobjectives.yaml", "  priority: 10\n", "  priority: high\n",
     "validates against deploy/schemas/inference.networking.x-k8s.io_inferenceobjectives.yaml"),
    ("ScaledObject field misspelt", "k8s:variants/cpu+keda", "deploy/k8s/components/keda/scaledobject.yaml",
     "  minReplicaCount: 2\n", "  minReplicas: 2\n", "validates against deploy/schemas/keda.sh_scaledobjects.yaml"),
    ("HPA on queued requests: target field misspelt", "k8s:variants/cpu+hpa-queued-requests",
     "deploy/k8s/components/hpa-queued-requests/hpa.yaml", 'averageValue: "2"', 'averageValu: "2"',
     "'averageValu' was unexpected"),
]


def self_test(src, server_bin, venv):
    tree = tempfile.mkdtemp(prefix="tost-deploy-selftest-")
    failures = 0
    try:
        def ignore(d, names):
            return [n for n in names if d == src and (n.startswith("build") or n == ".git")]
        shutil.copytree(src, os.path.join(tree, "src"), ignore=ignore, symlinks=True)
        copy = os.path.join(tree, "src")
        # The unmodified tree passing is deploy_manifests' own test; here each break must be caught by
        # the check that names it (the expected text), not by an unrelated failure.
        for what, section, rel, old, new, expect in MUTATIONS:
            path = os.path.join(copy, rel)
            original = open(path).read()
            if old not in original:
                print(f"FAIL self-test: {what}: '{old}' not found in {rel} (update the mutation)")
                failures += 1
                continue
            with open(path, "w") as f:
                f.write(original.replace(old, new, 1))
            section, _, variant = section.partition(":")
            r = run([sys.executable, __file__, copy, server_bin, "--venv", venv, "--only", section]
                    + (["--variants", variant] if variant else []))
            fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
            caught = r.returncode == 1 and any(expect in ln for ln in fails)
            print(f"{'PASS' if caught else 'FAIL'} self-test: {what} ({rel}) is caught"
                  + ("" if caught else f": expected exit 1 and a FAIL line containing '{expect}', got exit "
                     f"{r.returncode} and {fails or 'no FAIL line'}"))
            failures += not caught
            with open(path, "w") as f:
                f.write(original)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    total = len(MUTATIONS)
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source_dir")
    p.add_argument("tost_server")
    p.add_argument("--venv", default="", help="the deploy validators' venv (TOST_DEPLOY_VENV in build/deps.env)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--variants", nargs="+", help="render only these kustomizations (e.g. overlays/cpu)")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    tools = ["kubernetes-validate", "check-jsonschema", "yamllint"]
    if not a.venv or not all(os.path.exists(os.path.join(a.venv, "bin", t)) for t in tools):
        print(f"SKIP: the deploy validators' venv '{a.venv}' is missing {tools}: run scripts/install-deps.sh and "
              "reconfigure (make configure passes TOST_DEPLOY_VENV)")
        return SKIP
    if shutil.which("kubectl") is None:
        print("FAIL kubectl not found: the offline `kubectl kustomize` renders the overlays")
        return 1
    src = os.path.abspath(a.source_dir)
    if a.self_test:
        return self_test(src, os.path.abspath(a.tost_server), a.venv)
    return run_checks(src, os.path.abspath(a.tost_server), a.venv, a.only, a.variants)


if __name__ == "__main__":
    sys.exit(main())
