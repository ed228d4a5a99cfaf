#!/usr/bin/env bash
# cpu_llama.sh: a Llama of GPT-2 small's width (model.arch llama: 12 layers, 768 hidden, 12 query heads sharing 4
# key/value heads, SwiGLU of 2048, RoPE, RMSNorm, untied output layer, vocab 50257 -> 50304) beside GPT-2 124M
# (configs/gpt2-124m.yaml), both fp32, micro-batch 4, seq 64, trained for a few steps by mindspeed-train,
# alternating, in one run, on the same threads and OpenBLAS kernel. Prints each model's parameter count, FLOPs per
# token (Megatron's formula of its architecture), ms/step, tokens/s and model GFLOP/s, and the ratio of tokens/s,
# Llama over GPT-2. ms/step is the median of a run's steps after 2 warm-up ones, the best of the rounds; the fastest
# single step is printed beside it, since on a shared machine a run's steps can be several times slower while
# another process holds a core. logging.peak_flops is set, so no sgemm probe runs (MFU is not what this compares).
#   bench/cpu_llama.sh [build-dir] [rounds]
# MS_BENCH_STEPS timed steps after 2 warm-up ones (default 4), MS_BENCH_THREADS threads (default 2). OpenBLAS runs
# its SkylakeX kernel where the CPU has AVX-512, else Haswell (OpenBLAS 0.3.21 falls back to SSE3 on some newer
# Xeons when unset; see bench/cpu_gpt2_124m.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
build=${1:-build}
rounds=${2:-2}
threads=${MS_BENCH_THREADS:-2}
steps=${MS_BENCH_STEPS:-4}
bin=$build/mindspeed-train
[ -x "$bin" ] || { echo "bench: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
core=Haswell
grep -q avx512f /proc/cpuinfo && core=SkylakeX
out=$(mktemp -d)
tokens=$((4 * 64))
llama=(--set model.arch=llama --set model.untie_embeddings_and_output_weights=true --set model.num_query_groups=4
       --set model.ffn_hidden_size=2048)

run() {  # $1: log name, then --set overrides; prints the median and the fastest ms/step and the parameter count
  local log=$out/$1.log
  OPENBLAS_CORETYPE=$core OMP_NUM_THREADS=$threads "$bin" train --config configs/gpt2-124m.yaml \
    --set data.source=synthetic --set data.synthetic.vocab_size=50257 --set data.synthetic.num_tokens=200000 \
    --set model.vocab_size=50257 --set model.seq_length=64 \
    --set training.micro_batch_size=4 --set training.global_batch_size=4 \
    --set training.train_iters=$((steps + 2)) --set lr_schedule.lr_warmup_iters=1 --set logging.log_interval=1 \
    --set logging.peak_flops=1e12 --set eval.eval_interval=0 --set eval.sample_tokens=0 \
    --set run.output_dir="$out/$1" --set run.num_threads=$threads \
    "${@:2}" > "$log" 2>&1 || { echo "bench: mindspeed-train failed, see $log" >&2; tail -5 "$log" >&2; exit 1; }
  local fastest
  fastest=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$log" | awk '{print $NF}' | tail -n +3 | sort -g |
    head -n1)
  echo "$(median_ms "$log") $fastest $(parameters "$log")"
}

declare -A med fast params
for r in $(seq 1 "$rounds"); do
  for m in gpt2 llama; do
    if [ $m = llama ]; then res=$(run "$m-$r" "${llama[@]}"); else res=$(run "$m-$r"); fi
    read -r t f p <<< "$res"
    echo "round $r $m: median ${t} ms/step, fastest ${f}"
    med[$m]="${med[$m]:-} $t"; fast[$m]="${fast[$m]:-} $f"; params[$m]=$p
  done
done

# Megatron's FLOPs per token (forward + backward), as the trainer's MFU counts them: GPT-2 with 4C MLP; Llama with
# 4 of 12 key/value heads and SwiGLU's three C x 2048 GEMMs; both with the 50304-row output layer.
flops() {
  awk -v a="$1" 'BEGIN {L = 12; C = 768; T = 64; Vp = 50304
    layer = a == "llama" ? 2 * (C * C * (1 + 2 * 4 / 12) + C * C + 3 * C * 2048) : 2 * (4 * C * C + 2 * C * 3072)
    printf "%.0f", 3 * (L * (layer + 4 * T * C) + 2 * C * Vp)}'
}
best() { tr ' ' '\n' | grep -v '^$' | sort -g | head -n1; }
printf '\nOPENBLAS_CORETYPE=%s, %s threads, %s round(s), %s tokens per step; ms/step: the best round'"'"'s median\n' \
  "$core" "$threads" "$rounds" "$tokens"
printf '%-6s %12s %14s %9s %9s %15s %16s\n' model parameters FLOPs/token ms/step tokens/s GFLOP/s "fastest step ms"
for m in gpt2 llama; do
  t=$(echo "${med[$m]}" | best); f=$(echo "${fast[$m]}" | best)
  awk -v n=$m -v p="${params[$m]}" -v fl="$(flops $m)" -v t="$t" -v f="$f" -v k=$tokens \
    'BEGIN {printf "%-6s %12s %14s %9.1f %9.1f %15.1f %16.1f\n", n, p, fl, t, k / (t / 1e3), k * fl / (t / 1e3) / 1e9, f}'
done
awk -v g="$(echo "${med[gpt2]}" | best)" -v l="$(echo "${med[llama]}" | best)" -v gf="$(echo "${fast[gpt2]}" | best)" \
  -v lf="$(echo "${fast[llama]}" | best)" \
  'BEGIN {printf "llama / gpt2 tokens/s: %.2fx (fastest steps: %.2fx)\n", g / l, gf / lf}'
echo "logs: $out"
