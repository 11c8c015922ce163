"""``mpidist timeline merge`` on files a job left (no MPI needed: the merge is one process's work; the
traces themselves are written in tests/mpi/test_timeline.py and test_cli.py)."""
from __future__ import annotations

import pytest

from mpidist.timeline import merge


def test_timeline_merge_reads_a_file_cut_short(tmp_path):
    """A job killed mid-run leaves a trace without its closing bracket; merge still reads it."""
    cut = tmp_path / "cut.json"
    cut.write_text('[\n{"name":"allreduce","ph":"X","pid":0,"tid":1,"ts":1,"dur":2},\n'
                   '{"name":"transfer","ph":"X","pid":0,"tid":1,"ts":1.5,"dur":1}')
    assert [e["name"] for e in merge([str(cut)])["traceEvents"]] == ["allreduce", "transfer"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    with pytest.raises(ValueError, match="timeline merge: .* is not a trace in JSON array format"):
        merge([str(bad)])
