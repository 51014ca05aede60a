#!/usr/bin/env bash
# System packages for the launcher tests (tests/launch): a local Slurm with munge (apt) and mpich with
# mpi4py (pip). Run as root on a fresh Debian/Ubuntu machine; safe to run again (installs only what is
# missing) and quiet unless something fails. Without root, it installs the pip part only and says so:
# the Slurm tests then skip with that reason.
set -euo pipefail

log() { echo "install-system: $*"; }

need_apt=()
for bin in slurmctld slurmd srun sinfo munged; do
    if ! command -v "$bin" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$bin" ]; then
        need_apt=(slurm-wlm munge)
        break
    fi
done

if [ "${#need_apt[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        log "not root: cannot apt-get install ${need_apt[*]}; the Slurm tests will skip"
    elif ! command -v apt-get >/dev/null 2>&1; then
        log "no apt-get on this machine: install ${need_apt[*]} yourself; the Slurm tests will skip"
    else
        export DEBIAN_FRONTEND=noninteractive
        # The package scripts try to start the system daemons; the test harness runs its own instead, so
        # keep them from starting (and failing) where there is no init system.
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
            chmod +x /usr/sbin/policy-rc.d
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        fi
        if apt-get update -qq >/dev/null &&
            apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null; then
            log "installed ${need_apt[*]}"
        else
            log "apt-get install ${need_apt[*]} failed; the Slurm tests will skip"
        fi
    fi
fi

PY=${PYTHON:-python3}
# mpich's wheel brings mpiexec (hydra) next to the interpreter, and libmpi; mpi4py's wheel finds that MPI.
have_mpiexec='import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("scripts"), "mpiexec")))'
if ! "$PY" -c 'import mpi4py' >/dev/null 2>&1 || ! "$PY" -c "$have_mpiexec"; then
    if PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check mpi4py mpich; then
        log "installed mpi4py and mpich (pip)"
    else
        log "pip install mpi4py mpich failed; the MPI tests will skip"
    fi
fi
