"""``python -m tools.costmodel``: predicted allreduce times from the cost model, 1 to 10 000 ranks.

Serial (no MPI needed; under mpirun only rank 0 prints). For each preset: a table of ranks × size →
flat (the best of the MPI library's algorithms), ring, mpidist's hierarchical and the reduce-scatter
variant, with ratios, and where hierarchical beats flat (sizes on a 2^(1/4) grid from 1 B to 4 GB).
``--plot FILE.png`` draws time and ratio against size. ``python -m tools.costmodel fit …`` fits
the model to measured sweeps (see ``fit.py``). The model: ``model.py``; presets: ``presets.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import replace

from mpidist.bench.timing import parse_size

from .chief import is_chief
from .model import FLAT_CANDIDATES, PRESETS, Params, predict, resolve

NODES = (1, 2, 4, 16, 64, 256, 1024)
SIZES = tuple(4096 * 8 ** i for i in range(7))  # 4 KB ... 1 GB
COMPARISONS = (("hierarchical", "flat"), ("hierarchical_rs", "flat"), ("hierarchical", "ring"))
PLOT_SIZES = tuple(1 << i for i in range(10, 31))  # 1 KB ... 1 GB
GRID = tuple(2 ** (i / 4) for i in range(0, 129))  # 1 B ... 4 GB


def default_ranks(ranks_per_node: int, limit: int = 10_000) -> list[int]:
    return [ranks_per_node * n for n in NODES if ranks_per_node * n <= limit] or [limit]


def _flat(nbytes: float, ranks: int, k: int, prm: Params) -> tuple[float, str]:
    return min((predict(alg, nbytes, ranks, k, prm), alg) for alg in FLAT_CANDIDATES)


def sweep(params: Params | str, ranks: list[int] | None = None, sizes: list[int] | None = None,
          ranks_per_node: int | None = None) -> list[dict]:
    """One row per (ranks, size): predicted seconds of flat (and which algorithm), ring,
    hierarchical and hierarchical_rs, and the ratios flat / hierarchical (> 1: hierarchical wins)."""
    prm = resolve(params, "sweep")
    k = ranks_per_node or prm.ranks_per_node
    rows = []
    for p in ranks or default_ranks(k):
        for n in sizes or SIZES:
            flat, alg = _flat(n, p, k, prm)
            hier = predict("hierarchical", n, p, k, prm)
            hier_rs = predict("hierarchical_rs", n, p, k, prm)
            rows.append({"ranks": p, "nodes": -(-p // min(k, p)), "bytes": n, "flat_s": flat,
                         "flat_algorithm": alg, "ring_s": predict("ring", n, p, k, prm),
                         "hierarchical_s": hier, "hierarchical_rs_s": hier_rs,
                         "ratio": flat / hier if hier else 1.0, "ratio_rs": flat / hier_rs if hier_rs else 1.0})
    return rows


def wins(params: Params | str, ranks: int, ranks_per_node: int | None = None,
         algorithm: str = "hierarchical", against: str = "flat") -> dict:
    """Where `algorithm` beats `against` ("flat": the best flat algorithm, or one of them, e.g. "ring")
    at `ranks`: size ranges on GRID, the crossover (the smallest size from which it is faster) and the
    largest win factor (time of `against` / time of `algorithm`)."""
    prm = resolve(params, "wins")
    if against != "flat" and against not in FLAT_CANDIDATES:
        raise ValueError(f"wins: `against` must be flat or one of {', '.join(FLAT_CANDIDATES)}, got {against!r}")
    k = ranks_per_node or prm.ranks_per_node
    ranges: list[list[float]] = []
    best, best_at, last_win = 1.0, None, False
    for n in GRID:
        flat = _flat(n, ranks, k, prm)[0] if against == "flat" else predict(against, n, ranks, k, prm)
        other = predict(algorithm, n, ranks, k, prm)
        win = other < flat * (1 - 1e-9)
        if win and not last_win:
            ranges.append([n, n])
        if win:
            ranges[-1][1] = n
            if flat / other > best:
                best, best_at = flat / other, n
        last_win = win
    return {"ranks": ranks, "nodes": -(-ranks // min(k, ranks)), "algorithm": algorithm, "against": against,
            "ranges_bytes": ranges, "crossover_bytes": ranges[0][0] if ranges else None,
            "max_ratio": best, "max_ratio_bytes": best_at}


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B"


def _time(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e6:.3g} µs"


def _ranges(w: dict) -> str:
    if not w["ranges_bytes"]:
        return "never"
    spans = ", ".join(f"{_size(a)}–{_size(b)}" for a, b in w["ranges_bytes"])
    return f"{spans} (best {w['max_ratio']:.2f}× at {_size(w['max_ratio_bytes'])})"


def table(prm: Params, rows: list[dict], crossings: list[dict]) -> str:
    lines = [prm.summary(), f"  {prm.description}",
             f"{'ranks':>6}{'nodes':>6}{'size':>9}  {'flat':>9} {'(algorithm)':<20}{'ring':>9}"
             f"{'hier':>9}{'hier-rs':>9}{'flat/hier':>10}{'flat/rs':>9}"]
    for r in rows:
        lines.append(f"{r['ranks']:>6}{r['nodes']:>6}{_size(r['bytes']):>9}  {_time(r['flat_s']):>9} "
                     f"{'(' + r['flat_algorithm'] + ')':<20}{_time(r['ring_s']):>9}{_time(r['hierarchical_s']):>9}"
                     f"{_time(r['hierarchical_rs_s']):>9}{r['ratio']:>10.2f}{r['ratio_rs']:>9.2f}")
    lines.append("where the hierarchical variants win (sizes 1 B – 4 GB, best win factor):")
    by_ranks: dict[int, dict[tuple[str, str], dict]] = {}
    for w in crossings:
        by_ranks.setdefault(w["ranks"], {})[w["algorithm"], w["against"]] = w
    for p, ws in by_ranks.items():
        nodes = ws["hierarchical", "flat"]["nodes"]
        lines.append(f"  {p:>6} ranks, {nodes:>5} nodes: hier vs flat {_ranges(ws['hierarchical', 'flat'])}; "
                     f"hier-rs vs flat {_ranges(ws['hierarchical_rs', 'flat'])}; "
                     f"hier vs ring {_ranges(ws['hierarchical', 'ring'])}")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, ScalarFormatter

    ticks = [1 << 10, 1 << 15, 1 << 20, 1 << 25, 1 << 30]
    fig, axes = plt.subplots(len(results), 2, figsize=(11, 3.6 * len(results)), squeeze=False)
    for (ax_t, ax_r), res in zip(axes, results):
        prm = res["params_obj"]
        ranks = sorted({r["ranks"] for r in res["rows"]})
        rows = sweep(prm, ranks, list(PLOT_SIZES), res["ranks_per_node"])  # finer than the table
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, p in enumerate(ranks):
            mine = [r for r in rows if r["ranks"] == p]
            x, c = [r["bytes"] for r in mine], colors[i % len(colors)]
            ax_t.plot(x, [r["flat_s"] for r in mine], "-", color=c, label=f"{p} ranks")
            ax_t.plot(x, [r["hierarchical_s"] for r in mine], "--", color=c)
            ax_r.plot(x, [r["ratio"] for r in mine], "-", color=c, label=f"{p} ranks: hier")
            ax_r.plot(x, [r["ratio_rs"] for r in mine], ":", color=c)
        ax_r.axhline(1.0, color="grey", lw=0.8)
        for ax in (ax_t, ax_r):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _size(x)))
            ax.set_xlabel("bytes per rank")
            ax.grid(True, which="major", lw=0.3)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("predicted time (s)")
        ax_t.set_title(f"{prm.name}: flat (solid) vs hierarchical (dashed)", fontsize=9)
        ax_r.set_yscale("log", base=2)
        ax_r.yaxis.set_major_locator(FixedLocator([0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0]))
        ax_r.yaxis.set_major_formatter(ScalarFormatter())
        ax_r.yaxis.set_minor_locator(FixedLocator([]))
        ax_r.set_ylabel("flat time / hierarchical time")
        ax_r.set_title("> 1: hierarchical faster (solid: hier, dotted: hier-rs)", fontsize=9)
        ax_t.legend(fontsize=7)
    fig.suptitle("mpidist cost model (alpha-beta-gamma): predictions, not measurements", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _int_list(text: str, option: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        parser.error(f"{option} must be comma-separated integers >= 1, got {text!r}")
    return values


def _overrides(items: list[str]) -> dict:
    """``NAME=VALUE`` pairs for Params fields: integers for counts, floats for α, β, γ."""
    fields = {f.name: f for f in dataclasses.fields(Params)}
    out: dict = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in fields or name in ("name", "description", "sources") or not value:
            raise ValueError(f"--set: expected NAME=VALUE with NAME among "
                             f"{', '.join(f for f in fields if f not in ('name', 'description', 'sources'))}, "
                             f"got {item!r}")
        try:
            out[name] = int(value) if name in ("ranks_per_node", "nics") else float(value)
        except ValueError:
            raise ValueError(f"--set: {name} must be a number, got {value!r}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.costmodel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="dgx-h100", help=f"comma-separated among {', '.join(PRESETS)}")
    parser.add_argument("--ranks", default="", help="comma-separated rank counts (default: 1-1024 nodes, <= 10000)")
    parser.add_argument("--ranks-per-node", type=int, default=0, help="override the preset's ranks per node")
    parser.add_argument("--sizes", default="", help="comma-separated sizes, e.g. 4KB,1MB (default 4 KB-1 GB, x8)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", default="", help="write time and ratio curves to this PNG")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a parameter of every chosen preset, in SI units (e.g. alpha_intra=0.5e-6)")
    parser.add_argument("--list", action="store_true", help="list the presets with their parameters and sources")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.preset.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names or args.ranks_per_node < 0:
        parser.error(f"--preset must be among {', '.join(PRESETS)} (got {unknown or names}); --ranks-per-node >= 0")
    if args.list:
        if is_chief():
            print("\n".join(f"{p.summary()}\n  {p.description}\n" + "\n".join(f"  - {s}" for s in p.sources)
                            for p in PRESETS.values()), flush=True)
        return 0
    ranks = _int_list(args.ranks, "--ranks", parser) if args.ranks else None
    sizes = None
    if args.sizes:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    try:
        overrides = _overrides(args.set)
    except ValueError as exc:
        parser.error(str(exc))
    results = []
    for name in names:
        try:
            prm = replace(PRESETS[name], **overrides)
        except ValueError as exc:
            parser.error(str(exc))
        k = args.ranks_per_node or prm.ranks_per_node
        rows = sweep(prm, ranks, sizes, k)
        crossings = [wins(prm, p, k, alg, against) for p in sorted({r["ranks"] for r in rows})
                     for alg, against in COMPARISONS]
        results.append({"preset": name, "ranks_per_node": k, "params": prm.to_dict(), "params_obj": prm,
                        "rows": rows, "crossover": crossings})
    if not is_chief():
        return 0
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "params_obj"} for r in results], indent=1), flush=True)
    else:
        head = ("tools.costmodel: predicted allreduce time per call (alpha-beta-gamma model, not a measurement;\n"
                "flat = best of ring, recursive doubling, Rabenseifner, reduce+bcast; hier = mpidist's hierarchical\n"
                "(reduce in node, leaders' allreduce, broadcast); hier-rs = reduce-scatter in node, per-shard\n"
                "allreduce across nodes, allgather; ratios > 1 mean the hierarchical variant is faster)")
        print("\n\n".join([head] + [table(r["params_obj"], r["rows"], r["crossover"]) for r in results]), flush=True)
    if args.plot:
        plot(results, args.plot)
    return 0
