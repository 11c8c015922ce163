"""``python -m tools.costmodel [fit] [options]``: predictions from the cost model, or its fit to sweeps."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["fit"]:
        from .fit import main as fit_main
        return fit_main(argv[1:])
    from .simulate import main as simulate_main
    return simulate_main(argv)


if __name__ == "__main__":
    sys.exit(main())
