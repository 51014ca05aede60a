#!/bin/bash
# zerotopo under an MPI launcher (mpich's hydra mpiexec; Open MPI's mpirun takes -N for -ppn).
#
#   NP=16 PPN=8 HOSTS=node1,node2 launch/mpiexec.sh configs/<model>.yml [more zerotopo train args]
#   NP=8 launch/mpiexec.sh configs/tiny.yml            # one machine, emulated as 2 nodes (below)
#
# Ranks learn rank, size, node and the rendezvous address from mpi4py (pip install mpi4py mpich, or
# mpi4py built against the site MPI). docs/launch.md explains every line.
set -euo pipefail
run() { if [[ -n "${ZEROTOPO_DRY_RUN:-}" ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }

NP=${NP:-8}
PPN=${PPN:-$NP}
HOSTS=${HOSTS:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # one thread per rank unless told otherwise

ARGS=(-n "$NP" -ppn "$PPN")
if [[ -n "$HOSTS" ]]; then
    ARGS+=(-hosts "$HOSTS")
elif [[ "$NP" -gt 1 ]]; then
    # All ranks on this machine: group them into 2 emulated nodes, the shape of the emulated topology.
    export ZEROTOPO_EMULATED_NODES=${ZEROTOPO_EMULATED_NODES:-2}
fi
# hydra forwards this environment to every rank.
run mpiexec "${ARGS[@]}" zerotopo train --launcher auto "$@"
