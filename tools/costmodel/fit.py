"""Fit α, β (and γ where the data can tell it) of the cost model to measured allreduce times.

Input: JSON written by ``python -m tools.sweep --collectives allreduce --json`` (one file per
run; a file name may end in ``@K`` when the run had fake nodes of K ranks, ``MPIDIST_LOCAL_SIZE=K``,
and ``MPIDIST_ALGORITHM=hierarchical``). Points of equal (ranks, K, size) are combined over runs
by their median (default) or minimum. The raw column (the MPI library's own Allreduce) is fitted
with one algorithm's formula:
on one machine every link is shared memory, so α_intra = α_inter = α and β likewise, and the time is
linear in (α, β, γ); each column comes from ``model.predict`` with unit parameters. Least squares on
relative errors (times span four decades), coefficients kept >= 0. γ is identifiable only when its
column is not proportional to β's (ring and Rabenseifner charge them 2:1 at every p), so by default it
is fitted only when identifiable and otherwise fixed at 0 (β then absorbs it).

mpidist's own column is predicted as the model's time plus a constant per-call engine overhead: the
median of (mpidist - raw) over the training points up to 64 KB.
"""
from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .chief import is_chief
from .model import predict
from .presets import PRESETS, Params

_log = logging.getLogger("mpidist")
FIT_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner")


@dataclass(frozen=True)
class Point:
    """One measured size, combined over runs; seconds."""

    ranks: int
    ranks_per_node: int
    nbytes: int
    raw: float
    mpidist: float
    runs: int


def load(specs: list[str], combine: str = "median") -> list[Point]:
    """Points from sweep JSON files (``PATH`` or ``PATH@K``), combined over files of equal shape by
    their median, or by their minimum (the least disturbed run: interference only adds time)."""
    if combine not in ("median", "min"):
        raise ValueError(f"fit.load: `combine` must be median or min, got {combine!r}")
    pick = statistics.median if combine == "median" else min
    samples: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for spec in specs:
        path, _, local = spec.partition("@")
        if local and not (local.isdigit() and int(local) >= 1):
            raise ValueError(f"fit.load: `{spec}`: the part after @ must be ranks per fake node >= 1, got {local!r}")
        with open(path, encoding="utf-8") as handle:
            rows = json.load(handle)
        if not isinstance(rows, list):
            raise ValueError(f"fit.load: `{path}` must hold the list that `python -m tools.sweep --json` prints, "
                             f"got {type(rows).__name__}")
        for row in rows:
            if row.get("collective") != "allreduce":
                continue
            p = int(row["ranks"])
            k = min(p, int(local)) if local else p
            key = (p, k, int(row["bytes"]))
            samples.setdefault(key, []).append((row["raw"]["time_us"] * 1e-6, row["mpidist"]["time_us"] * 1e-6))
    if not samples:
        raise ValueError(f"fit.load: no allreduce rows in {specs}")
    return [Point(p, k, n, pick([r for r, _ in s]), pick([m for _, m in s]), len(s))
            for (p, k, n), s in sorted(samples.items())]


def _unit(alpha: float, beta: float, gamma: float, nics: int) -> Params:
    return Params("fit", 1, alpha, beta, alpha, beta, nics, gamma)


def _columns(algorithm: str, points: list[Point]) -> np.ndarray:
    nics = max(pt.ranks for pt in points)  # links never shared on one machine: keep the model linear
    units = (_unit(1, 0, 0, nics), _unit(0, 1, 0, nics), _unit(0, 0, 1, nics))
    return np.array([[predict(algorithm, pt.nbytes, pt.ranks, pt.ranks, u) for u in units] for pt in points])


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0, by dropping negative coefficients (few unknowns)."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        sol = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        if (sol >= 0).all():
            x[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return x


def identifiable(cols: np.ndarray) -> bool:
    """Whether β and γ columns differ in shape (relative weights), so both can be fitted."""
    b, g = cols[:, 1], cols[:, 2]
    if not g.any():
        return False
    cos = float(b @ g / (np.linalg.norm(b) * np.linalg.norm(g)))
    return cos < 0.9999


def measure_gamma(nbytes: int = 8 << 20, repeats: int = 15) -> float:
    """Seconds per byte of a float32 sum on this machine (np.add, out of cache): median of repeats."""
    a, b = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
    out = np.empty_like(a)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.add(a, b, out=out)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / nbytes


def fit(points: list[Point], algorithm: str | None = None, gamma: float | None = None,
        name: str = "this-vm") -> dict:
    """Fit the raw MPI times. `algorithm`: one of FIT_ALGORITHMS, None = the best-fitting one;
    `gamma`: fixed s/B, or None = fitted where identifiable, else 0. Returns params and diagnostics."""
    if algorithm is not None and algorithm not in FIT_ALGORITHMS:
        raise ValueError(f"fit: `algorithm` must be None or one of {', '.join(FIT_ALGORITHMS)}, got {algorithm!r}")
    if gamma is not None and not gamma >= 0:
        raise ValueError(f"fit: `gamma` must be None or seconds per byte >= 0, got {gamma!r}")
    if len(points) < 3:
        raise ValueError(f"fit: `points` must hold at least 3 measured sizes, got {len(points)}")
    t = np.array([pt.raw for pt in points])
    best: dict[str, Any] | None = None
    for alg in (algorithm,) if algorithm else FIT_ALGORITHMS:
        cols = _columns(alg, points)
        w = cols / t[:, None]
        with_gamma = gamma is None and identifiable(w)
        fixed = 0.0 if gamma is None else gamma
        x = np.zeros(3)
        if with_gamma:
            x = _nnls(w, np.ones_like(t))
        else:
            x[:2] = _nnls(w[:, :2], 1 - fixed * cols[:, 2] / t)
            x[2] = fixed
        err = (cols @ x - t) / t
        result = {"algorithm": alg, "alpha": float(x[0]), "beta": float(x[1]), "gamma": float(x[2]),
                  "gamma_fitted": with_gamma, "median_abs_err": float(np.median(np.abs(err))),
                  "rms_err": float(np.sqrt(np.mean(err ** 2)))}
        _log.debug("fit %s: %s", alg, result)
        if best is None or result["median_abs_err"] < best["median_abs_err"]:
            best = result
    if best is None:
        raise ValueError(f"fit: no algorithm to fit (got {algorithm!r})")
    small = [pt.mpidist - pt.raw for pt in points if pt.nbytes <= 64 << 10]
    best["overhead"] = max(0.0, statistics.median(small)) if small else 0.0
    base = PRESETS["this-vm"]
    best["params"] = replace(base, name=name, alpha_intra=best["alpha"], alpha_inter=best["alpha"],
                             beta_intra=best["beta"], beta_inter=best["beta"], gamma=best["gamma"],
                             sources=(f"fit of {len(points)} points, formula: {best['algorithm']}",))
    return best


def evaluate(result: dict, points: list[Point], cores: int | None = None) -> list[dict]:
    """Measured against predicted for each point: raw (the fitted formula) and mpidist (hierarchical
    when the point has fake nodes, else the same formula; plus the fitted engine overhead). With
    `cores`, a crude oversubscription correction: predictions × max(1, ranks / cores)."""
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ValueError(f"evaluate: `cores` must be None or an integer >= 1, got {cores!r}")
    prm, alg, over = result["params"], result["algorithm"], result["overhead"]
    rows = []
    for pt in points:
        slow = max(1.0, pt.ranks / cores) if cores else 1.0
        raw = predict(alg, pt.nbytes, pt.ranks, pt.ranks, prm) * slow
        ours_alg = "hierarchical" if pt.ranks_per_node < pt.ranks else alg
        ours = (predict(ours_alg, pt.nbytes, pt.ranks, pt.ranks_per_node, prm) + over) * slow
        rows.append({"ranks": pt.ranks, "ranks_per_node": pt.ranks_per_node, "bytes": pt.nbytes,
                     "runs": pt.runs, "raw_s": pt.raw, "raw_model_s": raw, "raw_err": raw / pt.raw - 1,
                     "mpidist_algorithm": ours_alg, "mpidist_s": pt.mpidist, "mpidist_model_s": ours,
                     "mpidist_err": ours / pt.mpidist - 1})
    return rows


def summary(rows: list[dict], column: str) -> dict:
    """Median and largest |error| of one column ("raw" or "mpidist"), and the share within ±30%."""
    errs = [abs(r[f"{column}_err"]) for r in rows]
    return {"points": len(errs), "median_abs_err": statistics.median(errs), "max_abs_err": max(errs),
            "within_30pct": sum(e <= 0.3 for e in errs) / len(errs)}


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def table(result: dict, train: list[dict], test: list[dict]) -> str:
    prm = result["params"]
    lines = [f"fit ({result['algorithm']} formula, least squares on relative error): "
             f"α = {prm.alpha_intra * 1e6:.3g} µs, β = {prm.beta_intra * 1e9:.3g} ns/B "
             f"({1 / prm.beta_intra / 1e9 if prm.beta_intra else float('inf'):.3g} GB/s), "
             f"γ = {prm.gamma * 1e9:.3g} ns/B ({'fitted' if result['gamma_fitted'] else 'fixed'}); "
             f"engine overhead {result['overhead'] * 1e6:.1f} µs per call",
             f"{'set':<6}{'ranks':>6}{'k':>4}{'bytes':>11}   {'raw us':>9}{'model':>9}{'err':>7}   "
             f"{'mpidist us':>10}{'model':>9}{'err':>7}  (model of mpidist)"]
    for label, rows in (("train", train), ("test", test)):
        for r in rows:
            lines.append(f"{label:<6}{r['ranks']:>6}{r['ranks_per_node']:>4}{r['bytes']:>11}   "
                         f"{r['raw_s'] * 1e6:>9.1f}{r['raw_model_s'] * 1e6:>9.1f}{_pct(r['raw_err']):>7}   "
                         f"{r['mpidist_s'] * 1e6:>10.1f}{r['mpidist_model_s'] * 1e6:>9.1f}"
                         f"{_pct(r['mpidist_err']):>7}  ({r['mpidist_algorithm']})")
    for label, rows in (("train", train), ("test", test)):
        for column in ("raw", "mpidist") if rows else ():
            s = summary(rows, column)
            lines.append(f"{label} {column:<8}: median |error| {s['median_abs_err'] * 100:.0f}%, "
                         f"largest {s['max_abs_err'] * 100:.0f}%, {s['within_30pct'] * 100:.0f}% of "
                         f"{s['points']} points within ±30%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.costmodel fit",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("train", nargs="+", help="sweep JSON files to fit (PATH or PATH@K: fake nodes of K)")
    parser.add_argument("--test", nargs="*", default=[], help="held-out sweep JSON files to predict")
    parser.add_argument("--algorithm", choices=FIT_ALGORITHMS, default=None,
                        help="formula to fit (default: the one that fits best)")
    parser.add_argument("--gamma", default="auto",
                        help="auto (fit where identifiable, else 0), measure (time np.add here), "
                             "or seconds per byte")
    parser.add_argument("--combine", choices=("median", "min"), default="median",
                        help="how repeated runs of one point combine (default median; min: least disturbed)")
    parser.add_argument("--cores", type=int, default=0,
                        help="crude oversubscription correction of predictions: × ranks / cores (0: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.cores < 0:
        parser.error(f"--cores must be >= 0, got {args.cores}")
    if args.gamma == "auto":
        gamma = None
    elif args.gamma == "measure":
        gamma = measure_gamma()
    else:
        try:
            gamma = float(args.gamma)
        except ValueError:
            parser.error(f"--gamma must be auto, measure or seconds per byte, got {args.gamma!r}")
    train_points = load(args.train, args.combine)
    result = fit(train_points, args.algorithm, gamma)
    cores = args.cores or None
    train = evaluate(result, train_points, cores)
    test = evaluate(result, load(args.test, args.combine), cores) if args.test else []
    if is_chief():
        if args.json:
            out = {k: v for k, v in result.items() if k != "params"}
            out["params"] = result["params"].to_dict()
            out.update(train=train, test=test, summary={
                f"{label}_{col}": summary(rows, col) for label, rows in (("train", train), ("test", test))
                if rows for col in ("raw", "mpidist")})
            print(json.dumps(out, indent=1), flush=True)
        else:
            print(table(result, train, test), flush=True)
    return 0
