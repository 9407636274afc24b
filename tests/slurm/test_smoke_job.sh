#!/bin/bash
# Runs fsdpq through Slurm for real on the local cluster (tests/slurm/local_cluster.sh, SLURM_CONF
# set): tests/slurm/smoke_job.sh with 2 ranks under `srun --mpi=pmix`, through slurm/common.sh.
#   1. a short training job under `sbatch --wait`: exit 0, metrics.jsonl with world_size 2 from srun;
#   2. preemption: SIGUSR1 to the running step → checkpoint, exit 75, the job requeues itself,
#      resumes from the checkpoint and completes (Restarts=1);
#   3. a bad setting: the job fails with fsdpq's exit code 2 and its message in the job output;
#   4. preemption during start-up (SIGUSR1 while the data loads): exit 75 with nothing to
#      checkpoint, the job requeues itself, starts over and completes (Restarts=1).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -n ${SLURM_CONF:-} ]] || fail "SLURM_CONF is not set: bring the cluster up first (scripts/ci-slurm.sh)"
timeout 10 sinfo -h >/dev/null || fail "the Slurm cluster does not answer (sinfo)"
[[ -x ./fsdpq ]] || fail "./fsdpq is missing: build it first (make)"

work=$(mktemp -d "${TMPDIR:-/tmp}/fsdpq-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
./fsdpq demo --out "$work/demo" --dry_run >"$work/demo.log" 2>&1 || { cat "$work/demo.log"; fail "fsdpq demo --dry_run could not prepare the tiny model"; }

# A site.env like a user's: the test checks that jobs really source it (their run folders land in
# FSDPQ_RUNS) and pass FSDPQ_SRUN_ARGS to srun.
cat >"$work/site.env" <<EOF
FSDPQ_SRUN_MPI=pmix
FSDPQ_SRUN_ARGS="--kill-on-bad-exit=1"
FSDPQ_RUNS=$work/runs
EOF
export FSDPQ_SITE_ENV="$work/site.env" FSDPQ_ROOT="$root"
export FSDPQ_MODEL="$work/demo/model" FSDPQ_DATA="$work/demo/data.jsonl"

job_field() { scontrol show job "$1" | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }
show_output() { echo "---- $1" >&2; cat "$1" >&2 || true; }
# submit_and_wait OUT ARG...: smoke_job.sh ARG... under sbatch --wait; sets id and rc (the job's exit).
submit_and_wait() {
  local out=$1
  shift
  set +e
  id=$(timeout 300 sbatch --parsable --wait --output="$out" tests/slurm/smoke_job.sh "$@")
  rc=$?
  set -e
}

# wait_for_completion_after_requeue ID OUT: waits for a requeued job to end; fails unless COMPLETED.
wait_for_completion_after_requeue() {
  local id=$1 out=$2 state=""
  for _ in $(seq 1 360); do  # up to 360 s
    state=$(job_field "$id" JobState)
    [[ $state == COMPLETED || $state == FAILED || $state == CANCELLED || $state == TIMEOUT ]] && break
    sleep 1
  done
  [[ $state == COMPLETED ]] || { show_output "$out"; scontrol show job "$id" >&2 || true; scancel "$id" || true; fail "job $id ended $state (expected COMPLETED after a requeue)"; }
}

# 1. --- a short run under sbatch --wait
out="$work/job1.out"
submit_and_wait "$out" --max_steps 6
((rc == 0)) || { show_output "$out"; fail "smoke job ${id:-?} exited with $rc (expected 0)"; }
metrics="$work/runs/fsdpq-ci-smoke-$id/metrics.jsonl"
[[ -f $metrics ]] || { show_output "$out"; fail "no $metrics (site.env's FSDPQ_RUNS not used?)"; }
header=$(grep '"type":"header"' "$metrics") || fail "$metrics has no header record"
grep -q '"world_size":2[,}]' <<<"$header" || fail "$metrics: header does not say world_size 2: $header"
grep -q '"launcher":"srun"' <<<"$header" || fail "$metrics: header does not name srun as the launcher"
steps=$(grep -c '"type":"step"' "$metrics" || true)
((steps == 6)) || fail "$metrics: $steps step records, expected 6"
grep -q '"type":"summary".*"world_size":2' "$metrics" || fail "$metrics: no summary record for 2 ranks"
grep -q -- '--kill-on-bad-exit=1' "$out" || { show_output "$out"; fail "FSDPQ_SRUN_ARGS from site.env did not reach srun"; }
echo "ok: smoke job $id: 2 ranks under srun, 6 steps, $metrics"

# 2. --- preemption: USR1 to the job step, checkpoint, exit 75, requeue, resume, complete
out="$work/job2.out"
id=$(sbatch --parsable --output="$out" tests/slurm/smoke_job.sh --max_steps 60)
metrics="$work/runs/fsdpq-ci-smoke-$id/metrics.jsonl"
for _ in $(seq 1 600); do  # up to 120 s for two steps to be on record
  [[ -f $metrics ]] && (($(grep -c '"type":"step"' "$metrics" || true) >= 2)) && break
  sleep 0.2
done
(($(grep -c '"type":"step"' "$metrics" 2>/dev/null || true) >= 2)) || { show_output "$out"; fail "job $id: no training steps within 120 s"; }
# Without --batch/--full scancel signals the job steps (the ranks), as --signal=USR1@N does.
scancel --signal=USR1 "$id"
# Slurm holds a requeued batch job about two minutes (Reason=BeginTime) while the old run is
# cleaned up; starting it sooner (scontrol update StartTime=now) made the new step collide with
# the old one's PMIx socket here, so the test waits like a real job does.
wait_for_completion_after_requeue "$id" "$out"
restarts=$(job_field "$id" Restarts)
[[ $restarts == 1 ]] || { show_output "$out"; fail "job $id: Restarts=$restarts, expected 1"; }
grep '"type":"preempted"' "$metrics" | grep -q '"signal":"SIGUSR1"' || fail "$metrics: no preempted record for SIGUSR1"
grep -q 'requeueing job' "$out" || { show_output "$out"; fail "job $id: slurm/common.sh did not say it requeued"; }
grep '"type":"header"' "$metrics" | grep -q '"resumed_from"' || fail "$metrics: the requeued run did not resume from the checkpoint"
summary=$(grep '"type":"summary"' "$metrics" | tail -n 1)
grep -q '"steps":60[,}]' <<<"$summary" || fail "$metrics: the resumed run did not reach step 60: $summary"
echo "ok: job $id: SIGUSR1 → checkpoint → exit 75 → requeued → resumed → completed at step 60"

# 3. --- a bad setting ends the job with exit 2 and fsdpq's message
out="$work/job3.out"
submit_and_wait "$out" --batch_size 0
((rc == 2)) || { show_output "$out"; fail "job with --batch_size 0 exited with $rc (expected 2)"; }
grep -q 'batch_size' "$out" || { show_output "$out"; fail "the job output does not name batch_size"; }
grep -q 'bad setting or input (exit 2)' "$out" || { show_output "$out"; fail "slurm/common.sh did not explain exit 2"; }
echo "ok: job $id: --batch_size 0 → exit 2 with the message in the job output"

# 4. --- preemption during start-up: exit 75 with nothing to checkpoint, requeue, start over, complete
out="$work/job4.out"
id=$(FSDPQ_SMOKE_FIRST_RUN_FAULT='*:load_data:usr1' sbatch --parsable --output="$out" tests/slurm/smoke_job.sh --max_steps 6)
metrics="$work/runs/fsdpq-ci-smoke-$id/metrics.jsonl"
wait_for_completion_after_requeue "$id" "$out"
restarts=$(job_field "$id" Restarts)
[[ $restarts == 1 ]] || { show_output "$out"; fail "job $id: Restarts=$restarts, expected 1"; }
grep -q 'SIGUSR1 received during start-up: nothing to checkpoint yet; exiting with code 75' "$out" || { show_output "$out"; fail "job $id: fsdpq did not say it was preempted during start-up"; }
grep -q 'requeueing job' "$out" || { show_output "$out"; fail "job $id: slurm/common.sh did not requeue after exit 75"; }
summary=$(grep '"type":"summary"' "$metrics" | tail -n 1)
grep -q '"steps":6[,}]' <<<"$summary" || fail "$metrics: the requeued run did not complete its 6 steps: $summary"
echo "ok: job $id: SIGUSR1 during start-up → exit 75 → requeued → started over → completed"
