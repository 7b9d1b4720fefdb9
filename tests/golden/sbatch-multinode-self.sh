#!/bin/bash
# orchestrate cell v100-g16-n2-r1: generated; submitted with `sbatch --parsable`.
#SBATCH --job-name=orchestrate-v100-g16-n2-r1
#SBATCH --output=/runs/mn/cells/v100-g16-n2-r1/slurm-%j.out
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --time=01:00:00
#SBATCH --chdir=/workspace/rn50
#SBATCH --no-requeue
#SBATCH --gres=gpu:8

job=${SLURM_JOB_ID:-?}; [ -z "${SLURM_ARRAY_JOB_ID:-}" ] || job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
echo "# slurm job $job on $(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
export PYTHONUNBUFFERED=1
# 2 nodes: the first node of the allocation hosts the rendezvous
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((29400 + SLURM_JOB_ID % 500))
export MASTER_ADDR="$head" MASTER_PORT="$port" PET_RDZV_ENDPOINT="$head:$port"
echo "# rendezvous $head:$port of nodes $SLURM_JOB_NODELIST"
exec mpirun -np 16 python main.py --arch resnet50
