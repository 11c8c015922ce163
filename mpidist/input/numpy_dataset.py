"""In-memory datasets of NumPy arrays: what ``experimental_make_numpy_dataset`` returns.

``NumpyDataset(nest)`` holds examples along axis 0 of every leaf (all leaves the same length);
``.batch(global_batch_size, drop_remainder=False)`` gives an iterable of global batches (views,
no copies), the last one smaller unless ``drop_remainder``. ``.shuffle(seed)`` permutes the
examples the same way on every rank (same seed, same order).
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..collectives import nest
from ..validation import check_int_at_least


class NumpyDataset:
    def __init__(self, numpy_input: Any, _order: np.ndarray | None = None) -> None:
        leaves, tree = nest.flatten(numpy_input)
        arrays = [np.asarray(leaf) for leaf in leaves]
        if not arrays or any(a.ndim == 0 for a in arrays):
            raise ValueError("NumpyDataset: `numpy_input` must be an array or a nest of arrays with examples "
                             "along axis 0")
        lengths = {a.shape[0] for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"NumpyDataset: every array must hold the same number of examples along axis 0, "
                             f"got lengths {sorted(lengths)}")
        self._arrays, self._tree, self._order = arrays, tree, _order
        self.num_examples = lengths.pop()

    def shuffle(self, seed: int) -> NumpyDataset:
        """The same examples in an order fixed by ``seed`` (equal on every rank)."""
        order = np.random.default_rng(seed).permutation(self.num_examples)
        return NumpyDataset(nest.unflatten(self._tree, self._arrays), order)

    def batch(self, global_batch_size: int, drop_remainder: bool = False) -> BatchedNumpyDataset:
        global_batch_size = check_int_at_least(global_batch_size, "NumpyDataset.batch", "global_batch_size", 1)
        return BatchedNumpyDataset(self, global_batch_size, drop_remainder)

    def examples(self, start: int, stop: int) -> Any:
        """Examples ``start:stop`` (in the shuffled order, if shuffled) as the input's structure."""
        if self._order is None:
            return nest.unflatten(self._tree, [a[start:stop] for a in self._arrays])
        idx = self._order[start:stop]
        return nest.unflatten(self._tree, [a[idx] for a in self._arrays])

    def __len__(self) -> int:
        return self.num_examples


class BatchedNumpyDataset:
    """Global batches of a NumpyDataset."""

    def __init__(self, data: NumpyDataset, global_batch_size: int, drop_remainder: bool) -> None:
        self.data, self.global_batch_size, self.drop_remainder = data, global_batch_size, drop_remainder

    def __len__(self) -> int:
        n, b = self.data.num_examples, self.global_batch_size
        return n // b if self.drop_remainder else -(-n // b)

    def __iter__(self) -> Iterator[Any]:
        b = self.global_batch_size
        for i in range(len(self)):
            yield self.data.examples(i * b, min((i + 1) * b, self.data.num_examples))
