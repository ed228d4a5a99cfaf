#!/usr/bin/env bash
# sim_vs_measured.sh: the step simulator (plan --simulate) and the layout search (plan --search) against measured
# step times on this machine (docs/planner.md "Simulated against measured"). A small GPT (4 layers, hidden 256, 4
# heads of 64, sequence 128, vocabulary 64, fp32, micro-batch 2, 16 sequences a step; every rank 1 thread) is
# trained by `mpirun -np N mindspeed-train train` in each layout; its step time is the median over the iterations
# after the first two (bench/common.sh median_ms). Three parts:
#   1. a profile: `mpirun -np 2 mindspeed-train calibrate --threads 1` with the model's config and --world-size 1, 2,
#      4 and 8 (the op families' curves, every op shape of the model those world sizes' layouts hold, and the
#      intra-node link between two ranks), unless one is given;
#   2. 15 layouts of 1 to 8 ranks (tp, pp, dp, ZeRO-1, interleaved, sequence parallelism; two with the link model
#      on): measured against simulated with the profile's links (measured MPI; the link model's for the two runs
#      that use it) and with free links; the error is simulated with links / measured - 1. Prints the median and the
#      worst |error|;
#   3. `plan --search --world-size 4` and 2: the search's top three layouts and three it ranks lower (at a quarter,
#      half and the end of its ranking) are measured; the noise is the median spread between a layout's rounds. The
#      first choice passes when it is within the noise of the fastest measured.
# Noise: every layout runs in `rounds` rounds (default 3), every other round in reverse order so that drift in the
# machine's load falls on both ends, and its time is the least of its rounds' medians.
# Layouts of more ranks than cores run oversubscribed: the simulator's step 7 (simulator.h) models it from the
# profile's cores. Other work on the machine slows the measurements, not the simulation: run it on an idle machine.
# Takes about 8 minutes on 2 idle cores (12 on a host whose sgemm is slower).
#   bench/sim_vs_measured.sh [build-dir] [profile.json] [rounds]
# Environment: MS_BENCH_PARTS (default "layouts search": which of parts 2 and 3 run), MS_BENCH_SEARCH_WORLDS
# (default "4 2"), MS_BENCH_STEPS (default 6 measured steps a run).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
build=${1:-build}
profile=${2:-}
rounds=${3:-3}
parts=" ${MS_BENCH_PARTS:-layouts search} "
steps=${MS_BENCH_STEPS:-6}
bin=$build/mindspeed-train
py=/usr/bin/python3
[ -x "$bin" ] || { echo "bench: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi=(mpirun --oversubscribe)
model=(--config tests/parallel/tiny.yaml --set model.hidden_size=256 --set model.num_attention_heads=4
       --set model.num_layers=4 --set model.seq_length=128 --set model.max_position_embeddings=128
       --set training.micro_batch_size=2 --set training.global_batch_size=16 --set run.num_threads=1)
t_start=$(date +%s)

# ---- 1. the profile, and its variants: free links; the link model's (engine/config/config.h defaults)
if [ -z "$profile" ]; then
  profile=$out/cpu.json
  "${mpi[@]}" -np 2 "$bin" calibrate --threads 1 "${model[@]}" --world-size 1 --world-size 2 --world-size 4 \
    --world-size 8 --output "$profile" > "$out/calibrate.log" 2>&1 ||
    { echo "bench: calibrate failed, see $out/calibrate.log" >&2; exit 1; }
  grep -E '^calibrate: (intra|matmul|WARNING)' "$out/calibrate.log" || true
fi
"$py" - "$profile" "$out" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
free = json.loads(json.dumps(p))
for k in ("intra_node", "inter_node"):
    free["links"][k] = {"alpha_s": 0.0, "bytes_per_s": 1e30}
free["links"]["source"] = "free: no link costs anything"
json.dump(free, open(sys.argv[2] + "/free.json", "w"))
lm = json.loads(json.dumps(p))
lm["links"] = {"intra_node": {"alpha_s": 10e-6, "bytes_per_s": 1e9}, "inter_node": {"alpha_s": 100e-6, "bytes_per_s": 1.25e8},
               "source": "the link model's defaults (link_model.enabled runs)"}
json.dump(lm, open(sys.argv[2] + "/linkmodel.json", "w"))
EOF

# $1 label, $2 ranks, $3 the layout's --set overrides (one string); prints the median ms/step after the warm-up
measure() {
  local -a sets
  read -r -a sets <<< "$3"
  "${mpi[@]}" -np "$2" "$bin" train "${model[@]}" "${sets[@]}" --set training.train_iters=$((steps + 2)) \
    --set run.output_dir="$out/run-$1" > "$out/run-$1.log" 2>&1 ||
    { echo "bench: train $1 failed, see $out/run-$1.log" >&2; exit 1; }
  median_ms "$out/run-$1.log"
}
# $1 ranks, $2 overrides, $3 profile; prints the simulated step in ms
simulate() {
  local -a sets
  read -r -a sets <<< "$2"
  "$bin" plan "${model[@]}" "${sets[@]}" --world-size "$1" --simulate --profile "$3" 2>&1 |
    grep -o 'step [0-9.]* ms' | head -n1 | awk '{print $2}'
}

# ---- 2. simulated against measured (the function runs unless MS_BENCH_PARTS leaves it out)
compare_layouts() {
S=--set
layouts=(
  "1 rank|1|"
  "dp 2|2|"
  "dp 2 zero 1|2|$S parallel.zero_stage=1"
  "tp 2|2|$S parallel.tensor_model_parallel_size=2"
  "tp 2 sp|2|$S parallel.tensor_model_parallel_size=2 $S parallel.sequence_parallel=true"
  "pp 2|2|$S parallel.pipeline_model_parallel_size=2"
  "pp 2 vpp 2|2|$S parallel.pipeline_model_parallel_size=2 $S parallel.virtual_pipeline_model_parallel_size=2 $S parallel.pipeline_schedule=interleaved_1f1b"
  "dp 4 zero 1 overlap|4|$S parallel.zero_stage=1 $S parallel.overlap_grad_reduce=true $S parallel.overlap_param_gather=true"
  "pp 4|4|$S parallel.pipeline_model_parallel_size=4"
  "tp 2 pp 2|4|$S parallel.tensor_model_parallel_size=2 $S parallel.pipeline_model_parallel_size=2"
  "tp 2 sp dp 2|4|$S parallel.tensor_model_parallel_size=2 $S parallel.sequence_parallel=true"
  "dp 8|8|"
  "tp 2 pp 2 dp 2 zero 1|8|$S parallel.tensor_model_parallel_size=2 $S parallel.pipeline_model_parallel_size=2 $S parallel.zero_stage=1"
  "dp 2 link model|2|$S link_model.enabled=true"
  "tp 2 pp 2 link model|4|$S parallel.tensor_model_parallel_size=2 $S parallel.pipeline_model_parallel_size=2 $S link_model.enabled=true"
)
echo
echo "== simulated against measured (measured: the least over $rounds alternating rounds of the median ms/step over $steps steps after 2 of warm-up)"
rows=$out/rows.txt
: > "$rows"
for r in $(seq 1 "$rounds"); do
  idx=$(seq 0 $((${#layouts[@]} - 1)))
  [ $((r % 2)) -eq 0 ] && idx=$(seq $((${#layouts[@]} - 1)) -1 0)  # every other round in reverse
  for i in $idx; do
    IFS='|' read -r label np sets <<< "${layouts[i]}"
    echo "$i|$label|$np|$(measure "t$i-$r" "$np" "$sets")" >> "$rows"
  done
done
sims=$out/sims.txt
: > "$sims"
for i in $(seq 0 $((${#layouts[@]} - 1))); do
  IFS='|' read -r label np sets <<< "${layouts[i]}"
  links=$profile
  [[ $sets == *link_model.enabled=true* ]] && links=$out/linkmodel.json
  echo "$i|$(simulate "$np" "$sets" "$links")|$(simulate "$np" "$sets" "$out/free.json")" >> "$sims"
done
"$py" - "$rows" "$sims" <<'EOF'
import sys
measured = {}
for l in open(sys.argv[1]):
    i, label, np, m = l.rstrip("\n").split("|")
    measured.setdefault(int(i), (label, np, []))[2].append(float(m))
sims = {int(i): (float(s), float(f)) for i, s, f in (l.rstrip("\n").split("|") for l in open(sys.argv[2]))}
print(f"{'layout':<24} {'ranks':>5} {'measured ms':>12} {'sim links ms':>13} {'sim free ms':>12} {'error':>8}  rounds")
errs = []
for i in sorted(measured):
    label, np, ms = measured[i]
    m, (s, f) = min(ms), sims[i]
    e = s / m - 1
    errs.append((abs(e), label))
    print(f"{label:<24} {np:>5} {m:>12.1f} {s:>13.1f} {f:>12.1f} {100 * e:>+7.1f}%  " + " ".join(f"{x:.1f}" for x in ms))
a = sorted(x for x, _ in errs)
n = len(a)
med = a[n // 2] if n % 2 else (a[n // 2 - 1] + a[n // 2]) / 2
worst = max(errs)
print(f"median |error| {100 * med:.1f}% over {n} layouts; worst {100 * worst[0]:.1f}% ({worst[1]})")
EOF
}
[[ $parts == *" layouts "* ]] && compare_layouts

# ---- 3. the search's first choice against measurement
for world in ${MS_BENCH_SEARCH_WORLDS:-4 2}; do
  [[ $parts == *" search "* ]] || break
  echo
  echo "== plan --search --world-size $world: the search's ranking against measurement ($rounds alternating rounds, the least median of each layout)"
  "$bin" plan "${model[@]}" --search --world-size "$world" --profile "$profile" --top 1000 > "$out/search-$world.log" 2>&1 ||
    { echo "bench: plan --search failed, see $out/search-$world.log" >&2; exit 1; }
  # the chosen rows as "rank|label|simulated ms|--set overrides"
  "$py" - "$out/search-$world.log" > "$out/chosen-$world.txt" <<'EOF'
import re, sys
rows = []
for line in open(sys.argv[1]):
    m = re.match(r"\s+(\d+)\s+(tp \d+.*?zero \d+(?: overlap)?)\s+([0-9.]+)\s", line)
    if m:
        rows.append((int(m.group(1)), m.group(2), m.group(3)))
n = len(rows)
picks = sorted({1, 2, 3, max(1, n // 4), max(1, n // 2), n} & set(range(1, n + 1)))
for r in picks:
    _, label, sim = rows[r - 1]
    t = label.split()
    v = {t[i]: t[i + 1] for i in range(0, len(t) - 1) if t[i] in ("tp", "pp", "vpp", "cp", "mb", "rc", "zero")}
    o = "overlap" in t
    sets = [f"parallel.tensor_model_parallel_size={v['tp']}", f"parallel.sequence_parallel={'true' if 'sp' in t else 'false'}",
            f"parallel.pipeline_model_parallel_size={v['pp']}", f"parallel.virtual_pipeline_model_parallel_size={v['vpp']}",
            f"parallel.pipeline_schedule={'interleaved_1f1b' if int(v['vpp']) > 1 else '1f1b'}",
            f"parallel.context_parallel_size={v['cp']}", f"training.micro_batch_size={v['mb']}",
            f"training.recompute_granularity={v['rc']}", f"parallel.zero_stage={v['zero']}",
            f"parallel.overlap_grad_reduce={'true' if o else 'false'}",
            f"parallel.overlap_param_gather={'true' if o and v['zero'] == '1' else 'false'}"]
    print(f"{r}|{label}|{sim}|" + " ".join("--set " + s for s in sets))
EOF
  res=$out/search-res-$world.txt
  : > "$res"
  mapfile -t chosen < "$out/chosen-$world.txt"
  for r in $(seq 1 "$rounds"); do
    order=("${chosen[@]}")
    if [ $((r % 2)) -eq 0 ]; then  # every other round in reverse: drift in the machine's load falls on both ends
      order=()
      for ((j = ${#chosen[@]} - 1; j >= 0; j--)); do order+=("${chosen[j]}"); done
    fi
    for c in "${order[@]}"; do
      IFS='|' read -r rank label sim sets <<< "$c"
      echo "$rank|$label|$sim|$(measure "s$world-$rank-$r" "$world" "$sets")" >> "$res"
    done
  done
  "$py" - "$res" <<'EOF'
import sys
runs = {}
for l in open(sys.argv[1]):
    rank, label, sim, m = l.rstrip("\n").split("|")
    runs.setdefault((int(rank), label, float(sim)), []).append(float(m))
print(f"{'search rank':>11}  {'layout':<50} {'simulated ms':>12} {'measured ms':>12}  rounds")
for (rank, label, sim), ms in sorted(runs.items()):
    print(f"{rank:>11}  {label:<50} {sim:>12.1f} {min(ms):>12.1f}  " + " ".join(f"{x:.1f}" for x in ms))
spreads = sorted(max(ms) / min(ms) - 1 for ms in runs.values() if len(ms) > 1)
noise = spreads[len(spreads) // 2] if spreads else 0.0
best = min(runs.items(), key=lambda kv: min(kv[1]))
first = min(runs.items(), key=lambda kv: kv[0][0])
ratio = min(first[1]) / min(best[1]) - 1
ok = ratio <= noise
print(f"first choice ({first[0][1]}) {min(first[1]):.1f} ms; fastest measured ({best[0][1]}, search rank {best[0][0]}) "
      f"{min(best[1]):.1f} ms: the first choice is {100 * ratio:.1f}% slower, noise (median spread between rounds) "
      f"{100 * noise:.1f}%: {'PASS' if ok else 'FAIL'}")
EOF
done
echo
echo "total $(($(date +%s) - t_start)) s; logs and profile: $out"
