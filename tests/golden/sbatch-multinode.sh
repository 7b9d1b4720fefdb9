#!/bin/bash
# orchestrate cell cpu-g4-n2-r1: generated; submitted with `sbatch --parsable`.
#SBATCH --job-name=orchestrate-cpu-g4-n2-r1
#SBATCH --output=/runs/mn/cells/cpu-g4-n2-r1/slurm-%j.out
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:35:00
#SBATCH --chdir=/src/orchestrate
#SBATCH --no-requeue

job=${SLURM_JOB_ID:-?}; [ -z "${SLURM_ARRAY_JOB_ID:-}" ] || job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
echo "# slurm job $job on $(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=1
# 2 nodes: the first node of the allocation hosts the rendezvous
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((29400 + SLURM_JOB_ID % 500))
export MASTER_ADDR="$head" MASTER_PORT="$port" PET_RDZV_ENDPOINT="$head:$port"
echo "# rendezvous $head:$port of nodes $SLURM_JOB_NODELIST"
# one task per node; each takes its node rank from Slurm
exec srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'export NODE_RANK="$SLURM_NODEID" PET_NODE_RANK="$SLURM_NODEID"; exec "$@"' orchestrate-node /opt/venv/bin/python -m torch.distributed.run --nnodes=2 --nproc_per_node=2 --rdzv_backend=static --rdzv_id=cpu-g4-n2-r1 -m workload --device cpu --output-dir /runs/mn/cells/cpu-g4-n2-r1
