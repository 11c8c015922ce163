"""Alpha-beta-gamma cost model of allreduce algorithms: scaling beyond this machine on paper.

The formulas, their sources and what they ignore live in mpidist itself
(``mpidist/collectives/algorithms/cost.py``), since the engine's automatic algorithm choice uses
them too; this module adds the presets and checked arguments (:func:`predict`).
"""
from __future__ import annotations

import math
import numbers

from mpidist.collectives.algorithms.cost import ALGORITHMS, FLAT_CANDIDATES, seconds

from .presets import PRESETS, Params

__all__ = ["ALGORITHMS", "FLAT_CANDIDATES", "Params", "PRESETS", "predict", "resolve"]


def resolve(params: Params | str, caller: str = "predict") -> Params:
    """A Params object, or the preset of that name."""
    if isinstance(params, Params):
        return params
    if isinstance(params, str) and params in PRESETS:
        return PRESETS[params]
    raise ValueError(f"{caller}: `params` must be a Params or a preset name among "
                     f"{', '.join(PRESETS)}, got {params!r}")


def _int_arg(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"predict: `{name}` must be an integer >= {low}, got {value!r}")
    return int(value)


def predict(algorithm: str, nbytes: float, ranks: int, ranks_per_node: int | None = None,
            params: Params | str = "this-vm") -> float:
    """Predicted seconds of one allreduce of `nbytes` per rank on `ranks` ranks, `ranks_per_node`
    (default: the preset's) per node, by `algorithm` (one of ``ALGORITHMS``)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"predict: `algorithm` must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not nbytes >= 0 \
            or math.isinf(nbytes):
        raise ValueError(f"predict: `nbytes` must be a finite number >= 0, got {nbytes!r}")
    p = _int_arg("ranks", ranks, 1)
    prm = resolve(params)
    k = min(p, prm.ranks_per_node if ranks_per_node is None else _int_arg("ranks_per_node", ranks_per_node, 1))
    return seconds(algorithm, prm, p, k, float(nbytes))
