#!/usr/bin/env bash
# Data-parallel training under Slurm, on one or many machines: one task per GPU,
# meeting through a file in the run's directory (which every node must see).
#   usage: sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 scripts/launch_slurm.sh [train_gpt_sparse flags...]
# Slurm gives each task SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, which
# train_gpt_sparse reads. To meet over TCP instead:
#   srun ./train_gpt_sparse --init tcp --init-address "$(scontrol show hostnames | head -n 1):29500" ...
#SBATCH --job-name=train_gpt_sparse
set -u
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
export NCCL_NVLS_ENABLE=0
exec srun ./train_gpt_sparse --init file --init-file "$PWD/.rendezvous.${SLURM_JOB_ID:-$$}" "$@"
