#!/usr/bin/env bash
# link_model.sh: the baseline the communication engine (issue 15) is measured against -- a GPT-2-shaped model (GPT-2's
# vocabulary 50257 -> 50304, 4 layers, 256 hidden, 4 heads, seq 128, micro-batch 4, fp32) trained on the CPU with the
# link model off and on (docs/communication.md), for dp 2 (each rank its own simulated node, then both on one) and
# dp 2 x pp 2 (nodes of 2 ranks: dp inside a node, pp between nodes). Without parallel.overlap_grad_reduce every
# operation is waited at once, so the modelled time is all exposed; with it (buckets of 1M elements) the data-parallel
# all-reduces run behind the rest of the backward. Prints per layout and setting the median ms/step of the steps after the first two,
# the exposed communication's ms, and the exposed comm, total comm and pipeline bubble shares of the step (averaged
# over ranks, metrics.jsonl).
# MS_BENCH_ZERO1=1 runs instead dp 2 ZeRO-1 with a node per rank: no overlap, overlap_grad_reduce (each bucket's
# shard parts reduced into their owners), and overlap_grad_reduce + overlap_param_gather (the updated parameters
# gathered per bucket behind the next forward). MS_BENCH_ENGINE=1 runs the communication engine's table (dp 2, dp 4,
# dp 2 x pp 2; below). MS_BENCH_VOCAB sets the vocabulary (default GPT-2's 50257), MS_BENCH_MICRO the micro-batch
# (default 4 sequences; every layout keeps its number of micro-batches per step), MS_BENCH_BUCKET the buckets'
# elements (default 1000000), and MS_BENCH_GPT2=1 takes GPT-2 124M's layers (12 of 768, 12 heads) for the 4 of 256.
# In the engine's table MS_BENCH_LAYOUTS picks layouts (default "dp2 dp4 dp2xpp2") and MS_BENCH_REAL=0 leaves out
# the real-MPI rows.
#   bench/link_model.sh [build-dir] [steps]        (MS_BENCH_PP=0: dp 2 only)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
vocab=${MS_BENCH_VOCAB:-50257}
micro=${MS_BENCH_MICRO:-4}
bucket=${MS_BENCH_BUCKET:-1000000}
layers=(--set model.num_layers=4 --set model.hidden_size=256 --set model.num_attention_heads=4
  --set model.ffn_hidden_size=1024)
[ "${MS_BENCH_GPT2:-0}" = 1 ] && layers=(--set model.num_layers=12 --set model.hidden_size=768
  --set model.num_attention_heads=12 --set model.ffn_hidden_size=3072)
bin=$build/mindspeed-train
[ -x "$bin" ] || { echo "bench: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

run() {  # $1: label, $2: ranks, then --set arguments; prints one line of the table
  local label=$1 np=$2
  shift 2
  OMP_NUM_THREADS=1 mpirun --oversubscribe -np "$np" "$bin" train --config configs/gpt2-124m.yaml "${layers[@]}" \
    --set data.source=synthetic --set data.synthetic.vocab_size="$vocab" --set data.synthetic.num_tokens=400000 \
    --set model.vocab_size="$vocab" --set model.seq_length=128 --set model.max_position_embeddings=1024 \
    --set training.micro_batch_size="$micro" --set training.train_iters=$((steps + 2)) --set lr_schedule.lr_warmup_iters=1 \
    --set logging.log_interval=1 --set eval.eval_interval=0 --set eval.sample_tokens=0 --set run.num_threads=1 \
    --set run.output_dir="$out/$label" "$@" > "$out/$label.log" 2>&1 ||
    { echo "bench: mindspeed-train failed, see $out/$label.log" >&2; exit 1; }
  python3 - "$out/$label/metrics.jsonl" "$label" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"iteration-time"' in l][2:]
med = lambda k: statistics.median(r[k] for r in rows)
exposed_ms = statistics.median(1e3 * r['iteration-time'] * r['exposed_comm'] for r in rows)
print(f"{sys.argv[2]:<34} {1e3 * med('iteration-time'):9.1f} {exposed_ms:9.1f} {100 * med('exposed_comm'):8.1f}% "
      f"{100 * med('total_comm'):8.1f}% {100 * med('pipeline_bubble'):8.1f}%")
PY
}

printf '%-34s %9s %9s %9s %9s %9s\n' "layout / link model" "ms/step" "exposed ms" "exposed" "total" "bubble"
dp2=(--set training.global_batch_size=$((2 * micro)))                                      # 1 micro-batch
dp2pp2=(--set parallel.pipeline_model_parallel_size=2 --set training.global_batch_size=$((8 * micro)))  # 4 of them
if [ "${MS_BENCH_ZERO1:-0}" = 1 ]; then
  z1=(--set parallel.zero_stage=1 --set link_model.enabled=true --set run.ranks_per_node=1)
  grad=(--set parallel.overlap_grad_reduce=true --set parallel.bucket_size=$bucket)
  run dp2-zero1-inter-node 2 "${dp2[@]}" "${z1[@]}"
  run dp2-zero1-inter-node-grad 2 "${dp2[@]}" "${z1[@]}" "${grad[@]}"
  run dp2-zero1-inter-node-grad-param 2 "${dp2[@]}" "${z1[@]}" "${grad[@]}" --set parallel.overlap_param_gather=true
  echo "logs and metrics in $out"
  exit 0
fi
if [ "${MS_BENCH_ENGINE:-0}" = 1 ]; then
  # Every rank its own node, links with contention (one transfer at a time per link): no overlap (every operation
  # waited at once), overlap_grad_reduce alone, and with the communication engine (buckets issued from its progress
  # thread in 1 MiB pieces behind the critical pipeline traffic). Then dp 2 without the link model: real MPI on
  # this machine, engine off and on.
  lm=(--set link_model.enabled=true --set link_model.contention=true --set run.ranks_per_node=1)
  grad=(--set parallel.overlap_grad_reduce=true --set parallel.bucket_size=$bucket)
  engine=(--set parallel.comm_engine=true --set parallel.comm_chunk_bytes=1048576)
  dp4=(--set training.global_batch_size=$((4 * micro)))
  for layout in ${MS_BENCH_LAYOUTS:-dp2 dp4 dp2xpp2}; do
    case $layout in
      dp2) np=2 sets=("${dp2[@]}") ;;
      dp4) np=4 sets=("${dp4[@]}") ;;
      dp2xpp2) np=4 sets=("${dp2pp2[@]}") ;;
    esac
    run "$layout-no-overlap" "$np" "${sets[@]}" "${lm[@]}"
    run "$layout-overlap" "$np" "${sets[@]}" "${lm[@]}" "${grad[@]}"
    run "$layout-overlap-engine" "$np" "${sets[@]}" "${lm[@]}" "${grad[@]}" "${engine[@]}"
  done
  if [ "${MS_BENCH_REAL:-1}" = 1 ]; then
    run dp2-real-mpi 2 "${dp2[@]}"
    run dp2-real-mpi-engine 2 "${dp2[@]}" "${engine[@]}"
    run dp2-real-mpi-overlap-engine 2 "${dp2[@]}" "${grad[@]}" "${engine[@]}"
  fi
  echo "logs and metrics in $out"
  exit 0
fi
run dp2-off 2 "${dp2[@]}"
run dp2-on-intra-node 2 "${dp2[@]}" --set link_model.enabled=true --set run.ranks_per_node=2
run dp2-on-inter-node 2 "${dp2[@]}" --set link_model.enabled=true --set run.ranks_per_node=1
run dp2-on-inter-node-overlap 2 "${dp2[@]}" --set link_model.enabled=true --set run.ranks_per_node=1 \
  --set parallel.overlap_grad_reduce=true --set parallel.bucket_size=$bucket
if [ "${MS_BENCH_PP:-1}" = 1 ]; then
  run dp2xpp2-off 4 "${dp2pp2[@]}"
  run dp2xpp2-on-nodes-of-2 4 "${dp2pp2[@]}" --set link_model.enabled=true --set run.ranks_per_node=2
fi
echo "logs and metrics in $out"
