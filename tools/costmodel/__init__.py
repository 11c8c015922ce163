"""The alpha-beta-gamma cost model of allreduce (docs/scaling.md): ``model`` (formulas), ``presets``
(link parameters and their sources), ``simulate`` (sweep, crossover, table, plot: ``python -m
tools.costmodel``), ``fit`` (fit to measured sweeps: ``python -m tools.costmodel fit``)."""
