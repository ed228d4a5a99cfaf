#!/usr/bin/env bash
# test_slurm.sh: the sbatch templates (scripts/slurm) on a real single-node Slurm that this test starts in a temp dir:
# munged with a key made here, slurmctld and slurmd on free ports (proctrack/linuxproc, task/none, no cgroups, no
# accounting, the schedulers every second), the node as `slurmd -C` sees this machine. Through `sbatch
# scripts/slurm/one-node.sbatch` with 2 ranks (srun --mpi=pmix) it checks:
#   a. the demo trains to the end: the job's exit code is 0 and the loss falls;
#   b. a config error: the job's exit code is the ranks' 2, and the job is not requeued;
#   c. `scancel --signal=TERM` mid-run, and d. the same with MS_LAUNCHER=mpirun and `scancel --batch --signal=USR1`:
#      the ranks save and exit 3, launch.sh requeues the job, and the requeued run resumes from that checkpoint and
#      trains to the end (exit code 0, one restart);
#   e. a plain `scancel`: the job ends, not requeued;
#   f. a rank killed mid-run: the job's code is the run's 18 (exit_status.json), not srun's 137; requeued once,
#      resumed, and not requeued again past MS_MAX_RESTARTS.
# Exits 77 (ctest: skipped) with a sentence when Slurm or munge is not installed or the daemons cannot run a job.
# Every daemon is started here, its pid written to $tmp/pids, and killed by that pid on any exit; the jobs are
# cancelled first, and any process left with this cluster's SLURM_CONF in its environment is killed by its pid.
#   tests/slurm/test_slurm.sh SOURCE_DIR TRAINER_BINARY       (KEEP_TMP=1 keeps the temp dir)
set -euo pipefail
src=$(cd "$1" && pwd)
bin=$(realpath "$2")

skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

for tool in munged munge slurmctld slurmd sbatch srun scontrol squeue scancel sinfo python3; do
  command -v "$tool" >/dev/null ||
    skip "'$tool' is not installed (Debian: apt-get install munge slurmctld slurmd slurm-client; scripts/setup.sh)"
done
[ -x "$bin" ] || fail "the trainer '$bin' does not exist"

tmp=$(mktemp -d /tmp/ms-slurm.XXXXXX)
chmod 755 "$tmp"
mkdir -p "$tmp/pids" "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log"
chmod 711 "$tmp/munge"
export SLURM_CONF=$tmp/slurm.conf # the clients' config; every daemon, step and rank carries it in its environment

stop_pid() {  # stop_pid PID: SIGTERM, up to 10 s, then SIGKILL
  local pid=$1
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
}
cleanup() {
  local code=$? f pid jobs
  set +e
  trap - EXIT INT TERM
  if [ -s "$tmp/pids/slurmctld" ]; then
    jobs=$(squeue -h -o %i 2>/dev/null)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null
      for _ in $(seq 60); do
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.5
      done
    fi
  fi
  for f in slurmd slurmctld munged; do
    [ -s "$tmp/pids/$f" ] && stop_pid "$(cat "$tmp/pids/$f")"
  done
  # Steps and ranks outlive a killed slurmd; ours are the processes whose environment names this cluster's config.
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    [ "$pid" = $$ ] && continue
    { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF" && kill -9 "$pid" 2>/dev/null
  done
  if [ "$code" -ne 0 ] && [ "$code" -ne 77 ]; then
    for f in "$tmp"/job-*.out "$tmp"/log/*.log; do
      [ -f "$f" ] && { echo "---- $f (last 40 lines)"; tail -n 40 "$f"; }
    done
  fi
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the cluster -----------------------------------------------------------------------------------------------
read -r ctld_port slurmd_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
node=$(slurmd -C | head -n 1 | sed 's/ UpTime=.*//')
node_name=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$node")
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")
user=$(id -un)
cat >"$SLURM_CONF" <<EOF
ClusterName=mstest
SlurmctldHost=$node_name(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/munge.sock,cred_expire=5
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=600
MailProg=/bin/true
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$node_name Default=YES MaxTime=INFINITE State=UP
EOF

head -c 1024 /dev/urandom >"$tmp/munge/munge.key"
chmod 400 "$tmp/munge/munge.key"
munged --foreground --force --socket="$tmp/munge/munge.sock" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" --log-file="$tmp/log/munged.log" \
  >"$tmp/log/munged.stderr" 2>&1 &
echo $! >"$tmp/pids/munged"
for _ in $(seq 50); do
  [ -S "$tmp/munge/munge.sock" ] && break
  sleep 0.1
done
munge -n -S "$tmp/munge/munge.sock" | unmunge -S "$tmp/munge/munge.sock" >/dev/null 2>&1 ||
  skip "munged did not start or does not answer (log: $(tail -n 3 "$tmp/log/munged.log" 2>/dev/null))"

slurmctld -D -f "$SLURM_CONF" >"$tmp/log/slurmctld.stderr" 2>&1 &
echo $! >"$tmp/pids/slurmctld"
slurmd -D -f "$SLURM_CONF" >"$tmp/log/slurmd.stderr" 2>&1 &
echo $! >"$tmp/pids/slurmd"
state=""
for _ in $(seq 100); do
  state=$(sinfo -h -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || skip "the Slurm daemons did not bring the node up (sinfo says '$state'); slurmd log: \
$(tail -n 3 "$tmp/log/slurmd.log" "$tmp/log/slurmd.stderr" 2>/dev/null | tr '\n' ' ')"
timeout 60 srun --mpi=pmix -n 1 true >"$tmp/log/probe.log" 2>&1 ||
  skip "this Slurm cannot run a PMIx job step here (srun --mpi=pmix -n 1 true: $(tail -n 2 "$tmp/log/probe.log"))"
echo "slurm: node $node_name ($cpus CPUs), slurmctld on port $ctld_port, slurmd on port $slurmd_port"

# --- jobs ------------------------------------------------------------------------------------------------------
cd "$tmp"
overcommit=()
[ "$cpus" -ge 2 ] || overcommit=(--overcommit) # 2 ranks on a 1-CPU machine
export MS_HOME=$src MS_BIN=$bin OMP_NUM_THREADS=1
job_field() { { scontrol show job -o "$1" || true; } | tr " " "\n" | sed -n "s/^$2=//p"; }
# wait_job JOB SECONDS: until the job has finished, failing after SECONDS.
wait_job() {
  local state
  for _ in $(seq $(($2 * 5))); do
    state=$(job_field "$1" JobState)
    case $state in
      PENDING | RUNNING | CONFIGURING | COMPLETING | REQUEUED | REQUEUE_FED | SUSPENDED | "") ;;
      *) return 0 ;;
    esac
    sleep 0.2
  done
  fail "job $1 did not finish within $2 s (state $(job_field "$1" JobState))"
}
# submit NAME [train options]: one-node.sbatch with 2 ranks of one CPU each on the demo config; prints the job id.
submit() {
  local name=$1
  shift
  MS_CKPT_DIR=$tmp/$name/ckpt sbatch --parsable --job-name="$name" --output="$tmp/job-$name.out" \
    --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 "${overcommit[@]}" \
    "$src/scripts/slurm/one-node.sbatch" "$src/configs/demo.yaml" --set "run.output_dir=$tmp/$name" \
    --set eval.sample_tokens=0 --set logging.log_interval=10 "$@"
}
expect_exit() {  # expect_exit JOB CODE RESTARTS
  local got restarts
  got=$(job_field "$1" ExitCode)
  restarts=$(job_field "$1" Restarts)
  [ "$got" = "$2:0" ] || fail "job $1 ended with exit code $got, expected $2:0"
  [ "$restarts" = "$3" ] || fail "job $1 was requeued $restarts times, expected $3"
}
losses() { sed -n 's/.*iteration *[0-9]*\/.*| lm loss: \([0-9.E+-]*\) .*/\1/p' "$1"; }

# a. the demo trains to the end
t0=$SECONDS
job=$(submit train --set training.train_iters=60 --set lr_schedule.lr_warmup_iters=5)
wait_job "$job" 120
expect_exit "$job" 0 0
grep -q "iteration *60/ *60 " "$tmp/job-train.out" || fail "job $job: its log does not reach iteration 60"
first=$(losses "$tmp/job-train.out" | head -n 1)
last=$(losses "$tmp/job-train.out" | tail -n 1)
python3 -c "import sys; sys.exit(0 if $last < $first - 1.0 else 1)" ||
  fail "job $job: the loss did not fall by 1.0 (iteration 10: $first, iteration 60: $last)"
echo "train: job $job exit 0, lm loss $first at iteration 10 -> $last at 60 ($((SECONDS - t0)) s)"

# b. a config error is the job's exit code, and is not requeued
t0=$SECONDS
job=$(submit bad --set training.train_iters=5)
wait_job "$job" 60
expect_exit "$job" 2 0
grep -q "config error" "$tmp/job-bad.out" || fail "job $job: no 'config error' in its log"
echo "bad: job $job exit 2, not requeued ($((SECONDS - t0)) s)"

# start_long NAME: submits a run of 400 iterations and waits for its iteration 10; prints the job id. A step of the
# demo model takes a few milliseconds: 400 leave the signal seconds to arrive (with 40, the run could end first).
start_long() {
  local out=$tmp/job-$1.out job
  job=$(submit "$1" --set training.train_iters=400 --set lr_schedule.lr_warmup_iters=5)
  for _ in $(seq 600); do
    grep -q "iteration *10/" "$out" 2>/dev/null && break
    sleep 0.2
  done
  grep -q "iteration *10/" "$out" || fail "job $job: did not reach iteration 10 within 120 s"
  echo "$job"
}

# requeue_case NAME SCANCEL_OPTIONS: a run of 400 iterations is signalled by `scancel SCANCEL_OPTIONS` after iteration
# 10; its ranks save and exit 3, launch.sh requeues the job (the cluster's cred_expire=5 holds it about 6 s, not
# Slurm's default 2 minutes), and the requeued run resumes from that checkpoint and trains to the end.
requeue_case() {
  local name=$1 out=$tmp/job-$1.out job stopped t0=$SECONDS
  shift
  job=$(start_long "$name")
  scancel "$@" "$job"
  wait_job "$job" 120
  expect_exit "$job" 0 1
  grep -q "exit code 3: requeue to resume" "$out" || fail "job $job: the ranks did not stop with exit code 3"
  grep -q "launch: the ranks exited 3: requeueing job $job" "$out" || fail "job $job: launch.sh did not requeue it"
  stopped=$(sed -n 's/.*checkpoint: resumed from .*iter_0*\([0-9]*\) .*/\1/p' "$out")
  [[ -n "$stopped" && "$stopped" -ge 10 && "$stopped" -lt 400 ]] ||
    fail "job $job: the requeued run did not resume from a checkpoint between iterations 10 and 399 ('$stopped')"
  grep -q "iteration *400/ *400 " "$out" || fail "job $job: the requeued run did not train to iteration 400"
  echo "$name: job $job stopped by scancel $* after iteration $stopped (exit 3), requeued, resumed to the end," \
    "exit 0 ($((SECONDS - t0)) s)"
}

# c. srun: Slurm signals every rank (as --signal=TERM@120 does before the time limit)
requeue_case requeue --signal=TERM
# d. mpirun inside the allocation: the batch shell gets the signal (as with --signal=B:USR1@120) and launch.sh
#    passes it to mpirun as SIGUSR1; MS_LAUNCH_ARGS reaches mpirun
MS_LAUNCHER=mpirun MS_LAUNCH_ARGS="--bind-to none" requeue_case requeue-mpirun --batch --signal=USR1
grep -q "^launch: mpirun .* --bind-to none " "$tmp/job-requeue-mpirun.out" || fail "MS_LAUNCH_ARGS did not reach mpirun"

# e. a plain scancel ends the job: the ranks stop as on any SIGTERM, but launch.sh does not requeue a cancelled job
t0=$SECONDS
job=$(start_long cancel)
scancel "$job"
wait_job "$job" 60
state=$(job_field "$job" JobState)
[ "$state" = CANCELLED ] || fail "job $job is $state after scancel, expected CANCELLED"
[ "$(job_field "$job" Restarts)" = 0 ] || fail "job $job was requeued after a plain scancel"
grep -q "launch: the ranks exited .*: not requeued" "$tmp/job-cancel.out" ||
  fail "job $job: no 'not requeued' line from launch.sh"
echo "cancel: job $job cancelled, exit code $(job_field "$job" ExitCode), not requeued ($((SECONDS - t0)) s)"

# f. rank 1 killed at step 10 (MS_INJECT crash): srun returns 137, rank 0 exits 18 naming the dead rank, and its
#    exit_status.json makes 18 the job's code: requeued once, resumed from the checkpoint of iteration 5, killed again
#    at step 10, and not requeued past MS_MAX_RESTARTS=1
t0=$SECONDS
out=$tmp/job-crash.out
job=$(MS_INJECT=crash@step=10,rank=1 MS_MAX_RESTARTS=1 submit crash --set training.train_iters=40 \
  --set lr_schedule.lr_warmup_iters=5 --set checkpoint.save_interval=5 --set reliability.collective_timeout_s=5)
wait_job "$job" 120
expect_exit "$job" 18 1
[ "$(grep -c "launch: srun exited 137; the run's .* says 18" "$out")" = 2 ] ||
  fail "job $job: launch.sh did not take 18 from exit_status.json over srun's 137 in both runs"
grep -q "launch: the ranks exited 18: requeueing job $job" "$out" || fail "job $job: launch.sh did not requeue it"
grep -q "checkpoint: resumed from .*iter_0000005 " "$out" || fail "job $job: the requeued run did not resume from 5"
grep -q "launch: the ranks exited 18, but the job has been requeued 1 times" "$out" ||
  fail "job $job: launch.sh did not stop at MS_MAX_RESTARTS"
echo "crash: job $job: srun 137, the run's 18, requeued, resumed from iteration 5, 18 again, not requeued" \
  "($((SECONDS - t0)) s)"
echo "PASSED"
