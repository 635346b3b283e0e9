#!/usr/bin/env bash
# Writes peers.json and peers.txt here: tost_server at every precision against llama-server (flash
# attention off and on) and CTranslate2 on the bench LM's GPT-2 twin, natively on an AVX-512
# BF16/VNNI CPU. Needs tools/bench/peers/setup.sh's peers, make_twins.py's twins, and build/.
# TOST_SERVER: another tost_server binary (a copy out of build/, with LD_LIBRARY_PATH naming the
# folder of its libtost_kernels.so, so that a rebuild during the run cannot replace it).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/perf/2026-11-29-peers-avx512
# shellcheck disable=SC2046
export $(xargs < "${TOST_DEPS_DIR:-/opt/tost-deps}/peers/peers.env")
"$PEERS_PYTHON" tools/bench/peers/run_peers.py --tost-server "${TOST_SERVER:-build/service/tost_server}" \
  --llama-server "$PEERS_LLAMA_SERVER" --models bench-lm \
  --engines tost,tost-bf16,tost-fp16,tost-int8,llama-f32,llama-f16,llama-q8_0,llama-f32-fa,llama-f16-fa,llama-q8_0-fa,ct2-float32,ct2-int8 \
  --streams 1,64 --stream-prompts 16 --session-rss-engines tost,llama-f32 \
  --isa-class "AVX-512 BF16/VNNI" --out "$out/peers.json" 2>&1 | tee "$out/peers.txt"
