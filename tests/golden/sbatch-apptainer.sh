#!/bin/bash
# orchestrate cell node-g4-bs64-fp32-r1: generated; submitted with `sbatch --parsable`.
#SBATCH --job-name=orchestrate-node-g4-bs64-fp32-r1
#SBATCH --output=/results/appt/RUN/cells/node-g4-bs64-fp32-r1/slurm-%j.out
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --time=00:15:00
#SBATCH --chdir=/results/appt/RUN/cells/node-g4-bs64-fp32-r1
#SBATCH --no-requeue
#SBATCH --gres=gpu:4
#SBATCH --partition=gpu
#SBATCH --cpus-per-gpu=8

job=${SLURM_JOB_ID:-?}; [ -z "${SLURM_ARRAY_JOB_ID:-}" ] || job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
echo "# slurm job $job on $(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
# passed by sbatch from the submitting environment, not written here: APPTAINERENV_HF_TOKEN
export APPTAINERENV_ODD=a=b
# the GPUs Slurm gave this job, passed into the container explicitly
export APPTAINERENV_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"
exec srun apptainer exec --nv --cleanenv --bind /scratch/imagenet:/imagenet:ro --bind /results/appt/RUN/cells/node-g4-bs64-fp32-r1:/results/appt/RUN/cells/node-g4-bs64-fp32-r1 --pwd /results/appt/RUN/cells/node-g4-bs64-fp32-r1 --env PYTHONUNBUFFERED=1 --env NCCL_DEBUG=WARN --writable-tmpfs /images/resnet.sif python3 -m torch.distributed.run --standalone --nproc_per_node=4 -m workload --batch-size 64 --precision fp32 --mode train --arch resnet50 --image-size 224 --warmup 20 --iterations 500 --data synthetic --channels-last --compile none --no-cuda-graphs --no-pretrained --num-classes 1000 --workers 4 --seed 0 --profiler none --profile-start 0 --profile-iterations 5 --telemetry-interval 0.5 --device cuda --output-dir /results/appt/RUN/cells/node-g4-bs64-fp32-r1
