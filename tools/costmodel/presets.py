"""Link parameters of the cost model (``model.py``) and named presets for typical clusters; per preset
the inputs of a training step's prediction (:class:`Workload`, step.py).

Units: seconds and bytes. α (``alpha_*``) in seconds per message, β (``beta_*``) in seconds per byte
(1 / bandwidth), γ in seconds per byte reduced. Bandwidths are nominal line rates per direction
unless a source says otherwise, so predicted times are lower bounds for those links. Where a figure
is an assumption rather than a datasheet number, its source says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpidist.collectives.algorithms.cost import GB, Params, gbit, gbyte

_H100_NVLINK = ("NVLink 4 on H100 SXM: 900 GB/s bidirectional per GPU = 450 GB/s per direction "
                "(NVIDIA H100 datasheet); nccl-tests all_reduce busbw on 8 GPUs is ~360-480 GB/s")
_NVLINK_ALPHA = "α_intra 2 µs: assumption, order of NCCL/CUDA-IPC per-hop latency on NVLink"
_GDR_ALPHA = "α_inter 3 µs: assumption, GPUDirect RDMA over InfiniBand small-message latency (2-5 µs)"
_HBM_GAMMA = "γ 1 ps/B: H100 HBM3 3.35 TB/s, 3 bytes moved per byte reduced (negligible)"


def _gpu(name: str, nics: int, nic_gbit: float, description: str, nic_source: str) -> Params:
    return Params(name, 8, 2e-6, gbyte(450), 3e-6, gbit(nic_gbit), nics, 1e-12, None, description,
                  (_H100_NVLINK, _NVLINK_ALPHA, nic_source, _GDR_ALPHA, _HBM_GAMMA))


def _cpu(name: str, ranks: int, mem_gbs: float, nic_gbit: float, alpha_inter: float,
         description: str, sources: tuple[str, ...]) -> Params:
    # every rank of the node copies (read + write: 2 bytes of memory traffic per byte) or reduces
    # (read 2, write 1: 3 bytes) at once, so each gets 1/ranks of the node's memory bandwidth;
    # a lone leader reduces at one core's memory bandwidth (~20 GB/s: assumption)
    return Params(name, ranks, 0.4e-6, 2 * ranks / (mem_gbs * GB), alpha_inter, gbit(nic_gbit), 1,
                  3 * ranks / (mem_gbs * GB), 3 / (20 * GB), description,
                  sources + ("α_intra 0.4 µs: assumption, shared-memory MPI latency (0.2-0.5 µs)",
                             "β_intra, γ: node memory bandwidth shared by all ranks; caches ignored",
                             "γ with one rank per node: one core streams ~20 GB/s (assumption)"))


PRESETS: dict[str, Params] = {p.name: p for p in (
    _gpu("dgx-h100", 8, 400, "8 × H100 per node on NVLink 4, 8 × 400 Gb/s NDR InfiniBand (one per GPU)",
         "8 × ConnectX-7 400 Gb/s NDR per DGX H100 (NVIDIA DGX H100 user guide)"),
    _gpu("hgx-h100-4nic", 4, 400, "8 × H100 per node on NVLink 4, 4 × 400 Gb/s NDR (one NIC per 2 GPUs)",
         "4 × 400 Gb/s per node: a common cloud/HGX build (assumption: one NIC per GPU pair)"),
    _gpu("gpu-nvlink-400g", 1, 400, "8 GPUs per node on NVLink 4, one 400 Gb/s NIC per node",
         "1 × 400 Gb/s NDR per node (assumption: a budget build)"),
    _gpu("gpu-nvlink-200g", 1, 200, "8 GPUs per node on NVLink 4, one 200 Gb/s HDR NIC per node",
         "1 × 200 Gb/s HDR per node (ConnectX-6)"),
    _cpu("cpu-ib-hdr", 128, 409.6, 200, 1.5e-6,
         "2 × 64-core CPUs (one rank per core), 16 DDR4-3200 channels, one 200 Gb/s HDR NIC",
         ("2 × AMD EPYC 7763: 8 DDR4-3200 channels per socket = 204.8 GB/s each (AMD datasheet)",
          "1 × 200 Gb/s HDR InfiniBand; α_inter 1.5 µs: MPI ping-pong on HDR is ~1-1.5 µs (OSU latency)")),
    _cpu("cpu-ib-ndr", 192, 921.6, 400, 1.2e-6,
         "2 × 96-core CPUs (one rank per core), 24 DDR5-4800 channels, one 400 Gb/s NDR NIC",
         ("2 × AMD EPYC 9654: 12 DDR5-4800 channels per socket = 460.8 GB/s each (AMD datasheet)",
          "1 × 400 Gb/s NDR InfiniBand; α_inter 1.2 µs: assumption, MPI ping-pong on NDR")),
    # The two clusters of issue 33's prediction to 4096 ranks (step.py):
    Params("a100-4x200g", 4, 2e-6, gbyte(300), 3e-6, gbit(200), 4, 3 / (1555 * GB), None,
           "4 × A100 SXM per node on NVLink 3, 4 × 200 Gb/s HDR InfiniBand (one per GPU)",
           ("NVLink 3 on A100 SXM: 600 GB/s bidirectional per GPU = 300 GB/s per direction (NVIDIA A100 "
            "datasheet)",
            "4 × A100 40 GB + 4 × ConnectX-6 HDR 200 Gb/s per node: the JUWELS Booster node (Jülich "
            "Supercomputing Centre's system description); Perlmutter's GPU nodes are alike (4 × A100, "
            "4 × 200 Gb/s Slingshot NICs)",
            _NVLINK_ALPHA, _GDR_ALPHA,
            "γ 1.9 ps/B: A100 40 GB HBM2 1,555 GB/s, 3 bytes moved per byte reduced")),
    Params("cpu-2s-100g", 2, 0.4e-6, gbyte(10), 1.5e-6, gbit(100), 1, 3 / (20 * GB), None,
           "2-socket CPU nodes, one rank per socket (each rank's framework uses the socket's cores), "
           "one 100 Gb/s NIC (EDR InfiniBand or 100 GbE with RDMA)",
           ("2 ranks per node, one per socket: the usual layout for data-parallel CPU training "
            "(assumption; Horovod's and Intel's CPU guides place one rank per socket)",
            "1 × 100 Gb/s EDR InfiniBand (ConnectX-5); α_inter 1.5 µs: MPI ping-pong on EDR is "
            "~1-1.5 µs (OSU latency; assumption for a whole job)",
            "α_intra 0.4 µs: assumption, shared-memory MPI latency (0.2-0.5 µs)",
            "β_intra 10 GB/s (a byte copied through shared memory) and γ 3 bytes per byte reduced at "
            "20 GB/s: one core's memory stream, as MPI libraries copy and reduce on one thread "
            "(assumption; this VM's pack copy ran at 10.9 GB/s, packing.py)")),
    Params("p100-4x25g", 4, 5e-6, gbyte(10), 5e-6, gbit(25), 1, 3 / (732 * GB), None,
           "4 × P100 per server on PCIe, one 25 Gb/s RoCE NIC: the setup of Horovod's published benchmark",
           ("128 servers with 4 Pascal GPUs each, RoCE-capable 25 Gbit/s network: Horovod's README and "
            "Sergeev & Del Balso, 'Horovod: fast and easy distributed deep learning in TensorFlow', 2018",
            "β_intra 10 GB/s: PCIe 3.0 x16 (15.75 GB/s raw), achieved GPU-to-GPU (assumption)",
            "α_intra, α_inter 5 µs: assumptions (PCIe peer copies, RoCE)",
            "γ: P100 HBM2 732 GB/s, 3 bytes moved per byte reduced")),
    # Fitted on the 2-core test VM (docs/scaling.md): `python -m tools.costmodel fit
    # docs/data/sweep-n2-r*.json --combine min`. Fake nodes (MPIDIST_LOCAL_SIZE) share one memory,
    # so "inter" = "intra" and flows never share a NIC (nics = ranks_per_node).
    Params("this-vm", 2, 1.60e-6, 0.288e-9, 1.60e-6, 0.288e-9, 2, 0.0, None,
           "the 2-core test VM, shared memory only; fake nodes of 2 ranks (MPIDIST_LOCAL_SIZE=2)",
           ("α 1.60 µs, β 0.288 ns/B (3.5 GB/s): least squares on relative error, raw MPI Allreduce at "
            "2 ranks, 64 B-64 MB, fastest of 12 runs per size (docs/data/sweep-n2-r*.json); ring formula "
            "(at 2 ranks every formula fits alike)",
            "γ: not identifiable from these timings (ring charges β and γ 2:1), so 0 and folded into β; "
            "np.add alone costs ~0.12 ns/B here")))}

# -- a training step's other inputs (step.py) --------------------------------------------------------
#
# A Workload adds to a link preset what a step needs besides the network: how long one rank computes
# a step of each model (forward + backward + update, without communication), how fast one rank copies
# bytes into a pack (``copy_bandwidth``), and whether NCCL applies (GPU buffers). **The compute times
# are assumptions** (derived as their sources say), not measurements: efficiency scales with them, so
# ``--compute-ms`` overrides them. ``backward_share`` is the part of compute during which gradients
# appear (Horovod's schedule overlaps its allreduces with it).

MODELS = ("resnet50", "bert_base")


@dataclass(frozen=True)
class Workload:
    preset: str                    # the link preset (presets.PRESETS)
    compute_s: dict[str, float]    # seconds of one rank's step per model, without communication
    copy_bandwidth: float          # bytes/s of one rank's copy into a pack (read + write)
    gpu: bool                      # NCCL applies (device buffers)
    sources: tuple[str, ...]
    backward_share: float = 2 / 3  # backward ≈ 2 × forward (assumption)
    overhead_s: float = 14.6e-6    # mpidist's software cost per data call (host: docs/scaling.md's fit)
    nccl: tuple[str, ...] = ("nccl_ring", "nccl_tree")  # what NCCL may pick (gpu only)


WORKLOADS: dict[str, Workload] = {w.preset: w for w in (
    Workload("a100-4x200g", {"resnet50": 0.098, "bert_base": 0.043}, 1555e9 / 2, True, (
        "ResNet-50: 256 images per GPU per step at ~2,600 images/s (mixed precision): the order of "
        "NVIDIA's published per-A100 training throughput for ResNet-50 v1.5 (DeepLearningExamples); "
        "assumption, not measured here",
        "BERT-base: 64 sequences of 128 tokens per GPU per step, 6 × 110 M parameters × 8,192 tokens "
        "= 5.4 TFLOP at an assumed 40% of A100's 312 TFLOPS (FP16 dense peak, datasheet) = 43 ms",
        "copy: HBM2 1,555 GB/s, 2 bytes moved per byte packed (the GPU path packs on the device)",
        "software per call 6.4 µs: mpidist's nccl path over raw NCCL at 4 KB, 16.3 against 9.9 µs, "
        "measured on one H100 (docs/gpu.md)"), overhead_s=6.4e-6),
    # A check against the one published scaling figure: Horovod's 90% at 512 GPUs (docs/scaling.md)
    Workload("p100-4x25g", {"resnet50": 64 / 219}, 732e9 / 2, True, (
        "ResNet-50 on a P100 at batch 64: ~219 images/s (TensorFlow's 2017 published benchmarks, "
        "recalled, not checked here): 0.29 s; it stands in for ResNet-101 (178 MB of gradients in "
        "~0.5 s at ~128 images/s): the same gradient bytes per second of compute within a few %",
        "copy: P100 HBM2 732 GB/s, 2 bytes moved per byte packed"),
        overhead_s=6.4e-6, nccl=("nccl_ring",)),
    Workload("cpu-2s-100g", {"resnet50": 1.3, "bert_base": 2.3}, 10.9e9, False, (
        "one rank per 40-core socket (Xeon Platinum 8380: 40 cores × 2.3 GHz × 32 FP32 FLOP/cycle "
        "= 2.9 TFLOPS peak), assumed 40% of peak in training = 1.2 TFLOP/s",
        "ResNet-50: 64 images per rank, 3 × 8.2 GFLOP per image (forward 4.1 GMAC) = 1.6 TFLOP: 1.3 s",
        "BERT-base: 32 sequences of 128 tokens, 6 × 110 M × 4,096 = 2.7 TFLOP: 2.3 s",
        "copy: 10.9 GB/s, one core's np.concatenate of ResNet-50's 102 MB measured on this VM "
        "(packing.py's docstring)")),
    Workload("this-vm", {"resnet50": 0.0, "bert_base": 0.0}, 10.9e9, False, (
        "the 2-core VM: no compute time (only the communication is checked against the bench)",
        "copy: 10.9 GB/s, np.concatenate of ResNet-50's 102 MB, best of runs (packing.py)")),
)}


def workload(preset: str) -> Workload:
    """The workload of ``preset``; an error that names the known ones."""
    if preset not in WORKLOADS:
        raise ValueError(f"workload: `preset` must be one of {', '.join(WORKLOADS)}, got {preset!r}")
    return WORKLOADS[preset]
