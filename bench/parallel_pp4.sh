#!/usr/bin/env bash
# parallel_pp4.sh: issue #3's parallel measurements on the CPU backend with MPI, from the trainer's own log.
#   1. pipeline bubble measured (time ranks wait in pipeline receives / step time, averaged over ranks) vs the
#      schedule's theory, pp = 4, m = 4, 8, 16, 32, for gpipe, 1f1b and interleaved_1f1b (v = 2);
#   2. ZeRO-1 optimizer bytes per rank vs 12 * params / dp (Adam's m, v and an fp32 master copy; on the CPU the
#      fp32 parameters are the master weights, so this build keeps 8 bytes per parameter);
#   3. bytes sent per step per group vs the analytic volume for TP, PP and DP.
# Each rank runs one thread. On a machine with fewer cores than ranks the ranks share cores, and a rank waiting
# in MPI still spins, so the measured bubble there also contains time-slicing: read it with that in mind.
#   bench/parallel_pp4.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/mindspeed-train
out=$(mktemp -d)
mpi=(mpiexec --oversubscribe --allow-run-as-root)
common=(--config tests/parallel/tiny.yaml --set model.hidden_size=256 --set model.num_layers=8
        --set model.seq_length=64 --set training.micro_batch_size=1 --set training.train_iters=6
        --set logging.log_interval=3 --set lr_schedule.lr_warmup_iters=1)

echo "== 1. pipeline bubble (measured over iterations 4-6; theory (p-1)/(v m + p-1), which the schedule's simulator"
echo "      reproduces exactly). pp = 4 is what the issue asks; pp = 2 is the fair check on a 2-core machine."
printf '%-4s %-18s %4s %10s %10s\n' pp schedule m measured theory
for pp in ${MS_BENCH_PP:-4 2}; do
  for sched in gpipe 1f1b interleaved_1f1b; do
    for m in 4 8 16 32; do
      v=1; [ $sched = interleaved_1f1b ] && v=2
      OMP_NUM_THREADS=1 timeout 300 "${mpi[@]}" -n $pp "$bin" train "${common[@]}" --set run.output_dir="$out/$pp-$sched-$m" \
        --set parallel.pipeline_model_parallel_size=$pp --set parallel.pipeline_schedule=$sched \
        --set parallel.virtual_pipeline_model_parallel_size=$v --set training.global_batch_size=$m > "$out/$pp-$sched-$m.log" 2>&1
      measured=$(tail -n1 "$out/$pp-$sched-$m/metrics.jsonl" | /usr/bin/python3 -c "import json,sys; print('%.1f%%' % (100 * json.load(sys.stdin)['pipeline_bubble']))")
      theory=$(/usr/bin/python3 -c "p,m,v=$pp,$m,$v; print(f'{100*(p-1)/(v*m+p-1):.1f}%')")
      printf '%-4d %-18s %4d %10s %10s\n' $pp $sched $m "$measured" "$theory"
    done
  done
done

echo
echo "== 2. optimizer state per rank, dp = 1, 2, 4 (zero_stage 1)"
for dp in 1 2 4; do
  OMP_NUM_THREADS=1 "${mpi[@]}" -n $dp "$bin" train "${common[@]}" --set run.output_dir="$out/zero-$dp" \
    --set parallel.zero_stage=1 --set training.global_batch_size=4 --set training.train_iters=1 > "$out/zero-$dp.log" 2>&1
  grep -o 'memory per rank:.*' "$out/zero-$dp.log" | head -n1 | sed "s/^/dp $dp: /"
done
grep -o 'parameters [0-9]* ([0-9.]* M)' "$out/zero-1.log" | head -n1 | sed 's/^/model: /'

echo
echo "== 3. bytes sent per step by rank 0, tp2 x pp2 x dp2 zero_stage 1 (8 ranks), vs analytic"
OMP_NUM_THREADS=1 "${mpi[@]}" -n 8 "$bin" train "${common[@]}" --set run.output_dir="$out/3d" \
  --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 \
  --set parallel.zero_stage=1 --set training.global_batch_size=8 > "$out/3d.log" 2>&1
tail -n1 "$out/3d/metrics.jsonl" | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)["bytes_per_step"]
# model: L=8 (4 per stage), C=256, T=64, micro-batch 1, global batch 8 = 4 micro-batches per dp rank; tp 2, pp 2, dp 2
L_stage, C, T, mb, m, tp = 4, 256, 64, 1, 4, 2
act = mb * T * C * 4
# TP, stage 0 (embedding + 4 layers): per micro-batch forward: embedding + 2 per layer all-reduces of (T, C);
# backward: 2 per layer (the column-parallel input gradients). Each all-reduce counts its buffer once.
tp_bytes = m * act * (1 + 2 * L_stage + 2 * L_stage)
pp_bytes = m * act + 4        # activations to stage 1, plus the loss all-reduce (one float)
print("tp: measured", j["tp"], " analytic", tp_bytes)
print("pp: measured", j["pp"], " analytic", pp_bytes)
# DP (zero 1, dp 2): reduce-scatter of the padded flat gradient (counted as its input, 4 * padded bytes) + all-gather
# of the shard (4 * padded / 2) + the loss and norm all-reduces (4 + 4); padded from the flat buffer of this rank.
print("dp: measured", j["dp"], " = 6 * padded + 8 with padded =", (j["dp"] - 8) / 6, "elements (the padded flat buffer of rank 0)")
'
echo "logs: $out"
