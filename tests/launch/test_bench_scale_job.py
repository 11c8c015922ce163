"""``mpidist bench scale`` as users run it, at 16 ranks on 4 fake nodes of 4 (issue 33: a job well above
the suite's 4 ranks, oversubscribed on the test machine): every collective correct on every rank.
Timings are printed, never asserted (the figures at -n 2 and -n 32: docs/performance.md)."""
from __future__ import annotations

import json

from mpidist.bench import scale

SIZE, NODE = 16, 4


def test_every_collective_is_correct_at_16_ranks_on_4_fake_nodes(mpirun):
    job = mpirun(SIZE, "-m", "mpidist", "bench", "scale", "--seconds", "0.05", "--json", timeout=300,
                 env={"MPIDIST_LOCAL_SIZE": str(NODE)})
    assert job.returncode == 0, job.output
    result = json.loads(job.output[job.output.index("{"):job.output.rindex("}") + 1])
    assert (result["size"], result["nodes"], result["node_sizes"]) == (SIZE, SIZE // NODE, [NODE] * (SIZE // NODE))
    assert result["checks"] == {name: [] for name in scale.CHECKS}, result["errors"]
    assert result["startup_seconds"]["Engine"] > 0 and result["per_call_seconds"]["engine.allreduce 4 KB"] > 0
    print(scale.table(result))  # (pytest -s shows the figures)
