"""``python -m tools.costmodel [fit|overlap] [options]``: predictions from the cost model, its fit to sweeps,
or a step with gradient buckets overlapping backprop (overlap.py)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["fit"]:
        from .fit import main as fit_main
        return fit_main(argv[1:])
    if argv[:1] == ["overlap"]:
        from .overlap import main as overlap_main
        return overlap_main(argv[1:])
    from .simulate import main as simulate_main
    return simulate_main(argv)


if __name__ == "__main__":
    sys.exit(main())
