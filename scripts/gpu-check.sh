#!/usr/bin/env bash
# gpu-check.sh: the one prepared script for a machine with an NVIDIA GPU (see ../shared/device/README.md for
# carrying the Debian dependencies there):
#   eval "$(bash .devdeps/unpack-deps.sh .devdeps /tmp/prefix)" && bash scripts/gpu-check.sh
# Steps, in priority order, each bounded by `timeout` and by one overall deadline (MS_GPU_CHECK_BUDGET seconds,
# default 400), none stopping the others when it fails:
#   1. configure + build with CUDA for the GPU present (CMAKE_CUDA_ARCHITECTURES=native; MS_CUDA_ARCH overrides);
#   2. ctest -L gpu: every CUDA kernel on the device against the CPU backend (cuda_device_kernels), the trainer on
#      the GPU against the CPU on tests/parallel/tiny.yaml, one rank and tp2 x pp2 x dp2 as 8 ranks on the one GPU
#      (test_gpu: GpuTrain.*, which print their measured errors; the one-rank run trains on NCCL, run.comm: auto,
#      the 8-rank one on MPI), and the NCCL communicator as one rank, every collective in fp32/bf16/fp16/int32
#      (nccl_one_rank: tests/gpu/test_nccl.cpp);
#   3. the GPT-2 124M benchmark, mindspeed-train (run.backend: cuda, fp32 and TF32 GEMMs) against PyTorch fp32, bf16
#      and TF32 with torch.compile (bench/gpu/gpt2_bench.py);
#   4. the kernel benchmark (bench/gpu/kernel_bench.cpp);
#   5. the CUDA kernels and the whole model on the CPU emulation (test_ops Cuda*, test_model *Cuda*).
# Writes ${OUT:-gpu-check-out}/gpu-check.txt (the summary: one table of steps, the benchmark table, the GPU tests'
# measured errors) and every step's log next to it; exit status 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
summary=$out/gpu-check.txt
: > "$summary"
t_start=$(date +%s)
deadline=$((t_start + ${MS_GPU_CHECK_BUDGET:-400}))
log() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - $(date +%s))); }
steps_table=()  # "| step | result | seconds |"
status=0

# run_step NAME CAP LOGFILE CMD...: runs CMD under timeout min(CAP, time left - 5), output to LOGFILE; records it.
run_step() {
  local name=$1 cap=$2 logfile=$3
  shift 3
  local t=$(( $(left) - 5 ))
  (( t > cap )) && t=$cap
  if (( t < 10 )); then
    steps_table+=("| $name | SKIPPED: the time budget is spent | 0 |")
    status=1
    return 1
  fi
  local t0 rc result
  t0=$(date +%s)
  timeout -k 10 "$t" "$@" > "$logfile" 2>&1
  rc=$?
  case $rc in
    0) result=PASS ;;
    124|137) result="FAIL: timed out after $t s" ;;
    *) result="FAIL: exit $rc" ;;
  esac
  steps_table+=("| $name | $result | $(( $(date +%s) - t0 )) |")
  [ $rc = 0 ] || status=1
  return $rc
}

log "== gpu-check $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with local changes)') on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$summary"
arch=${MS_CUDA_ARCH:-native}

run_step configure 90 "$out/configure.log" \
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMS_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
# -k 0: a target that fails to build does not stop the others; each step below needs only its own binaries.
run_step build 240 "$out/build.log" ninja -C build-gpu -k 0 -j"$(nproc)" mindspeed-train test_gpu ms_has_gpu \
  test_cuda_device test_nccl gpu_kernel_bench test_ops test_model ||
  grep -B2 -A12 'FAILED:' "$out/build.log" | head -40 | tee -a "$summary"
log "ptxas: $(grep -c 'spill stores' "$out/build.log" 2>/dev/null) kernel reports, \
$(grep 'spill stores' "$out/build.log" 2>/dev/null | grep -vc ' 0 bytes spill stores') with spills"
have() { for f in "$@"; do [ -x "build-gpu/$f" ] || { steps_table+=("| ($f) | NOT BUILT | 0 |"); status=1; return 1; }; done; }

# -V: the GPU tests print their measured errors, which go to the summary below.
have tests/test_nccl  # a row when it did not build; ctest then reports nccl_one_rank as not run
have mindspeed-train tests/test_gpu tests/ms_has_gpu tests/test_cuda_device &&
  run_step "ctest -L gpu" 180 "$out/ctest-gpu.log" bash -c 'cd build-gpu && exec ctest -L gpu -V --timeout 170'
have mindspeed-train &&
  run_step "GPT-2 124M benchmark" 230 "$out/gpt2-bench.log" \
    python3 bench/gpu/gpt2_bench.py --binary build-gpu/mindspeed-train --out "$out/bench" \
    --budget $(( $(left) > 215 ? 200 : $(left) - 15 ))
have gpu_kernel_bench && run_step "kernel benchmark" 60 "$out/kernel-bench.log" ./build-gpu/gpu_kernel_bench
have tests/test_ops &&
  run_step "CUDA kernels on the CPU emulation" 60 "$out/test_ops.log" ./build-gpu/tests/test_ops --gtest_filter='Cuda*'
have tests/test_model &&
  run_step "whole model on the emulated backend" 60 "$out/test_model.log" \
    ./build-gpu/tests/test_model --gtest_filter='*Cuda*'

log ""
log "| step | result | seconds |"
log "|---|---|---|"
for row in "${steps_table[@]}"; do log "$row"; done
log ""
if [ -f "$out/ctest-gpu.log" ]; then
  log "== ctest -L gpu"
  grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)|Skipped|vs cpu: worst|Error|error' "$out/ctest-gpu.log" |
    head -30 | tee -a "$summary"
fi
if [ -f "$out/ctest-gpu.log" ]; then
  log "== NCCL communicator, one rank (nccl_one_rank)"
  grep -E 'nccl_one_rank|NcclOneRank.*(FAILED|SKIPPED)|NCCL error|comm: (NCCL|MPI)' "$out/ctest-gpu.log" |
    sed 's/^[0-9]*: //' | sort | uniq -c | head -20 | tee -a "$summary"
fi
if [ -f "$out/bench/gpt2_bench.md" ]; then
  log "== GPT-2 124M, one GPU (bench/gpu/gpt2_bench.py)"
  tee -a "$summary" < "$out/bench/gpt2_bench.md"
fi
if [ -f "$out/kernel-bench.log" ]; then
  log "== kernel bandwidth and attention throughput (bench/gpu/kernel_bench.cpp; baseline kernels, not tuned)"
  tee -a "$summary" < "$out/kernel-bench.log"
fi
for f in test_ops test_model; do
  [ -f "$out/$f.log" ] && grep -E '^\[  (PASSED|FAILED) ' "$out/$f.log" | sed "s/^/$f: /" | tee -a "$summary"
done
log "== result: $([ $status = 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - t_start )) s"
exit $status
