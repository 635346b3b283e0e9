#!/usr/bin/env bash
# Writes peers.json and peers.txt here: the run of ../2026-11-29-peers-avx512 with every engine held
# to AVX2 on the same AVX-512 hardware, as an AVX2-only CPU would run (its caches and clocks are
# still this CPU's): tost_server's kernels and LibTorch (ATEN_CPU_CAPABILITY), oneDNN
# (ONEDNN_MAX_CPU_ISA) and MKL (MKL_ENABLE_INSTRUCTIONS, both also used by CTranslate2) capped to
# AVX2, CTranslate2's own kernels too (CT2_FORCE_CPU_ISA), and llama-server built without AVX-512
# (setup.sh --avx2: GGML_NATIVE off, AVX2, FMA, F16C).
# TOST_SERVER: another tost_server binary (a copy out of build/, with LD_LIBRARY_PATH naming the
# folder of its libtost_kernels.so, so that a rebuild during the run cannot replace it).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/perf/2026-11-29-peers-avx2-forced
# shellcheck disable=SC2046
export $(xargs < "${TOST_DEPS_DIR:-/opt/tost-deps}/peers/peers.env")
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 CT2_FORCE_CPU_ISA=AVX2
"$PEERS_PYTHON" tools/bench/peers/run_peers.py --tost-server "${TOST_SERVER:-build/service/tost_server}" \
  --llama-server "$PEERS_LLAMA_SERVER_AVX2" --models bench-lm \
  --engines tost,tost-bf16,tost-fp16,tost-int8,llama-f32,llama-f16,llama-q8_0,llama-f32-fa,llama-f16-fa,llama-q8_0-fa,ct2-float32,ct2-int8 \
  --streams 1,64 --stream-prompts 16 --session-rss-engines tost,llama-f32 \
  --isa-class "AVX2 forced on AVX-512 hardware" --out "$out/peers.json" 2>&1 | tee "$out/peers.txt"
