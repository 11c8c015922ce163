#!/bin/bash
# Measured allreduce sweeps for the cost-model check (docs/scaling.md). Run from the repository root:
#   bash docs/data/measure.sh [REPEATS] [OUTDIR]
# Each repeat runs three jobs: 2 ranks, 4 ranks, 4 ranks as two fake nodes of 2 (hierarchical path
# forced). The load average before each job goes to OUTDIR/loadavg.txt (this VM is shared).
set -eu
reps=${1:-5}
out=${2:-docs/data}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun="mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1"
sweep="python -m tools.sweep --collectives allreduce --min 64 --max 64MB --factor 4 --seconds 1 --json"
for rep in $(seq 1 "$reps"); do
  echo "r$rep n2 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/loadavg.txt"
  $mpirun -n 2 $sweep > "$out/sweep-n2-r$rep.json"
  echo "r$rep n4 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/loadavg.txt"
  $mpirun -n 4 $sweep > "$out/sweep-n4-r$rep.json"
  echo "r$rep n4-ls2 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/loadavg.txt"
  $mpirun -n 4 -x MPIDIST_LOCAL_SIZE=2 -x MPIDIST_ALGORITHM=hierarchical $sweep > "$out/sweep-n4-ls2-r$rep.json"
done
