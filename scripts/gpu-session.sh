#!/usr/bin/env bash
# The whole check of a lent GPU machine in one bounded command, from the bundle CI builds
# (scripts/gpu-bundle.sh): no compile step there.
#
#   scripts/gpu-session.sh OUT_DIR [--bundle FILE] [--python PY] [--budget_s S] [--steps a,b,...]
#                          [--dry-run]
#
#   OUT_DIR     every log (OUT_DIR/logs/STEP.log), steps.tsv (step, exit status, seconds, limit)
#               and figures.json (every step's figures), each written as the step ends, so a step
#               that hangs still leaves the others'.
#   --bundle    the bundle (default build-gpu/tost-gpu-bundle.tar.gz), unpacked into
#               $TOST_GPU_SCRATCH (default /tmp/tost-gpu-session).
#   --python    the interpreter whose torch provides LibTorch and CUDA (default python3: on the
#               lent machines, the image's /opt/torch/.venv).
#   --budget_s  the whole run's bound (default 450): each step ends by its own limit or by what is
#               left of this, whichever is sooner; a step with under 10 s left is skipped.
#   --steps     run only these steps, in this order (default: all, in the order below).
#   --device    where the server steps and benchmarks run (default cuda; cpu tries this script's
#               own flow on a machine without a GPU).
#   --dry-run   stop before the first CUDA call: unpack, describe the machine, and check that every
#               bundled binary resolves every library from the bundle, torch's folders and the
#               libraries every image has alone (CI runs this: ctest gpu_bundle_dry_run).
#
# Steps, with their limits and the seconds they took on one H100 (16 cores, 2026-11-26):
#   image            60 s   13 s  driver, device, nvcc, profilers, torch; library resolution
#   gpu_tests       150 s   16-21  tost_gpu_tests (every CUDA kernel against the ATen reference)
#   serve           120 s   3-5   tost_server --device=cuda at fp32 and bf16: models (decode mode),
#                                 a classification, a generation, /metrics
#   serving_test    180 s   15-17 tests/integration/test_gpu_serving.py (CPU vs CUDA servers)
#   kernel_bench     90 s   2     tssa_gpu_bench: the fused kernels vs ATen and the copy bandwidth
#   classify_bench   60 s   11    VisionModel forward at batch 1/8/64, fp32 and bf16
#   generation_bench 150 s  35    decode at positions 100/4000; 1/64/256 streams, graphs and eager
#   ncu              90 s   8     Nsight Compute on the stats, causal and step kernels
#   sanitizers      200 s   81    compute-sanitizer memcheck, racecheck, synccheck, initcheck
#   p3              150 s   54    tools/bench/p3_classify.py --quick: tost_server vs in-process vs
#                                 a PyTorch-eager Python gRPC server, on the device
# about 5.1 minutes in all with the unpacking; the limits add up to more, and --budget_s keeps the
# whole inside one 8-minute command whatever hangs.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  echo "usage: scripts/gpu-session.sh OUT_DIR [--bundle FILE] [--python PY] [--budget_s S] [--steps a,b,...] [--dry-run]" >&2
  exit 2
}
(($#)) || usage
out=$1; shift
[[ $out != --* ]] || usage
bundle=$here/build-gpu/tost-gpu-bundle.tar.gz
python=python3
budget_s=450
dry_run=0
device=cuda
all_steps=(image gpu_tests serve serving_test kernel_bench classify_bench generation_bench ncu sanitizers p3)
steps=("${all_steps[@]}")
while (($#)); do
  case $1 in
    --bundle) bundle=$2; shift ;;
    --bundle=*) bundle=${1#*=} ;;
    --python) python=$2; shift ;;
    --python=*) python=${1#*=} ;;
    --budget_s) budget_s=$2; shift ;;
    --budget_s=*) budget_s=${1#*=} ;;
    --steps) IFS=, read -ra steps <<<"$2"; shift ;;
    --steps=*) IFS=, read -ra steps <<<"${1#*=}" ;;
    --dry-run) dry_run=1 ;;
    --device) device=$2; shift ;;
    --device=*) device=${1#*=} ;;
    *) echo "gpu-session: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
for s in "${steps[@]}"; do
  [[ " ${all_steps[*]} " == *" $s "* ]] || { echo "gpu-session: unknown step '$s' (steps: ${all_steps[*]})" >&2; exit 2; }
done
[[ $budget_s =~ ^[0-9]+$ ]] || { echo "gpu-session: --budget_s expects whole seconds, got '$budget_s'" >&2; exit 2; }

start_epoch=$(date +%s)
deadline=$((start_epoch + budget_s))
mkdir -p "$out/logs" "$out/figures"
out=$(cd "$out" && pwd)
: >"$out/steps.tsv"
log() { echo "[gpu-session +$(($(date +%s) - start_epoch))s] $*" | tee -a "$out/session.log"; }

# ---- unpack ------------------------------------------------------------------------------------
[[ -f $bundle ]] || { log "no bundle at $bundle: run scripts/gpu-bundle.sh here first, and carry it"; exit 1; }
scratch=${TOST_GPU_SCRATCH:-/tmp/tost-gpu-session}
rm -rf "$scratch"
mkdir -p "$scratch"
tar -C "$scratch" -xzf "$bundle" || { log "cannot unpack $bundle"; exit 1; }
export TOST_BUNDLE=$scratch/tost-gpu-bundle
export TOST_BIN=$TOST_BUNDLE/bin
command -v "$python" >/dev/null || { log "no $python: pass --python with the interpreter that has torch"; exit 1; }
export TOST_PY=$python
torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') ||
  { log "$python cannot import torch"; exit 1; }
export TOST_TORCH_SITE=$torch_site
# LibTorch and the CUDA runtime our binaries link directly; everything else LibTorch finds itself.
export LD_LIBRARY_PATH=$torch_site/torch/lib:$torch_site/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TOST_SOURCE_DIR=$here TOST_OUT=$out TOST_SCRATCH=$scratch TOST_DEVICE=$device
# Where CUDA images keep the profilers when they are not on PATH.
for d in /usr/local/cuda/bin /opt/nvidia/nsight-compute/*/; do
  [[ -d $d ]] && PATH=$PATH:${d%/}
done
export PATH
log "bundle $(sed -n 's/^commit: //p' "$TOST_BUNDLE/MANIFEST") unpacked in $scratch; torch from $torch_site; budget ${budget_s}s"

# ---- bookkeeping -------------------------------------------------------------------------------
merge_figures() {
  "$python" - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
doc = {"steps": {}, "figures": {}}
with open(os.path.join(out, "steps.tsv")) as f:
    for line in f:
        name, status, seconds, limit, note = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
        doc["steps"][name] = {"exit_status": int(status) if status.lstrip("-").isdigit() else status,
                              "seconds": float(seconds or 0), "limit_s": int(limit or 0), "note": note}
folder = os.path.join(out, "figures")
for name in sorted(os.listdir(folder)):
    if name.endswith(".json"):
        try:
            with open(os.path.join(folder, name)) as f:
                doc["figures"][name[:-5]] = json.load(f)
        except ValueError as e:
            doc["figures"][name[:-5]] = {"unreadable": str(e)}
tmp = os.path.join(out, "figures.json.tmp")
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1, sort_keys=True)
os.replace(tmp, os.path.join(out, "figures.json"))
EOF
}

# run_step NAME LIMIT_S: runs step_NAME (a function below) in its own process group, bounded by
# LIMIT_S and by what is left of the budget; its output goes to logs/NAME.log.
run_step() {
  local name=$1 limit=$2 left
  left=$((deadline - $(date +%s) - 5))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    log "$name: skipped, ${left}s of the budget left"
    printf '%s\tskipped\t0\t0\tout of budget\n' "$name" >>"$out/steps.tsv"
    merge_figures
    return
  fi
  log "$name: starting (limit ${limit}s)"
  local t0=$EPOCHREALTIME status
  timeout -k 5 "$limit" bash -c "step_$name" >"$out/logs/$name.log" 2>&1
  status=$?
  local seconds note=""
  seconds=$(awk "BEGIN {printf \"%.1f\", $EPOCHREALTIME - $t0}")
  ((status == 124 || status == 137)) && note="timed out after ${limit}s"
  printf '%s\t%s\t%.1f\t%s\t%s\n' "$name" "$status" "$seconds" "$limit" "$note" >>"$out/steps.tsv"
  log "$name: exit status $status in ${seconds}s${note:+ ($note)}; last lines:"
  tail -n 5 "$out/logs/$name.log" | sed 's/^/    /' | tee -a "$out/session.log"
  merge_figures
}

# ---- steps (each runs in its own bash, so it reads only exported names) ---------------------------
step_image() {
  set -x
  uname -a
  grep PRETTY_NAME /etc/os-release
  nproc
  free -g | head -2
  ldd --version | head -1
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  nvcc --version || true
  compute-sanitizer --version || true
  ncu --version || true
  "$TOST_PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda)'
  set +x
  check_libraries
}

# Every bundled ELF file must resolve each library it needs from the bundle, torch's folders or
# the libraries every image has (glibc, libstdc++, libgcc_s), never from elsewhere on the machine.
check_libraries() {
  local every_image='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|/lib64/ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libutil\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
  local bad=0 f soname path where
  : >"$TOST_OUT/logs/libraries.tsv"
  for f in "$TOST_BIN"/* "$TOST_BUNDLE"/lib/*; do
    local from_bundle=0 from_torch=0 from_image=0
    while read -r soname path; do
      if [[ $path == "not" || ( -z $path && ! $soname =~ $every_image ) ]]; then
        echo "UNRESOLVED ${f#"$TOST_BUNDLE"/}: $soname"; bad=1; continue
      fi
      path=$(readlink -f "${path:-$soname}" 2>/dev/null || echo "$path")
      if [[ $path == "$TOST_BUNDLE"/* ]]; then where=bundle; ((from_bundle++))
      elif [[ $path == "$TOST_TORCH_SITE"/* ]]; then where=torch; ((from_torch++))
      elif [[ $soname =~ $every_image ]]; then where=image; ((from_image++))
      else echo "FROM THE MACHINE ${f#"$TOST_BUNDLE"/}: $soname => $path (neither bundled nor torch's nor on every image)"; bad=1; where=machine
      fi
      printf '%s\t%s\t%s\t%s\n' "${f#"$TOST_BUNDLE"/}" "$soname" "$where" "$path" >>"$TOST_OUT/logs/libraries.tsv"
    done < <(ldd "$f" 2>&1 | awk '/=>/ {print $1, ($3 == "not" ? "not" : $3); next} /statically linked|not a dynamic/ {next} {print $1, ""}')
    echo "${f#"$TOST_BUNDLE"/}: $from_bundle from the bundle, $from_torch from torch, $from_image from the image"
  done
  "$TOST_PY" - "$TOST_OUT/logs/libraries.tsv" "$TOST_OUT/figures/image.json" "$bad" <<'EOF'
import collections, json, subprocess, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by_where = collections.Counter(r[2] for r in rows)
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001 - absent tools are part of the description
        return f"unavailable: {e}"
doc = {"libraries_resolved": sys.argv[3] == "0", "resolutions_by_origin": dict(by_where),
       "gpu": run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
       "nvcc": run(["nvcc", "--version"]).splitlines()[-1:],
       "kernel": run(["uname", "-r"])}
try:
    import torch
    doc["torch"] = torch.__version__
    doc["torch_cuda"] = torch.version.cuda
except Exception as e:  # noqa: BLE001
    doc["torch"] = f"unavailable: {e}"
json.dump(doc, open(sys.argv[2], "w"), indent=1)
EOF
  return $bad
}

step_gpu_tests() {
  "$TOST_BIN/tost_gpu_tests" --gtest_output="json:$TOST_OUT/logs/gpu_tests.json"
  local status=$?
  "$TOST_PY" - "$TOST_OUT/logs/gpu_tests.json" "$TOST_OUT/figures/gpu_tests.json" "$status" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    failed = [f"{s['name']}.{t['name']}" for s in r["testsuites"] for t in s["testsuite"] if t.get("failures")]
    skipped = [f"{s['name']}.{t['name']}" for s in r["testsuites"] for t in s["testsuite"] if t.get("result") == "SKIPPED"]
    doc = {"tests": r["tests"], "failed": failed, "skipped": skipped}
except Exception as e:  # noqa: BLE001 - no report: the binary did not get that far
    doc = {"report": f"missing: {e}"}
doc["exit_status"] = int(sys.argv[3])
json.dump(doc, open(sys.argv[2], "w"), indent=1)
EOF
  return $status
}

# start_server LOG ARGS...: tost_server on 127.0.0.1 with free ports; sets SERVER_PID, GRPC_PORT,
# METRICS_PORT once it prints its ports (60 s at most).
start_server() {
  local log=$1; shift
  "$TOST_BIN/tost_server" --model_repository="$TOST_SOURCE_DIR/models" --host=127.0.0.1 --port=0 \
    --metrics_port=0 --http_port=-1 "$@" >"$log.stdout" 2>"$log" &
  SERVER_PID=$!
  GRPC_PORT="" METRICS_PORT=""
  local i
  for i in $(seq 1 600); do
    GRPC_PORT=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$log.stdout" | head -1)
    METRICS_PORT=$(sed -n 's/.*metrics on [0-9.]*:\([0-9]*\).*/\1/p' "$log.stdout" | head -1)
    [[ -n $GRPC_PORT && -n $METRICS_PORT ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "tost_server exited before listening:"; tail -20 "$log"; return 1; }
    sleep 0.1
  done
  echo "tost_server did not print its ports in 60 s"; tail -20 "$log"; return 1
}

stop_server() {
  kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
}

step_serve() {
  local status=0 dtype
  for dtype in fp32 bf16; do
    local log=$TOST_OUT/logs/serve_$dtype.server.log t0=$EPOCHREALTIME
    echo "== tost_server --device=$TOST_DEVICE --dtype=$dtype"
    if ! start_server "$log" --device="$TOST_DEVICE" --dtype=$dtype; then status=1; continue; fi
    local cli=("$TOST_BIN/tost_cli") d=$TOST_SCRATCH/serve_$dtype
    mkdir -p "$d"
    awk "BEGIN {printf \"%.2f\", $EPOCHREALTIME - $t0}" >"$d/ready_after_s"
    "${cli[@]}" models --server=127.0.0.1:$GRPC_PORT >"$d/models" 2>&1 || status=1
    "${cli[@]}" classify --server=127.0.0.1:$GRPC_PORT --model=tost-digits --top_k=3 >"$d/classify" 2>&1 || status=1
    "${cli[@]}" generate --server=127.0.0.1:$GRPC_PORT --model=tost-austen \
      --prompt="It is a truth universally acknowledged" --max_new_tokens=64 >"$d/generate" 2>&1 || status=1
    "$TOST_PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/metrics', timeout=10).read().decode())" \
      2>&1 | grep -E '^tost_(decode_graphs_enabled|device_memory|state_pool|process_resident)' >"$d/metrics"
    cat "$d/models" "$d/classify" "$d/generate" "$d/metrics"
    stop_server
    grep -E 'WARN|ERROR|graphs' "$log" | head -20
    "$TOST_PY" - "$d" "$TOST_OUT/figures/serve_$dtype.json" <<'EOF2'
import json, os, sys
d = sys.argv[1]
read = lambda name: open(os.path.join(d, name), errors="replace").read()
json.dump({"ready_after_s": float(read("ready_after_s")),
           **{name: read(name).splitlines() for name in ("models", "classify", "generate", "metrics")}},
          open(sys.argv[2], "w"), indent=1)
EOF2
  done
  return $status
}

# The bundle's wheels (grpcio, grpcio-tools, protobuf at our pins) in a folder of their own, first
# on PYTHONPATH for the Python steps: the image's own packages stay as they are.
install_wheels() {
  local site=$TOST_SCRATCH/site
  [[ -f $site/.complete ]] && return 0
  "$TOST_PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$TOST_BUNDLE"/wheels/*.whl && touch "$site/.complete"
}

step_serving_test() {
  local site=$TOST_SCRATCH/site
  install_wheels || return 1
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} TOST_SERVER_BIN=$TOST_BIN/tost_server \
    TOST_CLI_BIN=$TOST_BIN/tost_cli TOST_PROTO_CACHE_DIR=$TOST_SCRATCH/protos PYTHONUNBUFFERED=1 \
    "$TOST_PY" -m pytest -v -rP -p no:cacheprovider -o addopts= \
    "$TOST_SOURCE_DIR/tests/integration/test_gpu_serving.py" --junitxml="$TOST_OUT/logs/serving_test.xml"
}

# P3: classification through tost_server against the same forward in-process and against the
# PyTorch-eager Python gRPC server a user would write, all on the device (tools/bench/p3_classify.py).
step_p3() {
  install_wheels || return 1
  PYTHONPATH=$TOST_SCRATCH/site${PYTHONPATH:+:$PYTHONPATH} TOST_PROTO_CACHE_DIR=$TOST_SCRATCH/protos \
    PYTHONUNBUFFERED=1 "$TOST_PY" "$TOST_SOURCE_DIR/tools/bench/p3_classify.py" --build-dir "$TOST_BIN" \
    --device "$TOST_DEVICE" --quick --out "$TOST_OUT/figures/p3.json"
}

step_kernel_bench() {
  "$TOST_BIN/tssa_gpu_bench"
}

step_classify_bench() {
  local status=0 dtype
  for dtype in fp32 bf16; do
    "$TOST_BIN/tost_classify_forward_bench" --device="$TOST_DEVICE" --dtype=$dtype --batch_sizes=1,8,64 \
      --seconds=1 --model_dir="$TOST_SOURCE_DIR/models/tost-digits" >"$TOST_SCRATCH/classify_$dtype.json" || status=1
    cat "$TOST_SCRATCH/classify_$dtype.json"
    cp "$TOST_SCRATCH/classify_$dtype.json" "$TOST_OUT/figures/classify_$dtype.json" 2>/dev/null
  done
  return $status
}

step_generation_bench() {
  local status=0 streams mode
  for streams in 64 256; do
    for mode in graphs eager; do
      local extra=()
      [[ $mode == eager ]] && extra=(--eager)
      echo "== $streams streams, $mode"
      "$TOST_BIN/tost_generation_bench" --device="$TOST_DEVICE" --server_bin="$TOST_BIN/tost_server" \
        --sessions=$streams --json="$TOST_OUT/figures/generation_${streams}_$mode.json" "${extra[@]}" || status=1
    done
  done
  return $status
}

step_ncu() {
  ncu --clock-control none --kernel-name 'regex:ChunkSumSqKernel|TssaStatsKernel|TssaApplyKernel|CausalStatsKernel|StepKernel' \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    -f -o "$TOST_OUT/logs/stats_kernels" "$TOST_BIN/tssa_gpu_bench" --profile || return 1
  ncu -i "$TOST_OUT/logs/stats_kernels.ncu-rep" --page details >"$TOST_OUT/logs/stats_kernels.txt"
  head -150 "$TOST_OUT/logs/stats_kernels.txt"
}

step_sanitizers() {
  # One shape of each kind (ragged, D=384 in every dtype, the step, the misc and layout cases, the
  # token bitmask at a real vocabulary): every kernel runs, at sizes the tools get through in seconds.
  local filter='*B2_T7_D20_K4*:*D384_K8_bf16*:*D384_K8_f16*:TssaStepCuda.*:TssaCudaMisc.*:TssaCausalCudaMisc.*:DTypes/*:TssaCudaStreams.ANonDefault*:TokenBitmaskCuda.*:*R8_V50257*'
  local status=0 tool
  for tool in memcheck racecheck synccheck initcheck; do
    echo "== compute-sanitizer --tool $tool"
    # Int64Offsets moves more than 2^31 elements: racecheck, which tracks every shared-memory
    # access, takes minutes over it (memcheck covers its addressing).
    local f=$filter
    [[ $tool == racecheck ]] && f="$filter-TssaCudaMisc.Int64Offsets"
    timeout -k 5 60 compute-sanitizer --tool $tool --error-exitcode 99 \
      "$TOST_BIN/tost_gpu_tests" --gtest_filter="$f" >"$TOST_OUT/logs/sanitizer_$tool.log" 2>&1
    local s=$?
    tail -n 3 "$TOST_OUT/logs/sanitizer_$tool.log"
    echo "{\"exit_status\": $s}" >"$TOST_OUT/figures/sanitizer_$tool.json"
    ((s == 0)) || status=1
  done
  return $status
}
export -f check_libraries start_server stop_server install_wheels
for s in "${all_steps[@]}"; do export -f "step_$s"; done

# ---- run ---------------------------------------------------------------------------------------
if ((dry_run)); then
  run_step image 60
  status=$(awk -F'\t' '$1 == "image" {print $2}' "$out/steps.tsv")
  log "dry run: stopped before the first CUDA call (image: exit status $status)"
  exit "$status"
fi
for s in "${steps[@]}"; do
  case $s in
    image) run_step image 60 ;;
    gpu_tests) run_step gpu_tests 150 ;;
    serve) run_step serve 120 ;;
    serving_test) run_step serving_test 180 ;;
    kernel_bench) run_step kernel_bench 90 ;;
    classify_bench) run_step classify_bench 60 ;;
    generation_bench) run_step generation_bench 150 ;;
    ncu) run_step ncu 90 ;;
    sanitizers) run_step sanitizers 200 ;;
    p3) run_step p3 150 ;;
  esac
done
log "done in $(($(date +%s) - start_epoch))s: $(awk -F'\t' '{printf "%s=%s ", $1, $2}' "$out/steps.tsv")"
