"""What ``mpidist run`` runs, and running it in this interpreter as ``python`` would.

``mpidist run`` takes what ``python`` takes after its own options, or a command:

- ``PROGRAM.py ARGS`` (any file, a directory or zip with ``__main__.py``): ``sys.argv = [PROGRAM,
  *ARGS]``, ``sys.path[0]`` = the program's directory, run as ``__main__``;
- ``-m MODULE ARGS``: the module (or package's ``__main__``) as ``python -m`` runs it;
- ``-c CODE ARGS``: the code, ``sys.argv[0] == "-c"``;
- ``python [-u] ...`` (this interpreter's name: what job scripts say after ``srun``): the same;
- ``COMMAND ARGS``, a command on PATH whose file is a Python program (a console script of a pip
  package: its first line names a Python interpreter): that file, as a program.

Anything else is a clear :class:`LaunchError` (a program ``mpidist run`` cannot run in Python).
"""
from __future__ import annotations

import logging
import os
import re
import runpy
import shutil
import sys
from dataclasses import dataclass, field

__all__ = ["LaunchError", "Target", "resolve", "execute"]

_log = logging.getLogger("mpidist")
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?$")


class LaunchError(Exception):
    """``mpidist run`` was given something it cannot run; the message says what and why."""


@dataclass
class Target:
    """``kind``: "path", "module" or "code"; ``what``: the file, module name or code; ``argv``:
    ``sys.argv`` for the program; ``unbuffered``: python's ``-u`` was given."""

    kind: str
    what: str
    argv: list[str] = field(default_factory=list)
    unbuffered: bool = False

    def describe(self) -> str:
        return {"path": self.what, "module": f"-m {self.what}", "code": "-c ..."}[self.kind]


def _is_python_file(path: str) -> bool:
    if path.endswith((".py", ".pyw", ".pyz")) or os.path.isdir(path):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _other_interpreter(command: str) -> str | None:
    """The interpreter binary ``command`` names on PATH when it is not the one running mpidist (None
    when it is, or when it is a wrapper such as a pyenv shim, which cannot be told apart)."""
    found = shutil.which(command)
    if found is None or os.path.realpath(found) == os.path.realpath(sys.executable):
        return None
    try:
        with open(found, "rb") as f:
            binary = f.read(4) == b"\x7fELF"
    except OSError:
        return None
    return found if binary else None


def _python_args(args: list[str], interpreter: str) -> Target:
    unbuffered = False
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c", "-"):
        option = args.pop(0)
        if option == "-u":
            unbuffered = True
        elif option in ("-B", "-s", "-E", "-I", "-q", "-O", "-OO"):
            continue  # no effect that matters once the interpreter runs
        else:
            raise LaunchError(f"mpidist run: python option {option!r} is not supported after `{interpreter}`; "
                              f"give it to the interpreter that runs mpidist (`python {option} -m mpidist run ...`)")
    if not args:
        raise LaunchError(f"mpidist run: `{interpreter}` needs a program (a file, -m MODULE or -c CODE)")
    target = _program(args)
    target.unbuffered = unbuffered
    return target


def _program(args: list[str], quiet: bool = False) -> Target:
    first, rest = args[0], args[1:]
    if first == "-m":
        if not rest:
            raise LaunchError("mpidist run: -m needs a module name")
        return Target("module", rest[0], [rest[0], *rest[1:]])
    if first == "-c":
        if not rest:
            raise LaunchError("mpidist run: -c needs the code to run")
        return Target("code", rest[0], ["-c", *rest[1:]])
    if os.path.exists(first):
        if not _is_python_file(first):
            raise LaunchError(f"mpidist run: {first!r} is not a Python program (mpidist run runs Python programs "
                              f"in its interpreter; start other programs with mpirun/srun directly)")
        return Target("path", first, [first, *rest])
    if os.sep in first or first.endswith(".py"):
        raise LaunchError(f"mpidist run: no such program: {first!r}")
    if _PYTHON_NAME.match(os.path.basename(first)):
        other = _other_interpreter(first)
        if other is not None and not quiet:
            _log.warning("mpidist run: `%s` on PATH is %s, not the interpreter running mpidist (%s); the program "
                         "runs in the latter (start mpidist with the former to change that: `%s -m mpidist run`)",
                         first, other, sys.executable, first)
        return _python_args(list(rest), first)
    found = shutil.which(first)
    if found is None:
        raise LaunchError(f"mpidist run: {first!r} is neither a file nor a command on PATH")
    if not _is_python_file(found):
        raise LaunchError(f"mpidist run: the command {first!r} ({found}) is not a Python program (its first line "
                          f"names no Python interpreter); mpidist run runs Python programs in its interpreter")
    return Target("path", found, [first, *rest])


def resolve(args: list[str], quiet: bool = False) -> Target:
    """The program ``args`` name (see the module docstring); ``quiet``: no warning (ranks but the chief)."""
    if not args:
        raise LaunchError("mpidist run: nothing to run (give PROGRAM.py, -m MODULE, -c CODE or a command)")
    return _program(list(args), quiet)


def execute(target: Target) -> None:
    """Run ``target`` as ``__main__`` in this interpreter (returns when it returns; its SystemExit and
    exceptions propagate)."""
    if target.unbuffered:
        for stream in (sys.stdout, sys.stderr):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(line_buffering=True)
    sys.argv = list(target.argv)
    if target.kind == "module":
        sys.path[0] = os.getcwd()  # python -m: the current directory first
        runpy.run_module(target.what, run_name="__main__", alter_sys=True)
    elif target.kind == "code":
        sys.path[0] = ""
        code = compile(target.what, "<string>", "exec")
        main = sys.modules["__main__"]
        namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__doc__": None,
                     "__spec__": None, "__loader__": getattr(main, "__loader__", None), "__package__": None}
        main.__dict__.clear()
        main.__dict__.update(namespace)
        exec(code, main.__dict__)
    else:
        path = os.path.abspath(target.what)
        sys.path[0] = path if os.path.isdir(path) or path.endswith(".pyz") else os.path.dirname(path)
        runpy.run_path(path, run_name="__main__")
