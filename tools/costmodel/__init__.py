"""The alpha-beta-gamma cost model of allreduce (docs/scaling.md): ``model`` (formulas), ``presets``
(link parameters and their sources), ``simulate`` (sweep, crossover, table, plot: ``python -m
tools.costmodel``), ``fit`` (fit to measured sweeps: ``python -m tools.costmodel fit``), ``record``
(a training step's MPI calls as mpidist issues them), ``step`` and ``horovod`` (their cost to 4096
ranks beside Horovod's schedule and NCCL: ``python -m tools.costmodel step``)."""
