#!/bin/bash
# orchestrate: 2 cells of one job shape as one array; task i runs cell i's job.sbatch.
#SBATCH --job-name=orchestrate-slurm_tiny
#SBATCH --output=/runs/100%%/slurm/array-%A_%a.out
#SBATCH --array=0-1%4
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --time=00:35:00
#SBATCH --no-requeue
#SBATCH --account="bench lab"

case "${SLURM_ARRAY_TASK_ID:-}" in
    0) cell=/runs/tiny/cells/cpu-bs2-r1 dir=/src/orchestrate script=/runs/tiny/cells/cpu-bs2-r1/job.sbatch ;;
    1) cell='/runs/tiny/cells/it'"'"'s $(x)' dir='/src/my orchestrate' script='/runs/tiny/cells/it'"'"'s $(x)/job.sbatch' ;;
    *) echo "orchestrate: array task ${SLURM_ARRAY_TASK_ID:-?} has no cell" >&2; exit 2 ;;
esac
cd "$dir" || exit 2
exec bash "$script" >"$cell/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out" 2>&1
