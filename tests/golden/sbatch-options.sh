#!/bin/bash
# orchestrate cell a100-g2-r1: generated; submitted with `sbatch --parsable`.
#SBATCH --job-name=orchestrate-a100-g2-r1
#SBATCH --output=/runs/100%%/a100-g2-r1/slurm-%j.out
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --time=1-00:05:00
#SBATCH --chdir="/src/my orchestrate"
#SBATCH --no-requeue
#SBATCH --gres=gpu:2
#SBATCH --partition=gpu
#SBATCH --account="bench lab"
#SBATCH --qos=high
#SBATCH --cpus-per-gpu=8
#SBATCH --mem=64G
#SBATCH --constraint=a100
#SBATCH --comment="it's \"quoted\""
#SBATCH --exclusive

job=${SLURM_JOB_ID:-?}; [ -z "${SLURM_ARRAY_JOB_ID:-}" ] || job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
echo "# slurm job $job on $(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
export PYTHONUNBUFFERED=1
export NCCL_DEBUG=WARN
export QUOTED='it'"'"'s $(not run) `x`'
exec /opt/venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 -m workload --data '/data/image net; rm -rf /' --device cuda
