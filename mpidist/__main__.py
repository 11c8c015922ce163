"""Command line: ``python -m mpidist check|info|bench|soak|timeline [...]`` (under mpirun/srun)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"check": "mpidist.check", "info": "mpidist.info", "bench": "mpidist.bench", "soak": "mpidist.soak",
                "timeline": "mpidist.timeline"}
    if not argv or argv[0] not in commands:
        print("usage: python -m mpidist {check,info,bench,soak,timeline} [options]   "
              "(run under mpirun/srun; --help per command)", file=sys.stderr)
        return 2
    import importlib
    return importlib.import_module(commands[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
