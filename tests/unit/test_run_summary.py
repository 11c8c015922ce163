"""tests/run's summary: a step where every test was skipped, or none ran, reads SKIP with pytest's
reasons, never PASS; every line ends with the step's time and the CPU time of its processes. The step function is taken from tests/run itself and run on stand-in
commands that print what pytest prints."""
from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

RUN = pathlib.Path(__file__).resolve().parents[1] / "run"
TIMES = r" \[\d+ s, CPU \d+ s\]$"


def summary_of(output: str, tmp_path: pathlib.Path, code: int = 0, counts: str | None = None,
               hang: str | None = None) -> str:
    """The summary line tests/run's ``step`` writes for a step that prints ``output`` and exits with
    ``code`` (and, as a tests/mpi launch does, writes ``counts`` to MPITEST_COUNTS, and ``hang`` to
    MPITEST_HANG_REPORT), with the lines that follow it, if any."""
    text = RUN.read_text()
    functions = text[text.index("status=0\n"):text.index("extra=$(")]
    (tmp_path / "tests" / ".logs").mkdir(parents=True)
    (tmp_path / "printed").write_text(output)
    command = "cat printed"
    if counts:
        (tmp_path / "counts.txt").write_text(counts + "\n")
        command += f"; cp counts.txt {tmp_path}/counts"
    if hang:
        command += f'; echo "{hang}" >> "$MPITEST_HANG_REPORT"'
    setup = f"export MPITEST_COUNTS={tmp_path}/counts\n" if counts else ""
    script = (f"{functions}\nextra=0\n{setup}step demo bash -c '{command}; exit {code}' >/dev/null\n"
              f"printf '%s\\n' \"${{summary[@]}}\"\n")
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line, *more = done.stdout.strip().split("\n")
    if more:  # the lines of a hang report, after the step's own
        return "\n".join([re.sub(TIMES, "", line), *more])
    assert re.search(TIMES, line), f"no step time and CPU time at the end of {line!r}"
    return re.sub(TIMES, "", line)


def test_every_test_skipped_is_a_skip_with_the_reasons(tmp_path):
    out = ("sss\nSKIPPED [2] tests/slurm/conftest.py:29: no Slurm here: apt-get failed\n"
           "SKIPPED [1] tests/slurm/test_elastic.py:12: no Slurm here: apt-get failed\n"
           "SKIPPED [1] tests/mpi/test_tf_x.py:9: could not import 'tensorflow'\n"
           "\x1b[33m4 skipped\x1b[0m in 0.51s\n")
    assert summary_of(out, tmp_path) == (
        "SKIP  demo: all 4 tests skipped: no Slurm here: apt-get failed; could not import 'tensorflow'")


def test_no_test_run_is_a_skip(tmp_path):
    assert summary_of("\nno tests ran in 0.01s\n", tmp_path) == "SKIP  demo: no test ran"


@pytest.mark.parametrize("out, expected", [
    ("5 passed, 2 skipped in 3.20s", "PASS  demo (5 passed, 2 skipped)"),
    ("12 passed in 1.00s", "PASS  demo (12 passed)"),
])
def test_passes_count_passed_and_skipped(tmp_path, out, expected):
    assert summary_of(out + "\n", tmp_path) == expected


def test_mpi_counts_file_and_failures(tmp_path):
    assert summary_of("3 passed, 1 skipped in 2.00s\n", tmp_path, counts="3 2") == \
        "PASS  demo (3 passed, of which 2 on the host fake of CuPy/NCCL, not a GPU, 1 skipped)"


def test_a_failure_stays_a_failure(tmp_path):
    assert summary_of("1 failed, 2 skipped in 2.00s\n", tmp_path, code=1) == "FAIL  demo (exit 1) (0 passed, 2 skipped)"


def test_a_step_that_is_not_pytest_reads_pass_or_fail_by_its_exit_code(tmp_path):
    assert summary_of("--- ruff check mpidist tools\nAll checks passed!\n", tmp_path) == "PASS  demo"
    (tmp_path / "again").mkdir()
    assert summary_of("Found 3 errors.\n", tmp_path / "again", code=1) == "FAIL  demo (exit 1)"


def test_a_hung_test_is_named_under_its_failed_step(tmp_path):
    """tests/mpi_pytest.py appends a line per hung rank to MPITEST_HANG_REPORT: the summary (the last
    lines CI shows) carries them under the failed step."""
    hung = "rank 1: tests/mpi/test_x.py::test_y still running after 300 s, at mpidist/a.py:3 in wait"
    assert summary_of("..\n", tmp_path, code=134, hang=hung) == f"FAIL  demo (exit 134)\n      {hung}"
    (tmp_path / "again").mkdir()  # a report is read only when the step failed
    assert summary_of("1 passed in 1.00s\n", tmp_path / "again", hang=hung) == "PASS  demo (1 passed)"


def test_the_cpu_time_is_that_of_the_steps_processes(tmp_path):
    """A step that keeps a CPU busy for about a second reports about a second of CPU time (bash's
    ``times`` in the step's own shell: a subshell would count nothing)."""
    script_end = "python3 -c 'import time; t = time.process_time() + 1.2\nwhile time.process_time() < t: pass'"
    text = RUN.read_text()
    functions = text[text.index("status=0\n"):text.index("extra=$(")]
    (tmp_path / "tests" / ".logs").mkdir(parents=True)
    script = f'{functions}\nextra=0\nstep demo bash -c "{script_end}" >/dev/null\nprintf "%s\\n" "${{summary[@]}}"\n'
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    cpu = int(re.search(r"CPU (\d+) s\]$", done.stdout.strip()).group(1))
    assert 1 <= cpu <= 2, done.stdout  # 1.2 s of work, plus the interpreter's start
