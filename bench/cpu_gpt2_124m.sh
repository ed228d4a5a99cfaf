#!/usr/bin/env bash
# cpu_gpt2_124m.sh: GPT-2 124M (12 layers, 768 hidden, 12 heads, vocab 50257 -> 50304, fp32, micro-batch 4, seq 64)
# trained for a few steps by mindspeed-train and by the PyTorch peer (bench/torch_gpt2_bench.py), alternating, in
# one run, on the same threads, under up to three environments (MS_BENCH_ENVS, default "asis haswell best"):
#   asis:    the machine's environment as it is (OPENBLAS_CORETYPE as set or unset; glibc malloc for PyTorch).
#            OpenBLAS 0.3.21 does not recognise some newer Xeons and, unset, falls back to SSE3 "Prescott";
#   haswell: OPENBLAS_CORETYPE=Haswell (AVX2), the setting our CI machines are documented to have;
#   best:    OPENBLAS_CORETYPE=SkylakeX (AVX-512) when the CPU has it, and PyTorch with jemalloc
#            (LD_PRELOAD=libjemalloc.so.2, MALLOC_CONF=retain:true,...). Each command changes only itself.
# Prints ms/step, tokens/s, MFU against the sgemm peak measured in the same environment, and the ratio. Both systems
# report their parameter count, and the script stops when the two differ.
#   bench/cpu_gpt2_124m.sh [build-dir] [rounds]
# The PyTorch peer runs on MS_BENCH_PYTHON (default Debian's /usr/bin/python3 with python3-torch 1.13: foreach
# AdamW, masked-matmul attention). For PyTorch 2.x (scaled_dot_product_attention, fused AdamW on the CPU), point it
# at a bench-only virtualenv, never used by setup or CI:
#   python3 -m venv /opt/bench-venv && /opt/bench-venv/bin/pip install torch numpy   (PyPI; or the CPU-only wheel
#       from --index-url https://download.pytorch.org/whl/cpu where that host is reachable)
#   MS_BENCH_PYTHON=/opt/bench-venv/bin/python bench/cpu_gpt2_124m.sh build 2
# "best" preloads Debian's libjemalloc2 for PyTorch when it is installed (/usr/lib/*/libjemalloc.so.2).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
build=${1:-build}
rounds=${2:-2}
threads=${MS_BENCH_THREADS:-2}
steps=${MS_BENCH_STEPS:-6}
py=${MS_BENCH_PYTHON:-/usr/bin/python3}
bin=$build/mindspeed-train
[ -x "$bin" ] || { echo "bench: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
jemalloc=$(ls /usr/lib/*/libjemalloc.so.2 2>/dev/null | head -n1 || true)
out=$(mktemp -d)
tokens=$((4 * 64))

ms_run() {  # $1: env label; prints median ms/step, the measured peak and the parameter count
  local envcmd=("${@:2}")
  "${envcmd[@]}" env OMP_NUM_THREADS=$threads "$bin" train --config configs/gpt2-124m.yaml \
    --set data.source=synthetic --set data.synthetic.vocab_size=50257 --set data.synthetic.num_tokens=200000 \
    --set model.vocab_size=50257 --set model.seq_length=64 --set model.max_position_embeddings=1024 \
    --set training.micro_batch_size=4 --set training.global_batch_size=4 \
    --set training.train_iters=$((steps + 2)) --set lr_schedule.lr_warmup_iters=1 --set logging.log_interval=1 --set eval.eval_interval=0 \
    --set eval.sample_tokens=0 --set run.output_dir="$out/ms-$1" --set run.num_threads=$threads \
    > "$out/ms-$1.log" 2>&1
  local peak
  peak=$(grep -o 'peak: [0-9.]* GFLOP/s' "$out/ms-$1.log" | awk '{print $2}')
  [ -n "$peak" ] || { echo "bench: mindspeed-train failed, see $out/ms-$1.log" >&2; tail -5 "$out/ms-$1.log" >&2; exit 1; }
  echo "$(median_ms "$out/ms-$1.log") $peak $(parameters "$out/ms-$1.log")"
}

torch_run() {  # $1: env label; prints median ms/step and the parameter count
  local envcmd=("${@:2}")
  "${envcmd[@]}" "$py" bench/torch_gpt2_bench.py --threads $threads --steps ${MS_BENCH_TORCH_STEPS:-4} --warmup 1 > "$out/torch-$1.log" 2>&1
  torch_result "$out/torch-$1.log" "$py"
}

# FLOPs per step by Megatron's formula (the same one the trainer's MFU uses), 124M at seq 64, micro-batch 4.
flops=$("$py" -c "L,C,T,V,B=12,768,64,50304,4; print(72*B*T*L*C*C*(1+T/(6*C)+V/(12*L*C)))")

envs=${MS_BENCH_ENVS:-asis haswell best}
fast_core=Haswell
grep -q avx512f /proc/cpuinfo && fast_core=SkylakeX
declare -A ms_ms torch_ms peak
for r in $(seq 1 "$rounds"); do
  for e in $envs; do
    case $e in
      asis) ms_env=(env); torch_env=(env) ;;
      haswell) ms_env=(env OPENBLAS_CORETYPE=Haswell); torch_env=(env OPENBLAS_CORETYPE=Haswell) ;;
      best) ms_env=(env OPENBLAS_CORETYPE=$fast_core)
            torch_env=(env OPENBLAS_CORETYPE=$fast_core LD_PRELOAD=$jemalloc
                       MALLOC_CONF=retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1) ;;
      *) echo "bench: unknown environment '$e' (asis | haswell | best)" >&2; exit 2 ;;
    esac
    res=$(ms_run "$e-$r" "${ms_env[@]}")
    read -r m p mp <<< "$res"
    res=$(torch_run "$e-$r" "${torch_env[@]}")
    read -r t tp <<< "$res"
    same_model "$mp" "$tp"
    echo "round $r $e: mindspeed-train ${m} ms/step (peak ${p} GFLOP/s), pytorch ${t} ms/step"
    ms_ms[$e]="${ms_ms[$e]:-} $m"; torch_ms[$e]="${torch_ms[$e]:-} $t"; peak[$e]="${peak[$e]:-} $p"
  done
done

best() { tr ' ' '\n' | grep -v '^$' | sort -g | head -n1; }
printf '\n%-9s %-16s %10s %10s %8s\n' env system ms/step tokens/s MFU
for e in $envs; do
  m=$(echo "${ms_ms[$e]}" | best); t=$(echo "${torch_ms[$e]}" | best); p=$(echo "${peak[$e]}" | tr ' ' '\n' | sort -g | tail -n1)
  "$py" - "$e" "$m" "$t" "$p" "$flops" "$tokens" <<'PY'
import sys
e, m, t, p, flops, tokens = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
for name, ms in (("mindspeed", m), ("pytorch", t)):
    print(f"{e:<9} {name:<16} {ms:10.1f} {tokens / (ms / 1e3):10.1f} {100 * flops / (ms / 1e3) / (p * 1e9):7.1f}%")
print(f"{e:<9} speedup mindspeed/pytorch (tokens/s): {t / m:.2f}x | sgemm peak {p:.1f} GFLOP/s (probe in the same env)")
PY
done
echo "logs: $out"
