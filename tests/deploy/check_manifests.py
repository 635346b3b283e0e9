#!/usr/bin/env python3
"""Offline checks of deploy/: every YAML parses, kustomize resources exist, and the Kubernetes,
compose and Docker files agree with each other and with the flags tost_server really has (its
--helpfull output), so a renamed flag or port cannot silently break a deployment.

  check_manifests.py SOURCE_DIR TOST_SERVER_BINARY
Prints one line per check and a closing 'N passed, M failed'; exits 1 on any failure.
Runs on Debian's /usr/bin/python3 with python3-yaml (installed by scripts/install-deps.sh)."""
import os
import re
import subprocess
import sys

import yaml

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}")


def flags_of(args):
    out = {}
    for a in args:
        m = re.match(r"--([a-z_]+)(?:=(.*))?$", a)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    src, server = sys.argv[1], sys.argv[2]
    deploy = os.path.join(src, "deploy")
    helpfull = subprocess.run([server, "--helpfull"], capture_output=True, text=True).stdout
    known = set(re.findall(r"^\s+--([a-z_]+) ", helpfull, re.M))
    check("tost_server --helpfull lists its flags", "port" in known and "model_repository" in known,
          f"{len(known)} flags found")

    docs = {}
    for root, _, files in os.walk(deploy):
        for f in files:
            if f.endswith((".yml", ".yaml")):
                path = os.path.join(root, f)
                try:
                    docs[os.path.relpath(path, deploy)] = list(yaml.safe_load_all(open(path)))
                    check(f"{os.path.relpath(path, src)} parses", True)
                except yaml.YAMLError as e:
                    check(f"{os.path.relpath(path, src)} parses", False, str(e))

    kust = docs["k8s/kustomization.yaml"][0]
    for r in kust["resources"]:
        check(f"kustomization resource {r} exists", os.path.exists(os.path.join(deploy, "k8s", r)))

    dep = docs["k8s/deployment.yaml"][0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    f = flags_of(c["args"])
    unknown = sorted(set(f) - known)
    check("deployment args are real tost_server flags", not unknown, f"unknown: {unknown}")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check("grpc containerPort matches --port", str(ports.get("grpc")) == f.get("port"), f"{ports} vs {f.get('port')}")
    check("metrics containerPort matches --metrics_port", str(ports.get("metrics")) == f.get("metrics_port"))
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        check(f"{probe} uses grpc.health.v1 on the gRPC port", c[probe].get("grpc", {}).get("port") == ports["grpc"])
    drain = int(f.get("drain_timeout_s", 30))
    check("terminationGracePeriodSeconds exceeds --drain_timeout_s", pod["terminationGracePeriodSeconds"] > drain,
          f"{pod['terminationGracePeriodSeconds']} <= {drain}")
    mount = c["volumeMounts"][0]["mountPath"]
    check("session key file lives on the secret mount", f.get("session_key_file", "").startswith(mount + "/"))
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    check("prometheus scrape annotation names the metrics port", ann["prometheus.io/port"] == str(ports["metrics"]))
    check("selector matches pod labels",
          dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items())

    svc = docs["k8s/service.yaml"][0]
    for p in svc["spec"]["ports"]:
        check(f"service port {p['name']} targets a named container port", p["targetPort"] in ports)
    hpa = docs["k8s/hpa.yaml"][0]
    check("hpa targets the deployment", hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"])

    compose = docs["docker-compose.yml"][0]["services"]["tost-serve"]
    cf = flags_of(compose["command"])
    check("compose flags are real tost_server flags", not (set(cf) - known), str(sorted(set(cf) - known)))
    grace = int(compose["stop_grace_period"].rstrip("s"))
    check("compose stop_grace_period exceeds --drain_timeout_s", grace > int(cf.get("drain_timeout_s", 30)))

    dockerfile = open(os.path.join(deploy, "docker", "Dockerfile")).read()
    entry = flags_of(re.findall(r'"(--[^"]+)"', dockerfile.split("ENTRYPOINT", 1)[1]))
    check("Dockerfile ENTRYPOINT flags are real", not (set(entry) - known), str(sorted(set(entry) - known)))
    exposed = set(re.findall(r"^EXPOSE (.*)$", dockerfile, re.M)[0].split())
    check("Dockerfile exposes the gRPC and metrics ports", {entry.get("port"), entry.get("metrics_port")} <= exposed)

    passed, failed = sum(results), len(results) - sum(results)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
