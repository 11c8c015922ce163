"""An MPI simulation that trains a surrogate model in situ, on a sub-communicator, while it runs.

    mpirun -n 4 python examples/heat_surrogate.py [--cells 400] [--steps 2000]

The simulation: the 1-D heat equation u_t = alpha * u_xx on [0, 1], explicit finite differences,
the domain split into one block per rank, ghost cells exchanged with neighbours (Sendrecv on the
simulation's own communicator) every step.

The surrogate: the ranks of a sub-communicator (the first half of the job) learn, from the states
the simulation produces, a linear model of one time step, u_new[i] = w . (u[i-1], u[i], u[i+1]) + b:
every training step reduces the least-squares statistics (X^T X, X^T y) of each rank's block across
the trainers with ``mpidist.MultiWorkerMirroredStrategy(comm=sub)`` and re-solves the model. mpidist works on a
clone of ``sub``, so its collectives never mix with the simulation's halo messages. The exact
answer is w = (r, 1 - 2r, r), b = 0 with r = alpha * dt / dx^2: the chief prints both.
"""
from __future__ import annotations

import argparse
import logging

import numpy as np
from mpi4py import MPI

import mpidist


def halo_exchange(comm: MPI.Intracomm, u: np.ndarray) -> None:
    """Fill u[0] and u[-1] (ghost cells) from the neighbours; fixed u = 0 at the domain ends."""
    rank, size = comm.Get_rank(), comm.Get_size()
    left = rank - 1 if rank > 0 else MPI.PROC_NULL
    right = rank + 1 if rank < size - 1 else MPI.PROC_NULL
    comm.Sendrecv(u[1:2], dest=left, sendtag=0, recvbuf=u[-1:], source=right, recvtag=0)
    comm.Sendrecv(u[-2:-1], dest=right, sendtag=1, recvbuf=u[0:1], source=left, recvtag=1)
    if left == MPI.PROC_NULL:
        u[0] = 0.0
    if right == MPI.PROC_NULL:
        u[-1] = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=400, help="grid cells in all")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--train-every", type=int, default=5, help="simulation steps between training steps")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("example")

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    n_local = args.cells // size
    dx, alpha = 1.0 / args.cells, 1.0
    dt = 0.4 * dx * dx / alpha
    r = alpha * dt / dx ** 2
    x = (rank * n_local + np.arange(n_local) + 0.5) * dx
    u = np.zeros(n_local + 2)
    # a rough start, so the stencil is learnable; drawn for the whole grid: the same run at any -n
    rough = np.random.default_rng(0).normal(size=n_local * size)[rank * n_local:(rank + 1) * n_local]
    u[1:-1] = np.sin(np.pi * x) + 0.5 * rough

    trainers = max(1, size // 2)
    sub = world.Split(0 if rank < trainers else MPI.UNDEFINED, rank)
    strategy = mpidist.MultiWorkerMirroredStrategy(comm=sub) if sub != MPI.COMM_NULL else None
    params = {"w": np.zeros(3), "b": np.zeros(())}
    stats = {"xtx": np.zeros((4, 4)), "xty": np.zeros(4)}

    def train_step(features: np.ndarray, target: np.ndarray) -> float:
        design = np.hstack([features, np.ones((len(features), 1))])
        err = features @ params["w"] + params["b"] - target
        local = {"xtx": design.T @ design, "xty": design.T @ target, "sse": np.sum(err ** 2),
                 "n": np.array(float(len(err)))}
        total = mpidist.get_replica_context().all_reduce("sum", local)  # one collective for the nest
        stats["xtx"] += total["xtx"]
        stats["xty"] += total["xty"]
        solution = np.linalg.lstsq(stats["xtx"], stats["xty"], rcond=None)[0]
        params["w"], params["b"] = solution[:3], solution[3]
        return float(total["sse"] / total["n"])  # error of the model before this step's data

    loss = float("nan")
    for step in range(args.steps):
        halo_exchange(world, u)
        new = u[1:-1] + r * (u[:-2] - 2 * u[1:-1] + u[2:])
        if strategy is not None and step % args.train_every == 0:
            scale = float(np.max(np.abs(u))) or 1.0
            features = np.stack([u[:-2], u[1:-1], u[2:]], axis=1) / scale
            loss = strategy.run(train_step, args=(features, new / scale))
        u[1:-1] = new

    energy = world.allreduce(float(np.sum(u[1:-1] ** 2) * dx))
    if rank == 0:
        log.info("simulation: %d ranks, %d cells, %d steps, energy %.6g", size, n_local * size, args.steps, energy)
        error = float(np.max(np.abs(np.append(params["w"] - [r, 1 - 2 * r, r], params["b"]))))
        log.info("surrogate trained on %d rank(s): w = %s, b = %.2g (exact w = [%.3f %.3f %.3f], b = 0); "
                 "max error %.2g; last loss %.3g", trainers, np.array2string(params["w"], precision=3),
                 float(params["b"]), r, 1 - 2 * r, r, error, loss)
    if sub != MPI.COMM_NULL:
        sub.Free()


if __name__ == "__main__":
    main()
