#!/usr/bin/env bash
# launch.sh: run `mindspeed-train train` on every task of a Slurm allocation, from a batch script (one-node.sbatch,
# multi-node.sbatch), and requeue the job when the run stopped in a way a rerun continues. The run saves to and loads
# from one checkpoint directory, so the first run starts from scratch and a requeued one resumes from its newest
# checkpoint. The script exits with the ranks' exit code (README "Exit codes"; run.output_dir/exit_status.json when the
# run wrote it, else the launcher's):
#   3   stopped by SIGTERM/SIGUSR1/SIGINT (Slurm's --signal before the time limit, preemption, scancel --signal=TERM),
#       checkpoint saved: requeued
#   18  a collective timed out or a rank died (a bad node, a network fault): requeued, perhaps onto other nodes
#   anything else (0 done, 2 bad input, 17 NaN, 19 checkpoint write failure): returned, not requeued
# A job being cancelled (plain scancel) is not requeued, whatever the code.
#
#   scripts/slurm/launch.sh CONFIG [train options, e.g. --set training.train_iters=1000]
#
# Environment (all optional):
#   MS_HOME          the repository (default: the one holding this script)
#   MS_BIN           the trainer (default: $MS_HOME/build/mindspeed-train)
#   MS_CKPT_DIR      checkpoint.save and checkpoint.load (default: runs/$SLURM_JOB_NAME/ckpt, relative to the
#                    submit directory); keep it the same across submissions to continue a run in a new job
#   MS_LAUNCHER      srun (default): srun --mpi=pmix, one rank per task; Slurm signals every rank itself.
#                    mpirun: Open MPI's mpirun inside the allocation (it reads the node list from Slurm); pair it
#                    with `#SBATCH --signal=B:USR1@120`: this script passes a signal it gets on to mpirun as SIGUSR1,
#                    the one signal mpirun forwards to the ranks untouched
#   MS_LAUNCH_ARGS   more arguments for srun or mpirun (word-split)
#   MS_REQUEUE_ON    exit codes that requeue the job (default "3 18"; empty: never requeue)
#   MS_MAX_RESTARTS  requeue only while Slurm's SLURM_RESTART_COUNT is below this (default 20)
#   OMP_NUM_THREADS  threads per rank (default: $SLURM_CPUS_PER_TASK, else 1)
set -uo pipefail

die() {
  echo "launch: $*" >&2
  exit 2
}

[ $# -ge 1 ] || die "usage: launch.sh CONFIG [train options]"
[ -n "${SLURM_JOB_ID:-}" ] || die "SLURM_JOB_ID is not set: run this inside a Slurm allocation (sbatch or salloc)"
config=$1
shift

ms_home=${MS_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
bin=${MS_BIN:-$ms_home/build/mindspeed-train}
ckpt=${MS_CKPT_DIR:-runs/${SLURM_JOB_NAME:-mindspeed}/ckpt}
launcher=${MS_LAUNCHER:-srun}
requeue_on=${MS_REQUEUE_ON-3 18}
max_restarts=${MS_MAX_RESTARTS:-20}
restarts=${SLURM_RESTART_COUNT:-0}
# shellcheck disable=SC2206  # MS_LAUNCH_ARGS is a list of words by design
extra=(${MS_LAUNCH_ARGS:-})
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
# The ranks inherit this environment, and the trainer warns of MS_* variables that are not its switches.
unset MS_HOME MS_BIN MS_CKPT_DIR MS_LAUNCHER MS_LAUNCH_ARGS MS_REQUEUE_ON MS_MAX_RESTARTS
[ -x "$bin" ] || die "the trainer '$bin' is not an executable: build it (scripts/setup.sh) or set MS_BIN"
[ -f "$config" ] || die "the config '$config' does not exist (paths are relative to the submit directory $PWD)"

train=("$bin" train --config "$config" --set "checkpoint.save=$ckpt" --set "checkpoint.load=$ckpt" "$@")
# run.output_dir, where the run records how it ended (exit_status.json), from the resolved config
out_dir=$("${train[@]}" --print-config 2>/dev/null | awk '/^run:/ { r = 1; next } /^[^ ]/ { r = 0 }
  r && /^  output_dir:/ { sub(/^  output_dir: */, ""); gsub(/^["\047]|["\047]$/, ""); print }')
# A stop signal that reaches this shell (--signal=B:..., scancel --batch) goes on to the launcher as `forward_as`:
# srun passes any signal to every task; mpirun kills the ranks on SIGTERM and forwards only SIGUSR1 untouched.
case $launcher in
  srun)
    # --kill-on-bad-exit: a rank that exits with an error ends the step (as under mpirun); a hung peer would
    # otherwise hold the job until its time limit after the others exited 18
    cmd=(srun --mpi=pmix --kill-on-bad-exit=1 "${extra[@]}" "${train[@]}")
    forward_as=""
    ;;
  mpirun)
    root_flag=()
    [ "$(id -u)" -eq 0 ] && root_flag=(--allow-run-as-root)
    cmd=(mpirun "${root_flag[@]}" -x OMP_NUM_THREADS "${extra[@]}" "${train[@]}")
    forward_as=USR1
    ;;
  *) die "MS_LAUNCHER is '$launcher'; use srun or mpirun" ;;
esac

echo "launch: job $SLURM_JOB_ID (restart $restarts) on ${SLURM_JOB_NUM_NODES:-1} node(s), ${SLURM_NTASKS:-?} ranks," \
  "$OMP_NUM_THREADS thread(s) each; checkpoints in $ckpt" >&2
echo "launch: ${cmd[*]}" >&2
pid=""
# shellcheck disable=SC2317  # called by the traps below
forward() { [ -z "$pid" ] || kill -s "${forward_as:-$1}" "$pid" 2>/dev/null; }
for sig in TERM USR1 INT; do
  # shellcheck disable=SC2064  # the signal's name is fixed now, the pid read when it comes
  trap "forward $sig" "$sig"
done
start=$(date +%s)
"${cmd[@]}" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done  # a trapped signal interrupts wait: wait again
wait "$pid"                                             # the launcher's exit code, which bash keeps
code=$?

# The ranks' code is the run's own record when this launch wrote one: srun returns the highest of its tasks' codes
# and mpirun the first failing one's, so a rank killed (137) next to peers that exit 18 naming it reads 137 there.
record=$out_dir/exit_status.json
if [ -n "$out_dir" ] && [ -f "$record" ] && [ "$(stat -c %Y "$record")" -ge "$start" ]; then
  recorded=$(sed -n 's/^ *"code": *\([0-9]*\).*/\1/p' "$record" | head -n 1)
  if [ -n "$recorded" ] && [ "$recorded" != "$code" ]; then
    echo "launch: $launcher exited $code; the run's $record says $recorded: the ranks' code is $recorded" >&2
    code=$recorded
  fi
fi

if [[ " $requeue_on " == *" $code "* ]]; then
  # A job being cancelled (plain scancel: COMPLETING) would be requeued too: only a running one is.
  state=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p')
  if [ "$state" != RUNNING ]; then
    echo "launch: the ranks exited $code, but the job is ${state:-unknown to scontrol} (cancelled or ended by" \
      "Slurm): not requeued" >&2
  elif [ "$restarts" -ge "$max_restarts" ]; then
    echo "launch: the ranks exited $code, but the job has been requeued $restarts times" \
      "(MS_MAX_RESTARTS=$max_restarts): not requeued" >&2
  else
    echo "launch: the ranks exited $code: requeueing job $SLURM_JOB_ID (restart $((restarts + 1)) of at most" \
      "$max_restarts); it resumes from the newest checkpoint in $ckpt" >&2
    scontrol requeue "$SLURM_JOB_ID" || echo "launch: scontrol requeue $SLURM_JOB_ID failed: not requeued" >&2
  fi
fi
exit "$code"
