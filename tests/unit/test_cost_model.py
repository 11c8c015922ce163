"""The allreduce cost model (tools/costmodel/model.py), its fit and its CLI (`python -m tools.costmodel`):
serial, fast. The tools live beside the package, so the repository root goes on sys.path."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.costmodel import fit as fitting  # noqa: E402
from tools.costmodel import simulate  # noqa: E402
from tools.costmodel.__main__ import main as costmodel_main  # noqa: E402
from tools.costmodel.model import ALGORITHMS, FLAT_CANDIDATES, PRESETS, Params, predict  # noqa: E402

DATA = ROOT / "docs" / "data"
SIZES = [0, 1, 64, 4096, 1 << 20, 64 << 20, 1 << 30]


def flat(n, p, k, prm):
    return min(predict(a, n, p, k, prm) for a in FLAT_CANDIDATES)


def simple(alpha=2e-6, beta=1e-9, gamma=0.5e-9, k=4, nics=1, alpha_inter=None, beta_inter=None):
    return Params("t", k, alpha, beta, alpha if alpha_inter is None else alpha_inter,
                  beta if beta_inter is None else beta_inter, nics, gamma)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_one_rank_costs_nothing(algorithm, preset):
    assert all(predict(algorithm, n, 1, None, preset) == 0.0 for n in SIZES)


@pytest.mark.parametrize("p", [2, 4, 8, 64, 1024])
def test_textbook_formulas_inside_one_node(p):
    a, b, g, n = 3e-6, 2e-9, 1e-9, 1 << 22
    prm = simple(a, b, g, k=p)
    lg = math.log2(p)
    bandwidth = 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
    assert predict("ring", n, p, p, prm) == pytest.approx(2 * (p - 1) * a + bandwidth)
    assert predict("recursive_doubling", n, p, p, prm) == pytest.approx(lg * (a + n * b + n * g))
    assert predict("rabenseifner", n, p, p, prm) == pytest.approx(2 * lg * a + bandwidth)


def test_ring_bandwidth_term_tends_to_two_n_beta():
    prm, n = simple(alpha=0.0, beta=1e-9, gamma=0.0, k=10_000), 1 << 30
    ratios = [predict("ring", n, p, p, prm) / (2 * n * 1e-9) for p in (2, 10, 100, 10_000)]
    assert ratios == sorted(ratios) and ratios[0] == pytest.approx(0.5) and ratios[-1] == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("p", [2, 3, 16, 100, 4096])
def test_hierarchical_equals_flat_with_one_rank_per_node(preset, p):
    for n in SIZES:
        assert predict("hierarchical", n, p, 1, preset) == pytest.approx(flat(n, p, 1, PRESETS[preset]), rel=1e-12)


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("k", [2, 8, 64, 128])
def test_inside_one_node_hierarchical_is_reduce_bcast_and_never_wins(preset, k):
    prm = PRESETS[preset]
    for n in SIZES:
        hier = predict("hierarchical", n, k, k, prm)
        assert hier == pytest.approx(predict("reduce_bcast", n, k, k, prm), rel=1e-12)
        assert hier >= flat(n, k, k, prm) * (1 - 1e-12)
        # reduce-scatter + allgather inside one node is Rabenseifner (powers of two)
        assert predict("hierarchical_rs", n, k, k, prm) == pytest.approx(predict("rabenseifner", n, k, k, prm))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_monotone_in_size_and_in_ranks(algorithm, preset):
    k = PRESETS[preset].ranks_per_node
    sizes = [2 ** i for i in range(0, 33, 2)]
    for p in (k, 4 * k, 64 * k):
        times = [predict(algorithm, n, p, k, preset) for n in sizes]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:])), (p, times)
    for n in (4096, 1 << 24):  # powers of two: non-powers pay a fold step, so no monotony there
        times = [predict(algorithm, n, k * 2 ** i, k, preset) for i in range(0, 11)]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:])), (n, times)


def test_shared_nics_slow_the_flat_tree_algorithms_down():
    """Rabenseifner's cross-node steps send from every rank of a node at once: one NIC instead of
    eight makes them slower; the leaders' allreduce (one flow per node) does not care."""
    one, eight = (simple(beta=1e-12, gamma=0.0, beta_inter=1e-10, k=8, nics=nics) for nics in (1, 8))
    n, p = 1 << 26, 64
    assert predict("rabenseifner", n, p, 8, one) > 1.5 * predict("rabenseifner", n, p, 8, eight)
    assert predict("hierarchical", n, p, 8, one) == pytest.approx(predict("hierarchical", n, p, 8, eight))


@pytest.mark.parametrize("call, message", [
    (lambda: predict("ring", 1, 0), "predict: `ranks` must be an integer >= 1, got 0"),
    (lambda: predict("ring", 1, 4, 0), "predict: `ranks_per_node` must be an integer >= 1, got 0"),
    (lambda: predict("ring", -1, 4), "predict: `nbytes` must be a finite number >= 0, got -1"),
    (lambda: predict("tree", 1, 4), "predict: `algorithm` must be one of flat, ring"),
    (lambda: predict("ring", 1, 4, None, "nope"), "predict: `params` must be a Params or a preset name"),
    (lambda: simple(alpha=-1.0), "Params: `alpha_intra` must be a finite number >= 0 \\(seconds\\), got -1.0"),
    (lambda: simple(nics=0), "Params: `nics` must be an integer >= 1, got 0"),
])
def test_validation_messages(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def synthetic(algorithm, prm, ranks, noise, seed=0):
    rng = np.random.default_rng(seed)
    return [fitting.Point(p, p, n, t, t, 1) for p in ranks for n in (2 ** i for i in range(6, 27, 2))
            for t in [predict(algorithm, n, p, p, prm) * (1 + noise * rng.standard_normal())]]


def test_fit_recovers_alpha_and_beta_from_noisy_data():
    truth = simple(alpha=5e-6, beta=4e-10, gamma=0.0, k=4, nics=4)
    result = fitting.fit(synthetic("ring", truth, (2, 4), 0.05), algorithm="ring")
    assert result["alpha"] == pytest.approx(5e-6, rel=0.1) and result["beta"] == pytest.approx(4e-10, rel=0.1)
    assert not result["gamma_fitted"] and result["median_abs_err"] < 0.1


def test_fit_picks_the_formula_and_recovers_gamma_where_identifiable():
    truth = simple(alpha=3e-6, beta=5e-10, gamma=2e-10, k=4, nics=4)
    points = synthetic("recursive_doubling", truth, (2, 3, 4), 0.02, seed=1)
    result = fitting.fit(points)
    assert result["algorithm"] == "recursive_doubling" and result["gamma_fitted"]
    assert (result["alpha"], result["beta"], result["gamma"]) == pytest.approx((3e-6, 5e-10, 2e-10), rel=0.15)
    ring_only = fitting._columns("ring", points) / np.array([pt.raw for pt in points])[:, None]
    assert not fitting.identifiable(ring_only)  # ring charges β and γ 2:1 at every p


def test_fit_load_names_a_bad_fake_node_size(tmp_path):
    path = tmp_path / "s.json"
    path.write_text("[]")
    with pytest.raises(ValueError, match="fit.load: .*the part after @ must be ranks per fake node >= 1, got 'x'"):
        fitting.load([f"{path}@x"])


@pytest.mark.skipif(not list(DATA.glob("sweep-n2-*.json")), reason="no measured data in docs/data")
def test_fit_cli_on_the_measured_data_in_docs(capsys):
    train = sorted(str(p) for p in DATA.glob("sweep-n2-*.json"))
    test = [f"{p}@2" for p in sorted(DATA.glob("sweep-n4-ls2-*.json"))]
    assert costmodel_main(["fit", *train, "--test", *test, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"]["alpha_intra"] > 0 and out["params"]["beta_intra"] > 0
    assert {"train_raw", "test_raw", "test_mpidist"} <= set(out["summary"])
    assert all(row["mpidist_algorithm"] == "hierarchical" for row in out["test"])


def test_cli_json_has_rows_and_crossover(capsys):
    assert simulate.main(["--preset", "gpu-nvlink-200g,cpu-ib-hdr", "--ranks", "8,64,512", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["preset"] for r in out] == ["gpu-nvlink-200g", "cpu-ib-hdr"]
    gpu = out[0]
    assert len(gpu["rows"]) == 3 * len(simulate.SIZES)
    crossing = {(c["ranks"], c["algorithm"], c["against"]): c for c in gpu["crossover"]}
    assert crossing[8, "hierarchical", "flat"]["crossover_bytes"] is None  # one node: never
    assert crossing[512, "hierarchical", "flat"]["crossover_bytes"] > 0
    assert crossing[512, "hierarchical", "flat"]["max_ratio"] > 1


def test_cli_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "m.png"
    assert simulate.main(["--preset", "this-vm", "--ranks", "2,8", "--sizes", "4KB,1MB", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG" and "this-vm" in capsys.readouterr().out


def test_cli_runs_as_a_subprocess_in_seconds():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.costmodel", "--json"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 30
    out = json.loads(proc.stdout)
    assert out[0]["preset"] == "dgx-h100" and out[0]["crossover"]
