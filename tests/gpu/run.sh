#!/bin/bash
# tests/gpu/run.sh [LOGDIR] — the CUDA backend's proof, on a machine with an
# NVIDIA GPU, from an already-built tree (make; then tests/gpu/pack.sh to
# bundle the shared libraries and model files it needs).
#
#   1. versions and nvidia-smi
#   2. every CUDA op against the CPU op on random inputs (llamad-gpucheck ops;
#      kv_store and attention with K/V in f32, f16 and q8_0 too)
#   3. stories260K greedy golden on the CUDA backend (one-shot and through
#      the daemon + llamactl), f32 device weights; f16 weights reported
#   4. logits of a 2-layer model of 7B width, CUDA vs CPU (gpucheck logits);
#      a Llama 3-shaped model (llama3-tiny: BPE tokenizer, tied embeddings,
#      llama3 RoPE scaling as the inv_freq table the kernels take as data)
#      greedy on the GPU = numpy's (tests/golden/llama3.sh)
#   5. sessions survive a daemon restart on the GPU; --device cuda and auto
#      take the GPU (tests/integration/device.sh)
#   6. the layer candidates (base, fused, persistent, splitk:
#      kernels/cuda/plan.h) x f16 / Q8_0 / Q4_0 / Q4_K against the CPU, batch
#      1, 3, 5 and 8 rows (gpucheck cands; f16 / Q8_0 also over f16 and q8_0
#      K/V: "cands-kv:" lines, apart from the winners)
#   7. benchmarks, 7B shape (gpucheck bench): every candidate x dtype
# Full logs go to LOGDIR (default gpu-logs); one short table is printed last:
# decode tok/s and % of the copy-bandwidth roof per candidate x dtype, and
# the winners: per dtype the fastest candidate that passed step 6 at batch
# 1, written as an LLAMAD_CUDA_KERNELS spec to LOGDIR/winners.txt (the fixed
# table in kernels/cuda/candidates/plan.c takes it).
# Exit status: 0 when every check passed.
#
# Env: BUILD (default build), GPU_PACK (default gpu-pack: libs/, models/,
# reference/ made by tests/gpu/pack.sh), BENCH_QUICK=1 for shorter benches.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
PACK=${GPU_PACK:-gpu-pack}
LOG=${1:-gpu-logs}
mkdir -p "$LOG"
export MODELS=$PACK/models SHARED=$PACK

# cuBLAS: the toolkit's, else the one PyTorch's wheels carry
CUBLAS_DIR=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublas.so.13" ] && { CUBLAS_DIR=$d; break; }
done
if [ -z "$CUBLAS_DIR" ]; then
    CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
fi
export LD_LIBRARY_PATH=$PWD/$PACK/libs${CUBLAS_DIR:+:$CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

declare -a ROWS
row() { ROWS+=("$(printf '%-34s %s' "$1" "$2")"); }
fails=0
step() {  # name logfile command... ; records ok/FAIL
    local name=$1 log=$2; shift 2
    local t0=$SECONDS
    "$@" >"$LOG/$log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then row "$name" "ok ($((SECONDS - t0)) s)"
    else row "$name" "FAIL rc=$rc (see $log)"; fails=$((fails + 1)); fi
    return $rc
}

{
    echo "date: $(date -u +%FT%TZ)"; echo "git: $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-72)"
    uname -a; nvidia-smi; nvcc --version 2>/dev/null | tail -2
    echo "cuBLAS from: ${CUBLAS_DIR:-not found}"; ldd "$BUILD/llamad"
} >"$LOG/versions.txt" 2>&1
head -3 "$LOG/versions.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader

step "ops: CUDA vs CPU" ops.log "$BUILD/llamad-gpucheck" ops
grep -E "^(FAIL|ops:)" "$LOG/ops.log" | tail -5
LLAMAD_FLAGS="--device cuda --gpu-weights f32" BUILD=$BUILD \
    step "golden 260K one-shot (f32 dev)" golden.log sh tests/golden/stories260K.sh
LLAMAD_FLAGS="--device cuda --gpu-weights f32" BUILD=$BUILD \
    step "golden 260K via daemon (f32 dev)" golden_daemon.log sh tests/integration/llamactl_golden.sh
LLAMAD_FLAGS="--device cuda --gpu-weights f16" BUILD=$BUILD sh tests/golden/stories260K.sh \
    >"$LOG/golden_f16.log" 2>&1 && row "golden 260K one-shot (f16 dev)" "matches" \
    || row "golden 260K one-shot (f16 dev)" "differs (informational; see golden_f16.log)"
step "logits 2x4096 vs CPU" logits.log "$BUILD/llamad-gpucheck" logits
grep -E "^(ok|FAIL) +logits" "$LOG/logits.log"
LLAMAD_FLAGS="--device cuda --gpu-weights f32" BUILD=$BUILD PYTHON=python3 \
    step "llama3-tiny greedy = numpy (f32 dev)" llama3.log sh tests/golden/llama3.sh

step "layer candidates vs CPU" cands.log "$BUILD/llamad-gpucheck" cands
grep -E "^(cands:|FAIL)" "$LOG/cands.log" | tr '\n' ' ' | sed 's/cands: //g'; echo

restart_check() {
    local d; d=$(mktemp -d)
    local args=(--model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model"
                --socket "$d/s" --state-dir "$d/state" --device cuda --log-level info)
    "$BUILD/llamad" "${args[@]}" 2>"$d/log1" & local pid=$!
    for _ in $(seq 100); do [ -S "$d/s" ] && break; sleep 0.1; done
    "$BUILD/llamactl" --socket "$d/s" status | tee "$d/status"
    grep -qi cuda "$d/status" || { echo "status does not name the CUDA backend"; return 1; }
    echo "Tell me a story" | "$BUILD/llamactl" --socket "$d/s" chat --session s1 --max-tokens 16 --temperature 0 || return 1
    kill -TERM $pid; wait $pid || { echo "daemon exit $?"; cat "$d/log1"; return 1; }
    "$BUILD/llamad" "${args[@]}" 2>"$d/log2" & pid=$!
    for _ in $(seq 100); do [ -S "$d/s" ] && break; sleep 0.1; done
    echo "And then?" | "$BUILD/llamactl" --socket "$d/s" chat --session s1 --max-tokens 16 --temperature 0 || return 1
    "$BUILD/llamactl" --socket "$d/s" --json show s1 | tee "$d/show"
    kill -TERM $pid; wait $pid
    cat "$d/log1" "$d/log2"
    grep -q '"turns": *4' "$d/show"
}
step "sessions survive a restart (GPU)" restart.log restart_check
BUILD=$BUILD step "--device cuda/auto take the GPU" device.log sh tests/integration/device.sh

if [ "${BENCH_QUICK:-0}" = 1 ]; then
    step "bench 7B shape (quick)" bench.log "$BUILD/llamad-gpucheck" bench --quick
else
    step "bench 7B shape" bench.log "$BUILD/llamad-gpucheck" bench
fi

echo
echo "==== llamad GPU check: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F) ===="
printf '%s\n' "${ROWS[@]}"
grep -E "^(copy_bw|decode64|prefill2048|turn32|decode1_at)" "$LOG/bench.log" | sed 's/^/  /'
# the candidates' table and winners
awk -f tests/gpu/cands.awk WIN="$LOG/winners.txt" "$LOG/cands.log" "$LOG/bench.log"
echo "op/logit checks: $(cat "$LOG/ops.log" "$LOG/logits.log" "$LOG/cands.log" | grep -c '^ok') ok," \
     "$(cat "$LOG/ops.log" "$LOG/logits.log" "$LOG/cands.log" | grep -c '^FAIL') failed; steps failed: $fails"
exit $((fails > 0))
