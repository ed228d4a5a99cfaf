#!/usr/bin/env bash
# hierarchy.sh: node-aware data parallelism (parallel.hierarchical_dp, docs/communication.md) -- dp 8 as 2 simulated
# nodes of 4 ranks (run.ranks_per_node 4), flat against hierarchical: on real MPI (link model off), under the link
# model (defaults), and under it with parallel.overlap_grad_reduce (buckets of 1M elements). A GPT-2-shaped model small
# enough for 8 ranks on a few cores (2 layers, 256 hidden, 4 heads, seq 128, vocabulary MS_BENCH_VOCAB, default 4096;
# micro-batch 1, global batch 8), fp32 on the CPU. Prints per setting the median over the steps after the first two
# of: ms/step, and the exposed and total communication per step in ms (the shares metrics.jsonl gives, averaged over
# ranks, times the step); and the dp bytes over inter-node links per step (comm_matrix.json, all ranks together).
# The step time moves with whatever else the machine runs; the total communication under the model much less.
#   bench/hierarchy.sh [build-dir] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
vocab=${MS_BENCH_VOCAB:-4096}
bin=$build/mindspeed-train
[ -x "$bin" ] || { echo "bench: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

run() {  # $1: label, then --set arguments; prints one line of the table
  local label=$1
  shift
  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive mpirun --oversubscribe -np 8 "$bin" train \
    --config configs/gpt2-124m.yaml \
    --set model.num_layers=2 --set model.hidden_size=256 --set model.num_attention_heads=4 \
    --set model.ffn_hidden_size=1024 \
    --set data.source=synthetic --set data.synthetic.vocab_size="$vocab" --set data.synthetic.num_tokens=400000 \
    --set model.vocab_size="$vocab" --set model.seq_length=128 --set model.max_position_embeddings=1024 \
    --set training.micro_batch_size=1 --set training.global_batch_size=8 \
    --set training.train_iters=$((steps + 2)) --set lr_schedule.lr_warmup_iters=1 \
    --set logging.log_interval=1 --set eval.eval_interval=0 --set eval.sample_tokens=0 --set run.num_threads=1 \
    --set run.ranks_per_node=4 \
    --set run.output_dir="$out/$label" "$@" > "$out/$label.log" 2>&1 ||
    { echo "bench: mindspeed-train failed, see $out/$label.log" >&2; exit 1; }
  python3 - "$out/$label" "$label" "$steps" <<'PY'
import json, statistics, sys
d, label, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"iteration-time"' in l][2:]
med = lambda f: statistics.median(f(r) for r in rows)
m = json.load(open(d + "/comm_matrix.json"))
inter = sum(p["bytes"] for p in m["pairs"] if p["group"] == "dp" and p["link"] == "inter_node")
step = med(lambda r: r["iteration-time"])
print(f"{label:<34} {1e3 * step:9.1f} {1e3 * med(lambda r: r['iteration-time'] * r['exposed_comm']):11.1f} "
      f"{1e3 * med(lambda r: r['iteration-time'] * r['total_comm']):11.1f} {inter / (steps + 2) / 1e6:13.2f}")
PY
}

printf '%-34s %9s %11s %11s %13s\n' "dp 8 = 2 nodes x 4" "ms/step" "exposed ms" "total ms" "inter MB/step"
model=(--set link_model.enabled=true)
overlap=(--set parallel.overlap_grad_reduce=true --set parallel.bucket_size=1000000)
for h in off on; do run "model-off-hierarchical-$h" --set parallel.hierarchical_dp=$h; done
for h in off on; do run "model-on-hierarchical-$h" --set parallel.hierarchical_dp=$h "${model[@]}"; done
for h in off on; do run "model-on-overlap-hierarchical-$h" --set parallel.hierarchical_dp=$h "${model[@]}" "${overlap[@]}"; done
echo "logs and metrics in $out"
