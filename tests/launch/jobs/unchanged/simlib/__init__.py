"""A scientific library's trainer, written as such libraries write it (physics-informed and
interatomic-potential fitters): it uses Horovod itself when it sees an MPI launch, and trains in a
tf.compat.v1 graph and Session with Horovod's DistributedOptimizer. Its users never see the
Horovod import. Untouched by mpidist: `mpidist run` makes `horovod` resolve."""
from .fit import fit, rank, size

__all__ = ["fit", "rank", "size"]
