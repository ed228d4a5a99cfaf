#!/usr/bin/env bash
# cpu_dp2.sh: data parallelism on the CPU, side by side in one run: a GPT-2-style model of 6 layers, 384 hidden, 6
# heads, MLP 1536 (4 x hidden), vocab 50257 (-> 50304), seq 256, fp32, micro-batch 8 per rank, 2 ranks x 1 thread, trained by
# mindspeed-train (mpirun -np 2, parallel dp 2, the gradients all-reduced over MPI) and by PyTorch's
# DistributedDataParallel over gloo (torchrun --nproc_per_node 2, bench/torch_gpt2_bench.py --ddp), alternating,
# rounds times. Prints each system's median ms/step and the ratio of the best. Both report their parameter count,
# and the script stops when the two differ (the same model on both sides, or no comparison).
#   MS_BENCH_PYTHON=/opt/bench-venv/bin/python bench/cpu_dp2.sh [build-dir] [rounds]
# MS_BENCH_PYTHON: a Python with PyTorch 2.x (a bench-only virtualenv: see cpu_gpt2_124m.sh; never setup or CI).
# PyTorch runs with sdpa attention and fused AdamW, each round with glibc's malloc and (when Debian's libjemalloc2 is
# installed) with jemalloc preloaded; its best is the peer (with 1 thread a rank, jemalloc is not always the faster).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
build=${1:-build}
rounds=${2:-2}
steps=${MS_BENCH_STEPS:-6}
py=${MS_BENCH_PYTHON:-/usr/bin/python3}
bin=$build/mindspeed-train
[ -x "$bin" ] || { echo "bench: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
jemalloc=$(ls /usr/lib/*/libjemalloc.so.2 2>/dev/null | head -n1 || true)
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

ms_run() {  # $1: label; prints the median ms/step of the steps after the first two, and the parameter count
  OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 "$bin" train --config configs/gpt2-124m.yaml \
    --set model.num_layers=6 --set model.hidden_size=384 --set model.num_attention_heads=6 \
    --set model.ffn_hidden_size=1536 \
    --set data.source=synthetic --set data.synthetic.vocab_size=50257 --set data.synthetic.num_tokens=400000 \
    --set model.vocab_size=50257 --set model.seq_length=256 --set model.max_position_embeddings=1024 \
    --set training.micro_batch_size=8 --set training.global_batch_size=16 \
    --set training.train_iters=$((steps + 2)) --set lr_schedule.lr_warmup_iters=1 --set logging.log_interval=1 \
    --set eval.eval_interval=0 --set eval.sample_tokens=0 --set run.output_dir="$out/ms-$1" --set run.num_threads=1 \
    > "$out/ms-$1.log" 2>&1 || { echo "bench: mindspeed-train failed, see $out/ms-$1.log" >&2; exit 1; }
  echo "$(median_ms "$out/ms-$1.log") $(parameters "$out/ms-$1.log")"
}

torch_run() {  # $1: label, $2: the allocator to preload ("" for glibc's); prints median ms/step and parameter count
  env ${2:+LD_PRELOAD=$2} OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --nproc_per_node 2 \
    bench/torch_gpt2_bench.py --ddp --threads 1 --layers 6 --hidden 384 --heads 6 --seq 256 --batch 8 \
    --steps "$steps" --warmup 1 > "$out/torch-$1.log" 2>&1 ||
    { echo "bench: PyTorch failed, see $out/torch-$1.log" >&2; exit 1; }
  torch_result "$out/torch-$1.log" "$py"
}

ms_all=() torch_all=()
for r in $(seq 1 "$rounds"); do
  res=$(ms_run "$r")
  read -r m mp <<< "$res"
  res=$(torch_run "$r" "")
  read -r t tp <<< "$res"
  same_model "$mp" "$tp"
  echo "round $r: mindspeed-train dp2 ${m} ms/step, pytorch DDP (gloo) ${t} ms/step"
  ms_all+=("$m") torch_all+=("$t")
  if [ -n "$jemalloc" ]; then
    res=$(torch_run "$r-jemalloc" "$jemalloc")
    read -r t tp <<< "$res"
    same_model "$mp" "$tp"
    echo "round $r: pytorch DDP (gloo) with jemalloc ${t} ms/step"
    torch_all+=("$t")
  fi
done
best() { printf '%s\n' "$@" | sort -g | head -n1; }
m=$(best "${ms_all[@]}") t=$(best "${torch_all[@]}")
echo "best: mindspeed-train ${m} ms/step, pytorch ${t} ms/step: mindspeed-train $(awk -v a="$t" -v b="$m" \
  'BEGIN {printf "%.2fx", a / b}') the speed of pytorch"
echo "logs: $out"
