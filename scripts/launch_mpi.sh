#!/usr/bin/env bash
# Data-parallel training started by mpirun (Open MPI syntax), on one machine or,
# with a hostfile, on many. The ranks meet through MPI when train_gpt_sparse was
# built with MPI (the Makefile does so when mpicc is installed); otherwise give
# --init-address HOST:PORT of the first host, or --init-file on a shared filesystem.
#   usage: scripts/launch_mpi.sh NUM_PROCESSES [train_gpt_sparse flags...]
#          HOSTFILE=hosts scripts/launch_mpi.sh 16 -e 1.5b ...    (hosts: "node1 slots=8" lines)
set -u
if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 NUM_PROCESSES [train_gpt_sparse flags...]" >&2
    exit 2
fi
n=$1; shift
cd "$(dirname "$0")/.."
exec mpirun -np "$n" ${HOSTFILE:+--hostfile "$HOSTFILE"} --bind-to none \
    -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH ./train_gpt_sparse "$@"
