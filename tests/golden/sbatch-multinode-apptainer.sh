#!/bin/bash
# orchestrate cell a100-g16-n2-r1: generated; submitted with `sbatch --parsable`.
#SBATCH --job-name=orchestrate-a100-g16-n2-r1
#SBATCH --output=/runs/mn/cells/a100-g16-n2-r1/slurm-%j.out
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
#SBATCH --chdir=/runs/mn/cells/a100-g16-n2-r1
#SBATCH --no-requeue
#SBATCH --gres=gpu:8
#SBATCH --partition=gpu
#SBATCH --cpus-per-gpu=8

job=${SLURM_JOB_ID:-?}; [ -z "${SLURM_ARRAY_JOB_ID:-}" ] || job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
echo "# slurm job $job on $(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
# passed by sbatch from the submitting environment, not written here: APPTAINERENV_HF_TOKEN
export APPTAINERENV_ODD=a=b
# 2 nodes: the first node of the allocation hosts the rendezvous
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((29400 + SLURM_JOB_ID % 500))
export MASTER_ADDR="$head" MASTER_PORT="$port" PET_RDZV_ENDPOINT="$head:$port" APPTAINERENV_MASTER_ADDR="$head" APPTAINERENV_MASTER_PORT="$port" APPTAINERENV_PET_RDZV_ENDPOINT="$head:$port"
echo "# rendezvous $head:$port of nodes $SLURM_JOB_NODELIST"
# one task per node; each takes its node rank from Slurm
exec srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'export NODE_RANK="$SLURM_NODEID" PET_NODE_RANK="$SLURM_NODEID" APPTAINERENV_NODE_RANK="$SLURM_NODEID" APPTAINERENV_PET_NODE_RANK="$SLURM_NODEID" APPTAINERENV_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"; exec "$@"' orchestrate-node apptainer exec --nv --cleanenv --env PYTHONUNBUFFERED=1 /images/resnet.sif python3 -m torch.distributed.run --nnodes=2 --nproc_per_node=8 --rdzv_backend=static --rdzv_id=a100-g16-n2-r1 -m workload --device cuda
