"""reduce: the root gets the reduction of all ranks' values; other ranks get ``None``."""
from __future__ import annotations

import numpy as np

from .allreduce import reduce_packs, signature  # same agreement fields: dtypes and full shapes
from .ops import Op

__all__ = ["signature", "validate", "run"]

validate = None  # nothing to check beyond what every collective checks


def run(ctx, arrays: list[np.ndarray], op: Op, root: int) -> list[np.ndarray] | None:
    is_root = ctx.topo.rank == root
    results = reduce_packs(ctx, arrays, op, lambda algorithm, send, recv, mop:
                           algorithm.reduce(ctx, send, recv, mop, root), keep=is_root)
    return results if is_root else None
