"""Command line: ``python -m mpidist run|horovodrun|check|info|bench|soak|timeline [...]`` (the console
script ``mpidist`` is the same). ``run``, ``check``, ``info``, ``bench``, ``soak`` and ``timeline`` run
under mpirun/srun; ``horovodrun`` starts the job itself."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"run": "mpidist.launch.run", "horovodrun": "mpidist.launch.horovodrun", "check": "mpidist.check",
                "info": "mpidist.info", "bench": "mpidist.bench", "soak": "mpidist.soak",
                "timeline": "mpidist.timeline"}
    if not argv or argv[0] not in commands:
        print("usage: mpidist {run,horovodrun,check,info,bench,soak,timeline} [options]   "
              "(also python -m mpidist ...; --help per command)", file=sys.stderr)
        return 2
    import importlib
    return importlib.import_module(commands[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
