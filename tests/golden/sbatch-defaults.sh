#!/bin/bash
# orchestrate cell cpu-bs2-r1: generated; submitted with `sbatch --parsable`.
#SBATCH --job-name=orchestrate-cpu-bs2-r1
#SBATCH --output=/runs/slurm_tiny/20240101-000000/cells/cpu-bs2-r1/slurm-%j.out
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --time=00:35:00
#SBATCH --chdir=/src/orchestrate
#SBATCH --no-requeue

job=${SLURM_JOB_ID:-?}; [ -z "${SLURM_ARRAY_JOB_ID:-}" ] || job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
echo "# slurm job $job on $(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
export PYTHONUNBUFFERED=1
export PYTHONPATH=/src/orchestrate
exec /opt/venv/bin/python -m workload --batch-size 2 --device cpu --output-dir /runs/slurm_tiny/20240101-000000/cells/cpu-bs2-r1
