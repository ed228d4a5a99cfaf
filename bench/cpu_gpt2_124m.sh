#!/usr/bin/env bash
# cpu_gpt2_124m.sh: GPT-2 124M (12 layers, 768 hidden, 12 heads, vocab 50257 -> 50304, fp32; micro-batch 4, seq 64
# unless MS_BENCH_SHAPES lists others as "<micro-batch>x<seq> ...", e.g. "4x64 4x1024") trained for a few steps by
# mindspeed-train and by the PyTorch peer (bench/torch_gpt2_bench.py), alternating, in one run, on the same threads,
# under up to three environments (MS_BENCH_ENVS, default "asis haswell best"):
#   asis:    the machine's environment as it is (OPENBLAS_CORETYPE as set or unset; glibc malloc for PyTorch).
#            OpenBLAS 0.3.21 does not recognise some newer Xeons and, unset, falls back to SSE3 "Prescott";
#   haswell: OPENBLAS_CORETYPE=Haswell (AVX2), the setting our CI machines are documented to have;
#   best:    OPENBLAS_CORETYPE=SkylakeX (AVX-512) when the CPU has it, and PyTorch with jemalloc
#            (LD_PRELOAD=libjemalloc.so.2, MALLOC_CONF=retain:true,...). Each command changes only itself.
# Prints, per shape, the best ms/step of the rounds, tokens/s, MFU against the sgemm peak measured in the same
# environment (the best of every mindspeed-train run's start-up probe in it, over all shapes and rounds: the probe of
# one run moves with the host's load by several percent), by Megatron's formula and with attention counted causally,
# and the ratio. Both systems report their parameter count, and the script stops when the two differ.
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
shapes=${MS_BENCH_SHAPES:-4x64}

ms_run() {  # $1: run label, $2 micro-batch, $3 seq, then the env command; prints median ms/step, peak, parameters
  local batch=$2 seq=$3 envcmd=("${@:4}")
  "${envcmd[@]}" env OMP_NUM_THREADS=$threads "$bin" train --config configs/gpt2-124m.yaml \
    --set data.source=synthetic --set data.synthetic.vocab_size=50257 --set data.synthetic.num_tokens=200000 \
    --set model.vocab_size=50257 --set model.seq_length=$seq --set model.max_position_embeddings=1024 \
    --set training.micro_batch_size=$batch --set training.global_batch_size=$batch \
    --set training.train_iters=$((steps + 2)) --set lr_schedule.lr_warmup_iters=1 --set logging.log_interval=1 --set eval.eval_interval=0 \
    --set eval.sample_tokens=0 --set run.output_dir="$out/ms-$1" --set run.num_threads=$threads \
    > "$out/ms-$1.log" 2>&1
  local peak
  peak=$(grep -o 'peak: [0-9.]* GFLOP/s' "$out/ms-$1.log" | awk '{print $2}')
  [ -n "$peak" ] || { echo "bench: mindspeed-train failed, see $out/ms-$1.log" >&2; tail -5 "$out/ms-$1.log" >&2; exit 1; }
  echo "$(median_ms "$out/ms-$1.log") $peak $(parameters "$out/ms-$1.log")"
}

torch_run() {  # $1: run label, $2 micro-batch, $3 seq, then the env command; prints median ms/step and parameters
  local batch=$2 seq=$3 envcmd=("${@:4}")
  "${envcmd[@]}" "$py" bench/torch_gpt2_bench.py --threads $threads --batch $batch --seq $seq \
    --steps ${MS_BENCH_TORCH_STEPS:-4} --warmup 1 > "$out/torch-$1.log" 2>&1
  torch_result "$out/torch-$1.log" "$py"
}

# FLOPs per step at micro-batch $1, seq $2 by Megatron's formula (the one the trainer's MFU uses), which counts
# attention's T x T products in full; $3 = 2 counts the causal half a kernel needs (the MFU (causal) column).
flops() { "$py" -c "L,C,V,B,T,A=12,768,50304,$1,$2,$3; print(72*B*T*L*C*C*(1+T/(6*A*C)+V/(12*L*C)))"; }
for s in $shapes; do
  [[ $s =~ ^[0-9]+x[0-9]+$ ]] || { echo "bench: MS_BENCH_SHAPES entry '$s' is not <micro-batch>x<seq>" >&2; exit 2; }
done

envs=${MS_BENCH_ENVS:-asis haswell best}
fast_core=Haswell
grep -q avx512f /proc/cpuinfo && fast_core=SkylakeX
declare -A ms_ms torch_ms peak
for r in $(seq 1 "$rounds"); do
  for s in $shapes; do
    b=${s%x*}; t=${s#*x}
    for e in $envs; do
      case $e in
        asis) ms_env=(env); torch_env=(env) ;;
        haswell) ms_env=(env OPENBLAS_CORETYPE=Haswell); torch_env=(env OPENBLAS_CORETYPE=Haswell) ;;
        best) ms_env=(env OPENBLAS_CORETYPE=$fast_core)
              torch_env=(env OPENBLAS_CORETYPE=$fast_core LD_PRELOAD=$jemalloc
                         MALLOC_CONF=retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1) ;;
        *) echo "bench: unknown environment '$e' (asis | haswell | best)" >&2; exit 2 ;;
      esac
      res=$(ms_run "$e-$s-$r" "$b" "$t" "${ms_env[@]}")
      read -r m p mp <<< "$res"
      res=$(torch_run "$e-$s-$r" "$b" "$t" "${torch_env[@]}")
      read -r tm tp <<< "$res"
      same_model "$mp" "$tp"
      echo "round $r $e B$b T$t: mindspeed-train ${m} ms/step (peak ${p} GFLOP/s), pytorch ${tm} ms/step"
      ms_ms[$e/$s]="${ms_ms[$e/$s]:-} $m"; torch_ms[$e/$s]="${torch_ms[$e/$s]:-} $tm"; peak[$e]="${peak[$e]:-} $p"
    done
  done
done

best() { tr ' ' '\n' | grep -v '^$' | sort -g | head -n1; }
printf '\n%-9s %-7s %-16s %10s %10s %8s %13s\n' env shape system ms/step tokens/s MFU "MFU (causal)"
for e in $envs; do
  probes=$(echo "${peak[$e]}" | tr ' ' '\n' | grep -v '^$' | sort -g)
  p=$(echo "$probes" | tail -n1)
  for s in $shapes; do
    b=${s%x*}; t=${s#*x}
    m=$(echo "${ms_ms[$e/$s]}" | best); tm=$(echo "${torch_ms[$e/$s]}" | best)
    "$py" - "$e" "$s" "$m" "$tm" "$p" "$(flops "$b" "$t" 1)" "$(flops "$b" "$t" 2)" "$((b * t))" $probes <<'PY'
import statistics, sys
e, s = sys.argv[1], sys.argv[2]
m, t, p, flops, causal = (float(x) for x in sys.argv[3:8])
tokens, probes = int(sys.argv[8]), [float(x) for x in sys.argv[9:]]
for name, ms in (("mindspeed", m), ("pytorch", t)):
    mfu = [f"{100 * f / (ms / 1e3) / (p * 1e9):7.1f}%" for f in (flops, causal)]
    print(f"{e:<9} {s:<7} {name:<16} {ms:10.1f} {tokens / (ms / 1e3):10.1f} {mfu[0]:>8} {mfu[1]:>13}")
print(f"{e:<9} {s:<7} speedup mindspeed/pytorch (tokens/s): {t / m:.2f}x | sgemm peak {p:.1f} GFLOP/s: the best of "
      f"{len(probes)} probes in this env (median {statistics.median(probes):.1f}, lowest {probes[0]:.1f})")
PY
  done
done
echo "logs: $out"
