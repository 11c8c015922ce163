"""``python -m tools.costmodel [fit|overlap|record|step] [options]``: predictions from the cost model, its fit
to sweeps, a step with gradient buckets overlapping backprop (overlap.py), the recorded MPI calls of a
training step (record.py) and their predicted cost to 4096 ranks against Horovod's schedule (step.py)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["fit"]:
        from .fit import main as fit_main
        return fit_main(argv[1:])
    if argv[:1] == ["record"]:
        from .record import main as record_main
        return record_main(argv[1:])
    if argv[:1] == ["step"]:
        from .step import main as step_main
        return step_main(argv[1:])
    if argv[:1] == ["overlap"]:
        from .overlap import main as overlap_main
        return overlap_main(argv[1:])
    from .simulate import main as simulate_main
    return simulate_main(argv)


if __name__ == "__main__":
    sys.exit(main())
