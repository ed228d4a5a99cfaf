#!/usr/bin/env bash
# fault_matrix.sh: what each injected fault does to each rank, per layout -- exit code per rank, time to exit,
# flight-recorder dumps, and the training lost -- measured by running the trainer (engine/train/reliability.h).
#
#   bench/fault_matrix.sh [BUILD_DIR]        (default build-par; prints a Markdown table)
#
# Each run: tests/parallel/tiny.yaml, 8 iterations, a checkpoint every 3 (checkpoint.save_interval), the fault at
# iteration 5 on the last rank, reliability.collective_timeout_s = 3. Per-rank codes come from
# exit_status/rank_XXXXX.json; "killed" is a rank that left none (SIGKILL by the fault or by mpirun's tear-down).
# "fault -> exit": from the fault_injected event of the faulty rank to the launcher's return (every rank gone);
# "run": the whole command, start-up included.
# "iterations lost": completed iterations (the last one in metrics.jsonl) not in the last committed checkpoint,
# i.e. the work a resume redoes. Hang on one rank is not run: nothing waits for a peer.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-par}/mindspeed-train
[ -x "$BIN" ] || { echo "no $BIN: build first (cmake --build ${1:-build-par})" >&2; exit 2; }
TIMEOUT_S=3
WORK=$(mktemp -d /tmp/ms_fault_matrix_XXXXXX)
trap 'rm -rf "$WORK"' EXIT

declare -A NP=([1rank]=1 [dp2]=2 [pp2]=2 [pp2dp2]=4)
declare -A SETS=([1rank]="" [dp2]="" [pp2]="--set parallel.pipeline_model_parallel_size=2"
                 [pp2dp2]="--set parallel.pipeline_model_parallel_size=2")

echo "| fault | layout | launcher status | exit code per rank | fault -> exit (s) | run (s) | flight recorders | last checkpoint | iterations lost |"
echo "|---|---|---|---|---|---|---|---|---|"
for fault in crash hang nan-fail nan-skip sigterm; do
  for layout in 1rank dp2 pp2 pp2dp2; do
    np=${NP[$layout]}
    [ "$fault" = hang ] && [ "$np" = 1 ] && continue
    last=$((np - 1))
    kind=${fault%%-*}
    policy=fail; [ "$fault" = nan-skip ] && policy=skip
    dir=$WORK/$fault-$layout
    launcher=""; [ "$np" -gt 1 ] && launcher="mpiexec -n $np --oversubscribe --allow-run-as-root"
    t0=$(date +%s.%N)
    set +e
    MS_INJECT="$kind@step=5,rank=$last" OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 120 $launcher "$BIN" train \
      --config tests/parallel/tiny.yaml --set training.train_iters=8 --set run.output_dir="$dir" \
      --set checkpoint.save="$dir/ckpt" --set checkpoint.save_interval=3 --set reliability.nan_policy=$policy \
      --set reliability.collective_timeout_s=$TIMEOUT_S ${SETS[$layout]} > "$dir.log" 2>&1
    rc=$?
    set -e
    t1=$(date +%s.%N)
    python3 - "$dir" "$np" "$rc" "$t0" "$t1" "$fault" "$layout" <<'EOF'
import datetime, json, os, sys
d, np, rc, t0, t1, fault, layout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5]), sys.argv[6], sys.argv[7]
faulty = np - 1
ev = f"{d}/events.jsonl" if faulty == 0 else f"{d}/events/rank_{faulty:05d}.jsonl"
fault_at = None
for line in (open(ev) if os.path.exists(ev) else []):
    e = json.loads(line)
    if e["event"] == "fault_injected":
        fault_at = datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
to_exit = f"{t1 - fault_at:.1f}" if fault_at else "?"
codes = []
for r in range(np):
    p = f"{d}/exit_status/rank_{r:05d}.json"
    codes.append(str(json.load(open(p))["code"]) if os.path.exists(p) else "killed")
traces = sorted(int(f[5:10]) for f in os.listdir(f"{d}/comm_traces")) if os.path.isdir(f"{d}/comm_traces") else []
tracker = f"{d}/ckpt/latest_checkpointed_iteration.txt"
last = int(open(tracker).read()) if os.path.exists(tracker) else 0
done = 0
if os.path.exists(f"{d}/metrics.jsonl"):
    done = max((json.loads(l)["iteration"] for l in open(f"{d}/metrics.jsonl") if l.strip()), default=0)
lost = f"{done - last} (trained to {done})"
if fault == "nan-skip":
    lost += ", step 5's update dropped on every rank"
status = f"{rc}" + (f" (128+{rc-128})" if rc > 128 else "")
print(f"| {fault} | {layout} | {status} | {' '.join(f'r{i}:{c}' for i, c in enumerate(codes))} | {to_exit} | {t1 - t0:.1f} | "
      f"{','.join(f'r{r}' for r in traces) or '-'} | {last or '-'} | {lost} |")
EOF
  done
done

# ---- signals in every phase (engine/train/reliability.h "Signals", README "Stopping a run") ----
# Each case starts a run, waits for the output line that says the phase has begun, sends the signal(s) (50 ms apart)
# to the process named in "sent to", and measures the seconds from the first signal to the launcher's return.
# Codes per rank from exit_status/rank_XXXXX.json ("-": none). The phases are made long through the config:
# 2000 thin layers (setup, load, save: seconds each), a validation of 2000 iterations, 4096 sampled tokens.
SIG_LONG_SETUP="--set model.num_layers=2000 --set model.hidden_size=32"
SIG_LONG_VALID="--set data.synthetic.num_tokens=2000000 --set data.split=50,50,0 --set eval.eval_interval=2 --set eval.eval_iters=2000"
SIG_KILL_AFTER_S=120
SIG_CKPT_MODEL="$SIG_LONG_SETUP --set model.vocab_size=256"   # generate's byte-level tokenizer needs 256
SIG_BIG_DATA="--set data.synthetic.num_tokens=2000000 --set data.split=50,50,0"
MPI2="mpiexec -n 2 --oversubscribe --allow-run-as-root"
SIG_BIN=$(realpath "$BIN")   # each case runs in its own directory

# signal_case NAME SIGNALS TARGET LINE COMMAND...; TARGET: launcher (the command's process), rank1 (its last child)
signal_case() {
  local name=$1 sigs=$2 target=$3 line=$4; shift 4
  local dir=$WORK/sig-$name
  mkdir -p "$dir"
  (cd "$dir" && OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive exec "$@" > "$dir/log" 2>&1) &
  local pid=$! t0 t1 rc to
  to=$pid
  until grep -qF -- "$line" "$dir/log" 2>/dev/null; do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
  [ "$target" = rank1 ] && to=$(pgrep -P $pid | sort -n | tail -1)
  t0=$(date +%s.%N)
  for s in ${sigs//,/ }; do kill -"$s" "$to" 2>/dev/null; sleep 0.05; done
  local deadline=$(($(date +%s) + SIG_KILL_AFTER_S))
  while kill -0 $pid 2>/dev/null && [ "$(date +%s)" -lt $deadline ]; do sleep 0.01; done
  t1=$(date +%s.%N)
  kill -KILL $pid 2>/dev/null || true
  set +e; wait $pid; rc=$?; set -e
  python3 - "$dir/run" "$name" "$sigs" "$target" "$rc" "$t0" "$t1" <<'PY'
import glob, json, os, sys
d, name, sigs, target, rc, t0, t1 = sys.argv[1:8]
codes = [str(json.load(open(p))["code"]) for p in sorted(glob.glob(f"{d}/exit_status/rank_*.json"))] or ["-"]
top = f"{d}/exit_status.json"
reason = json.load(open(top))["reason"] if os.path.exists(top) else "(no exit_status.json)"
rc = int(rc)
status = f"{rc}" + (f" (128+{rc - 128})" if rc > 128 else "")
print(f"| {name} | {sigs} | {target} | {status} | {float(t1) - float(t0):.2f} | {' '.join(codes)} | {reason[:110]} |")
PY
}

signal_matrix() {
  local train="$SIG_BIN train --config $PWD/tests/parallel/tiny.yaml --set run.output_dir=run"
  local ck=$WORK/sig-ckpt
  echo
  echo "| phase | signal | sent to | launcher status | signal -> exit (s) | exit_status codes | reason |"
  echo "|---|---|---|---|---|---|---|"
  signal_case setup TERM launcher "derived: global batch" $train $SIG_LONG_SETUP --set training.train_iters=4
  signal_case setup-dp2 USR1 launcher "derived: global batch" $MPI2 $train $SIG_LONG_SETUP --set training.train_iters=4
  signal_case setup-dp2-one-rank TERM rank1 "derived: global batch" $MPI2 $train $SIG_LONG_SETUP --set training.train_iters=4
  # a checkpoint of the 2000-layer model, then a signal while a run reads it
  OMP_NUM_THREADS=1 $SIG_BIN train --config tests/parallel/tiny.yaml --set run.output_dir=$WORK/sig-mk $SIG_CKPT_MODEL \
    --set training.train_iters=2 --set checkpoint.save=$ck > $WORK/sig-mk.log 2>&1
  signal_case load TERM launcher "memory per rank:" $train $SIG_CKPT_MODEL --set training.train_iters=4 --set checkpoint.load=$ck
  signal_case train SIGINT launcher "iteration        2/" $train --set training.train_iters=100000 --set checkpoint.save=ckpt
  signal_case validation TERM launcher "iteration        2/" $train $SIG_LONG_VALID --set training.train_iters=6 --set checkpoint.save=ckpt
  signal_case validation-dp2 USR1 launcher "iteration        2/" $MPI2 $train $SIG_LONG_VALID --set training.train_iters=6 --set checkpoint.save=ckpt
  signal_case save TERM launcher "iteration        2/" $train $SIG_LONG_SETUP --set training.train_iters=4 --set checkpoint.save=ckpt --set checkpoint.save_interval=2
  signal_case sample TERM launcher "checkpoint: saved iteration 3" $train --set training.train_iters=3 --set model.seq_length=256 --set eval.sample_tokens=4096 --set checkpoint.save=ckpt
  signal_case eval-command TERM launcher "eval: " $SIG_BIN eval --config $PWD/tests/parallel/tiny.yaml $SIG_CKPT_MODEL $SIG_BIG_DATA --load $ck --iters 100
  signal_case generate-command TERM launcher "generate: " $SIG_BIN generate --load $ck --prompt ab --tokens 100000
  signal_case double-signal TERM,TERM launcher "iteration        1/" $train --set model.num_layers=500 --set model.hidden_size=32 --set training.train_iters=100
  signal_case mpiexec-sigterm TERM launcher "iteration        2/" $MPI2 $train --set training.train_iters=100000 --set checkpoint.save=ckpt
  signal_case mpiexec-sigusr1 USR1 launcher "iteration        2/" $MPI2 $train --set training.train_iters=100000 --set checkpoint.save=ckpt
}

signal_matrix

# ---- named failures: every failure leaves exit_status.json naming the first failing rank (README "Exit codes") ----
# A rank SIGSTOPped (hung inside a collective) or killed with SIGKILL from outside once iteration 2 is logged, a
# crash at a later step, a data file missing on one rank, a config that differs between ranks. "-> exit": from the
# stop/kill (crash: its fault_injected event) to the launcher's return; input errors: the whole run. The status
# columns are exit_status.json's code and failed_rank (rank, state); "last event": events.jsonl's last line.
NAMED_BIN=$(realpath "$BIN")   # each case runs in its own directory
NAMED_TRAIN="$NAMED_BIN train --config $PWD/tests/parallel/tiny.yaml --set reliability.collective_timeout_s=$TIMEOUT_S"

# named_report NAME DIR RC T0 T1: one table row
named_report() {
  python3 - "$@" <<'PY'
import datetime, json, os, sys
name, d, rc, t0, t1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
if t0 == "fault":  # the crashed rank's fault_injected event
    t0 = None
    paths = [f"{d}/events.jsonl"]
    if os.path.isdir(f"{d}/events"):
        paths += [f"{d}/events/{f}" for f in sorted(os.listdir(f"{d}/events"))]
    for p in paths:
        for line in open(p) if os.path.exists(p) else []:
            e = json.loads(line)
            if e["event"] == "fault_injected":
                t0 = datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
to_exit = f"{t1 - float(t0):.1f}" if t0 else "?"
top = f"{d}/exit_status.json"
s = json.load(open(top)) if os.path.exists(top) else None
failed = s.get("failed_rank", {}) if s else {}
who = f"rank {failed.get('rank')} ({failed.get('host')}" + (f", {failed['state']}" if "state" in failed else "") + ")" if failed else "-"
last = "-"
if os.path.exists(f"{d}/events.jsonl"):
    lines = [l for l in open(f"{d}/events.jsonl") if l.strip()]
    if lines:
        e = json.loads(lines[-1])
        last = e["event"] + (f" {e['code']}" if "code" in e else "")
status = f"{rc}" + (f" (128+{rc - 128})" if rc > 128 else "")
print(f"| {name} | {status} | {to_exit} | {s['code'] if s else '(no exit_status.json)'} | {who} | {last} |")
PY
}

# named_kill NAME SIGNAL RANK NP: SIGNAL to world rank RANK of an NP-rank run once iteration 2 is logged
named_kill() {
  local name=$1 sig=$2 rank=$3 np=$4 dir=$WORK/named-$1 pid victim="" t0 t1 rc
  mkdir -p "$dir"
  (cd "$dir" && OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive exec timeout 120 mpiexec -n "$np" --oversubscribe \
    --allow-run-as-root $NAMED_TRAIN --set run.output_dir=run --set training.train_iters=100000 > log 2>&1) &
  pid=$!
  until grep -qF "iteration        2/" "$dir/log" 2>/dev/null; do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
  for c in $(pgrep -P "$(pgrep -P $pid)"); do  # timeout -> mpiexec -> the ranks
    tr '\0' '\n' < /proc/$c/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank" && victim=$c
  done
  t0=$(date +%s.%N)
  [ -n "$victim" ] && kill -"$sig" "$victim"
  set +e; wait $pid; rc=$?; set -e
  t1=$(date +%s.%N)
  named_report "$name" "$dir/run" $rc "$t0" "$t1"
}

# named_run NAME T0 NP COMMAND-ARGS...: a run to its end; T0 "fault" or "start"
named_run() {
  local name=$1 from=$2 np=$3 dir=$WORK/named-$1 t0 t1 rc; shift 3
  mkdir -p "$dir"
  t0=$(date +%s.%N)
  set +e
  (cd "$dir" && OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 120 mpiexec -n "$np" --oversubscribe \
    --allow-run-as-root $NAMED_TRAIN --set run.output_dir=run "$@" > log 2>&1)
  rc=$?
  set -e
  t1=$(date +%s.%N)
  [ "$from" = fault ] && t0=fault
  named_report "$name" "$dir/run" $rc "$t0" "$t1"
}

named_matrix() {
  echo
  echo "| named failure | launcher status | -> exit (s) | exit_status.json code | failed_rank | last event |"
  echo "|---|---|---|---|---|---|"
  named_kill sigstop-rank3-of-4 STOP 3 4
  named_kill kill9-rank0-of-4 KILL 0 4
  named_kill kill9-rank3-of-4 KILL 3 4
  MS_INJECT=crash@step=30,rank=1 named_run crash-step30-rank1-of-2 fault 2 --set training.train_iters=30
  mkdir -p "$WORK/named-data"
  OMP_NUM_THREADS=1 $NAMED_BIN preprocess --input README.md --output-prefix "$WORK/named-data/data_0" > /dev/null
  named_run data-missing-on-rank1-of-2 start 2 --set data.source=megatron --set model.vocab_size=257 \
    --set "data.data_path=$WORK/named-data/data_\${OMPI_COMM_WORLD_RANK}_text_document"
  named_run config-differs-on-rank1-of-2 start 2 --set 'run.name=r${OMPI_COMM_WORLD_RANK}' --set training.train_iters=2
}

named_matrix
