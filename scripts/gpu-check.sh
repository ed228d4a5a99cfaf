#!/usr/bin/env bash
# gpu-check.sh: the one prepared script for a machine with an NVIDIA GPU (see ../shared/device/README.md for
# carrying the Debian dependencies there). Builds with CUDA for the GPU present, runs every CUDA kernel through
# CudaBackend on the device against the CPU backend (test_cuda_device), runs the CPU-emulated CUDA tests too, and
# writes a summary to ${OUT:-gpu-check-out}/gpu-check.txt.
# Then the first kernel benchmark (bench/gpu/kernel_bench.cpp). Not yet here (issue #4): the whole model on the GPU,
# bf16, NCCL, the PyTorch side-by-side.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
summary=$out/gpu-check.txt
: > "$summary"
log() { echo "$*" | tee -a "$summary"; }
log "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$summary"
arch=${MS_CUDA_ARCH:-native}
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMS_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" > "$out/configure.log" 2>&1 || { log "configure FAILED (see configure.log)"; exit 1; }
ninja -C build-gpu -j"$(nproc)" test_cuda_device test_ops test_model gpu_kernel_bench > "$out/build.log" 2>&1 ||
  { log "build FAILED (see build.log)"; tail -20 "$out/build.log"; exit 1; }
log "== build: $(( $(date +%s) - t0 )) s; ptxas: $(grep -c 'spill stores' "$out/build.log") kernel reports, \
$(grep 'spill stores' "$out/build.log" | grep -vc ' 0 bytes spill stores') with spills"
status=0
log "== CUDA kernels on the device vs the CPU backend (test_cuda_device)"
CUDA_LAUNCH_BLOCKING=1 ./build-gpu/tests/test_cuda_device > "$out/test_cuda_device.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED) |tests ran' "$out/test_cuda_device.log" | tee -a "$summary"
log "== CUDA kernels on the CPU emulation and the whole model on the emulated backend"
./build-gpu/tests/test_ops --gtest_filter='Cuda*' > "$out/test_ops.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED) ' "$out/test_ops.log" | tee -a "$summary"
./build-gpu/tests/test_model --gtest_filter='*Cuda*' > "$out/test_model.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED) ' "$out/test_model.log" | tee -a "$summary"
log "== kernel bandwidth and attention throughput (bench/gpu/kernel_bench.cpp; baseline kernels, not tuned)"
./build-gpu/gpu_kernel_bench 2>&1 | tee -a "$summary" || status=1
log "== result: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
