#!/usr/bin/env bash
# gpu-check.sh: the one prepared script for a machine with an NVIDIA GPU (the Debian dependencies travel in
# .devdeps, see docs/gpu.md):
#   eval "$(bash .devdeps/unpack-deps.sh .devdeps /tmp/prefix)" && bash scripts/gpu-check.sh
# Steps, in priority order, each bounded by `timeout` and by one overall deadline (MS_GPU_CHECK_BUDGET seconds,
# default 400), none stopping the others when it fails:
#   1. configure + build with CUDA for the GPU present (CMAKE_CUDA_ARCHITECTURES=native, or 90a on compute capability
#      9.0 so the wgmma forward is built; MS_CUDA_ARCH overrides);
#   2. ctest -L gpu: every CUDA kernel on the device against the CPU backend (cuda_device_kernels), the trainer on
#      the GPU against the CPU on tests/parallel/tiny.yaml (test_gpu: GpuTrain.*, which print their measured errors):
#      fp32 and bf16 as one rank and as tp2 x pp2 x dp2 (8 ranks on the one GPU, MPI), fp16 as one rank, and fp16's
#      dynamic loss scaling from 2^32 (skipped iterations, no NaN, the loss falls); the one-rank runs train on NCCL
#      (run.comm: auto); and the NCCL communicator as one rank, every collective in fp32/bf16/fp16/int32
#      (nccl_one_rank: tests/gpu/test_nccl.cpp); the mma.sync attention kernels against the CPU up to T = 1024, bf16
#      and fp16, two runs bit-identical, and the wgmma forward where built (test_gpu_attention);
#   3. the kernel benchmark, fp32 and bf16 (bench/gpu/kernel_bench.cpp: bandwidth as % of a device copy, attention
#      TFLOP/s, mma.sync beside wgmma at T 1024 and 4096), and the GEMM benchmark (bench/gpu/gemm_bench.cpp: the 124M shapes in bf16, cuBLASLt vs cuBLAS);
#   4. the GPT-2 124M benchmark, mindspeed-train (run.backend: cuda) in bf16 mixed precision, fp32 and TF32 against
#      PyTorch bf16 autocast, fp32 and TF32 with torch.compile (bench/gpu/gpt2_bench.py; the bf16 pair first), at
#      micro-batch MS_GPU_BENCH_BATCH (default 16 sequences of 1024: micro-batch 4's GEMMs and kernels are too small
#      to keep an H200 busy, so its tokens/s says more about launch latency than about the kernels);
#   5. optional, when more than 100 s are left (CI runs them without a GPU): the CUDA kernels and the whole model on
#      the CPU emulation (test_ops Cuda*, test_model *Cuda*), built then.
# Writes ${OUT:-gpu-check-out}/gpu-check.txt (the summary: the table of steps, the GPU tests by precision with their
# measured errors, the benchmark tables) and every step's raw output next to it (logs, bench/gpt2_bench.{md,json},
# each benchmark run's log and metrics.jsonl); exit status 0 when every step passed.
# MS_GPU_CHECK_DRY=1: print each step's command instead of running it (checks the script's flow without a GPU).
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
  if [ "${MS_GPU_CHECK_DRY:-0}" = 1 ]; then
    echo "dry: timeout -k 10 $t $*" | tee "$logfile"
    rc=0
  else
    timeout -k 10 "$t" "$@" > "$logfile" 2>&1
    rc=$?
  fi
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
# sm_90a on a compute capability 9.0 GPU (H100, H200): the wgmma kernels need the architecture-specific target, which
# "native" (sm_90) does not give; every other GPU builds for itself.
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
arch=${MS_CUDA_ARCH:-$([ "$cc" = 9.0 ] && echo 90a || echo native)}
log "CUDA architectures: $arch (compute capability ${cc:-unknown})"

run_step configure 90 "$out/configure.log" \
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMS_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
# -k 0: a target that fails to build does not stop the others; each step below needs only its own binaries.
run_step build 240 "$out/build.log" ninja -C build-gpu -k 0 -j"$(nproc)" mindspeed-train test_gpu ms_has_gpu \
  test_cuda_device test_gpu_attention test_nccl gpu_kernel_bench gpu_gemm_bench ||
  grep -B2 -A12 'FAILED:' "$out/build.log" | head -40 | tee -a "$summary"
log "ptxas: $(grep -c 'spill stores' "$out/build.log" 2>/dev/null) kernel reports, \
$(grep 'spill stores' "$out/build.log" 2>/dev/null | grep -vc ' 0 bytes spill stores') with spills"
have() {
  [ "${MS_GPU_CHECK_DRY:-0}" = 1 ] && return 0
  for f in "$@"; do [ -x "build-gpu/$f" ] || { steps_table+=("| ($f) | NOT BUILT | 0 |"); status=1; return 1; }; done
}

# -V and MS_OP_TEST_VERBOSE=1: the GPU tests print their measured errors (per tensor: in ctest-gpu.log; the trainer
# comparisons also in the summary below), from which the next session sets measured tolerances.
have tests/test_nccl  # a row when it did not build; ctest then reports nccl_one_rank as not run
have tests/test_gpu_attention  # likewise: the mma.sync attention kernels on the device
have mindspeed-train tests/test_gpu tests/ms_has_gpu tests/test_cuda_device &&
  run_step "ctest -L gpu" 200 "$out/ctest-gpu.log" bash -c 'cd build-gpu && MS_OP_TEST_VERBOSE=1 exec ctest -L gpu -V --timeout 170'
have gpu_kernel_bench && run_step "kernel benchmark (fp32, bf16)" 60 "$out/kernel-bench.log" ./build-gpu/gpu_kernel_bench
have gpu_gemm_bench && run_step "GEMM benchmark (bf16, cuBLASLt vs cuBLAS)" 40 "$out/gemm-bench.log" \
  ./build-gpu/gpu_gemm_bench
have mindspeed-train &&
  run_step "GPT-2 124M benchmark (bf16, fp32, TF32)" 230 "$out/gpt2-bench.log" \
    python3 bench/gpu/gpt2_bench.py --binary build-gpu/mindspeed-train --out "$out/bench" \
    --batch "${MS_GPU_BENCH_BATCH:-16}" --budget $(( $(left) > 215 ? 200 : $(left) - 15 ))
# Optional (CI runs them without a GPU): built and run only when the budget has room left for them.
if (( $(left) > 100 )) || [ "${MS_GPU_CHECK_DRY:-0}" = 1 ]; then
  run_step "build the emulation tests" 80 "$out/build-emu.log" ninja -C build-gpu -k 0 -j"$(nproc)" test_ops test_model
  have tests/test_ops &&
    run_step "CUDA kernels on the CPU emulation" 60 "$out/test_ops.log" ./build-gpu/tests/test_ops --gtest_filter='Cuda*'
  have tests/test_model &&
    run_step "whole model on the emulated backend" 60 "$out/test_model.log" \
      ./build-gpu/tests/test_model --gtest_filter='*Cuda*'
else
  steps_table+=("| CUDA kernels and whole model on the CPU emulation | SKIPPED (optional; CI runs them): $(left) s left | 0 |")
fi
log ""
log "| step | result | seconds |"
log "|---|---|---|"
for row in "${steps_table[@]}"; do log "$row"; done
log ""
if [ -f "$out/ctest-gpu.log" ]; then
  log "== ctest -L gpu"
  grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)|\*\*\*[A-Z]|Error:|error:|Failure' "$out/ctest-gpu.log" |
    head -20 | tee -a "$summary"
  # One row per GPU test: its precision, CTest's verdict, and the errors it measured against the CPU.
  log ""
  log "| GPU test | precision | result | measured (worst over tensors / steps) |"
  log "|---|---|---|---|"
  grep -oE 'Test +#[0-9]+: [A-Za-z0-9_.]+ \.+ *\**[A-Za-z ]+' "$out/ctest-gpu.log" |
    sed -E 's/Test +#[0-9]+: ([A-Za-z0-9_.]+) \.+ *\**(.*)/\1|\2/' | while IFS='|' read -r name verdict; do
      case $name in
        *Bf16*) prec=bf16 ;; *Fp16*) prec=fp16 ;; GpuTrain.*) prec=fp32 ;; *) prec="fp32/bf16/fp16" ;;
      esac
      # the test's own lines: "<what> vs cpu <dtype>: worst gradient error ..." and the loss-scaling line
      measured=$(awk -v t="$name" '$0 ~ "Start +[0-9]+: "t"$" {on=1} on && /Test +#[0-9]+: / {on=0} on' \
        "$out/ctest-gpu.log" | grep -E 'vs cpu|loss scaling:' | sed -E 's/^[0-9]+: //; s/; losses .*//' |
        paste -sd'#' - | sed 's/#/ \/ /g')
      log "| $name | $prec | $(echo "$verdict" | sed 's/ *$//') | ${measured:--} |"
    done
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
  log "== kernel bandwidth (% of a device copy) and attention throughput, fp32 and bf16 (bench/gpu/kernel_bench.cpp)"
  tee -a "$summary" < "$out/kernel-bench.log"
fi
if [ -f "$out/gemm-bench.log" ]; then
  log "== GEMMs at the 124M shapes, bf16: cuBLASLt (bias / GELU epilogues) vs cuBLAS (bench/gpu/gemm_bench.cpp)"
  tee -a "$summary" < "$out/gemm-bench.log"
fi
for f in test_ops test_model; do
  [ -f "$out/$f.log" ] && grep -E '^\[  (PASSED|FAILED) ' "$out/$f.log" | sed "s/^/$f: /" | tee -a "$summary"
done
log "== result: $([ $status = 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - t_start )) s"
exit $status
