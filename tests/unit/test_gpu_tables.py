"""NCCL dtype/op tables and reduction rules (pure data and functions: no CuPy, no GPU), and the
device packing helpers' logic with NumPy standing in for CuPy's array API (no GPU behaviour is
claimed by these)."""
from __future__ import annotations

import numpy as np
import pytest

from mpidist.collectives.gpu import device_collectives as dc, nccl
from mpidist.collectives.gpu.nccl import Rule
from mpidist.collectives.ops import Op

NEW, OLD = 22105, 20803  # NCCL 2.21.5 and 2.8.3 (version codes)
F32, F64, U8 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.uint8)


def test_constant_names_are_cupys():
    # cupy_backends/cuda/libs/nccl.pxd: NCCL_INT8 .. NCCL_BFLOAT16 = 0..9, NCCL_SUM .. NCCL_AVG = 0..4
    assert set(nccl.DTYPES.values()) == {"NCCL_INT8", "NCCL_UINT8", "NCCL_INT32", "NCCL_UINT32", "NCCL_INT64",
                                         "NCCL_UINT64", "NCCL_FLOAT16", "NCCL_FLOAT32", "NCCL_FLOAT64",
                                         "NCCL_BFLOAT16"}
    assert nccl.OPS == {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN",
                        "avg": "NCCL_AVG"}
    assert nccl.COMPLEX == {"complex64": "NCCL_FLOAT32", "complex128": "NCCL_FLOAT64"}


@pytest.mark.parametrize("dtype, op, version, expected", [
    (np.float32, Op.SUM, NEW, Rule(F32, "sum", False, "NCCL_FLOAT32")),
    (np.float32, Op.MEAN, NEW, Rule(F32, "avg", False, "NCCL_FLOAT32")),
    (np.float32, Op.MEAN, OLD, Rule(F32, "sum", True, "NCCL_FLOAT32")),
    (np.float16, Op.MAX, NEW, Rule(np.dtype(np.float16), "max", False, "NCCL_FLOAT16")),
    (np.int32, Op.MEAN, NEW, Rule(np.dtype(np.int32), "sum", True, "NCCL_INT32")),
    (np.int16, Op.SUM, NEW, Rule(np.dtype(np.int32), "sum", False, "NCCL_INT32")),
    (np.uint16, Op.MIN, NEW, Rule(np.dtype(np.uint32), "min", False, "NCCL_UINT32")),
    (np.uint64, Op.PROD, NEW, Rule(np.dtype(np.uint64), "prod", False, "NCCL_UINT64")),
    (np.bool_, Op.SUM, NEW, Rule(U8, "max", False, "NCCL_UINT8")),
    (np.bool_, Op.PROD, NEW, Rule(U8, "min", False, "NCCL_UINT8")),
    (np.complex64, Op.SUM, NEW, Rule(np.dtype(np.complex64), "sum", False, "NCCL_FLOAT32", 2)),
    (np.complex128, Op.MEAN, NEW, Rule(np.dtype(np.complex128), "avg", False, "NCCL_FLOAT64", 2)),
    (np.complex64, Op.PROD, NEW, None),  # NCCL cannot multiply complex numbers: MPI takes that pack
], ids=lambda x: getattr(x, "name", str(x)))
def test_nccl_rules(dtype, op, version, expected):
    assert nccl.nccl_rule(np.dtype(dtype), op, version, "allreduce", "leaf 0") == expected


@pytest.mark.parametrize("dtype, op, expected", [
    (np.float16, Op.SUM, Rule(F32, "sum", False, "NCCL_FLOAT32")),      # MPI has no half type
    (np.float32, Op.MEAN, Rule(F32, "sum", True, "NCCL_FLOAT32")),      # two levels: SUM, then divide
    (np.int16, Op.MAX, Rule(np.dtype(np.int32), "max", False, "NCCL_INT32")),
    (np.bool_, Op.MAX, Rule(U8, "max", False, "NCCL_UINT8")),
], ids=str)
def test_hierarchical_rules_are_mpi_compatible(dtype, op, expected):
    assert nccl.nccl_rule(np.dtype(dtype), op, NEW, "allreduce", "leaf 0", hierarchical=True) == expected


def test_mpi_rules_follow_the_host_path():
    assert nccl.mpi_rule(np.dtype(np.float16), Op.MEAN, "w", "x") == Rule(F32, "sum", True)
    assert nccl.mpi_rule(np.dtype(np.bool_), Op.MIN, "w", "x") == Rule(U8, "min", False)
    assert nccl.mpi_rule(np.dtype(np.int16), Op.SUM, "w", "x") == Rule(np.dtype(np.int16), "sum", False)


def test_bfloat16_rules():
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    assert nccl.nccl_rule(bf16, Op.SUM, NEW, "w", "x") == Rule(bf16, "sum", False, "NCCL_BFLOAT16")
    assert nccl.nccl_rule(bf16, Op.MEAN, NEW, "w", "x") == Rule(bf16, "avg", False, "NCCL_BFLOAT16")
    assert nccl.nccl_rule(bf16, Op.SUM, OLD, "w", "x") == Rule(F32, "sum", False, "NCCL_FLOAT32")
    assert nccl.nccl_rule(bf16, Op.MEAN, NEW, "w", "x", hierarchical=True) == Rule(F32, "sum", True,
                                                                                  "NCCL_FLOAT32")
    assert nccl.mpi_rule(bf16, Op.MAX, "w", "x") == Rule(F32, "max", False)


def test_rule_errors_match_the_host_path():
    with pytest.raises(TypeError, match="allreduce: leaf 2 of `value` has dtype bool; op MEAN needs a numeric"):
        nccl.nccl_rule(np.dtype(np.bool_), Op.MEAN, NEW, "allreduce", "leaf 2 of `value`")
    with pytest.raises(TypeError, match="op MIN is not defined for complex numbers"):
        nccl.nccl_rule(np.dtype(np.complex64), Op.MIN, NEW, "allreduce", "leaf 0 of `value`")
    with pytest.raises(TypeError, match="expected a numeric or bool dtype"):
        nccl.mpi_rule(np.dtype("U3"), Op.SUM, "allreduce", "leaf 0 of `value`")


def test_version_text():
    assert nccl.version_text(22105) == "2.21.5"
    assert nccl.version_text(23000) == "2.30.0"
    assert nccl.version_text(2804) == "2.8.4"
    assert nccl.version_text(0) == "none"


# -- the pack loop the host and device paths share (packing.py), its device branch driven by an
# array module that is not NumPy (so the branch CuPy takes runs here) -------------------------------

class _DeviceLike:
    """An array module standing in for CuPy: NumPy's functions, but not NumPy itself."""
    empty, abs, where = staticmethod(np.empty), staticmethod(np.abs), staticmethod(np.where)


def test_pack_unpack_roundtrip_with_wire_conversions():
    from mpidist.collectives import packing
    a, b = np.arange(6, dtype=np.int16).reshape(2, 3), np.array(7, dtype=np.int16)
    for xp in (None, _DeviceLike):
        buf = packing.pack([a, b], np.dtype(np.int32), xp=xp)
        assert buf.dtype == np.int32 and buf.tolist() == [0, 1, 2, 3, 4, 5, 7]
        back = packing.unpack(buf, [a.shape, b.shape], [a.dtype, a.dtype])
        assert back[0].dtype == np.int16 and back[0].shape == (2, 3) and back[1].shape == () and back[1] == 7
    flags = np.array([True, False])
    assert packing.pack([flags], U8, xp=_DeviceLike).base is not None  # bool travels as a uint8 view, no copy
    assert packing.from_wire(np.array([1, 0], np.uint8), np.dtype(np.bool_)).tolist() == [True, False]
    assert dc.bytes_of is packing.bytes_of  # one implementation


def test_finish_mean_truncates_integers_toward_zero_on_both_branches():
    from mpidist.collectives.ops import finish_mean
    for dtype in (np.int8, np.int32, np.uint16, np.float32, np.complex64):
        values = np.array([-7, -1, 0, 5, 9], dtype=np.int64).astype(dtype) if np.dtype(dtype).kind != "u" \
            else np.array([0, 5, 9], dtype=dtype)
        device, host = values.copy(), values.copy()
        finish_mean(device, 4, xp=_DeviceLike)
        finish_mean(host, 4)
        expected = [int(v / 4) if np.dtype(dtype).kind in "iu" else v / 4 for v in values.tolist()]
        assert device.tolist() == host.tolist() == expected, dtype


class _Cupy13Nccl:
    """CuPy <= 13's NcclCommunicator: the id is a tuple of C chars, signed (x86-64) or unsigned
    (aarch64); out-of-range values raise OverflowError, a wrong type TypeError, as Cython does."""

    def __init__(self, signed: bool) -> None:
        self.low, self.high = (-128, 127) if signed else (0, 255)
        self.made: list[tuple] = []

    def NcclCommunicator(self, ndev, comm_id, rank):  # noqa: N802 - CuPy's name
        if not isinstance(comm_id, tuple):
            raise TypeError(f"Argument 'commId' has incorrect type (expected tuple, got {type(comm_id).__name__})")
        if any(not self.low <= x <= self.high for x in comm_id):
            raise OverflowError("value too large to convert to char")
        self.made.append(comm_id)
        return self


class _Cupy14Nccl:
    def __init__(self) -> None:
        self.made: list[bytes] = []

    def NcclCommunicator(self, ndev, comm_id, rank):  # noqa: N802 - CuPy's name
        if not isinstance(comm_id, bytes):
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(comm_id).__name__})")
        self.made.append(comm_id)
        return self


RAW = bytes(range(200, 256)) + bytes(range(72))  # 128 bytes, many of them >= 128


@pytest.mark.parametrize("given", [RAW, tuple(np.frombuffer(RAW, np.int8).tolist()), tuple(RAW)],
                         ids=["bytes (CuPy 14)", "signed chars (CuPy 13, x86-64)", "unsigned chars (CuPy 13, arm)"])
def test_unique_id_from_every_cupy_reads_as_the_same_bytes(given):
    uid = nccl.unique_id_bytes(given)
    assert uid.dtype == np.uint8 and uid.tobytes() == RAW


@pytest.mark.parametrize("module, expected", [
    (_Cupy14Nccl(), RAW),
    (_Cupy13Nccl(signed=True), tuple(np.frombuffer(RAW, np.int8).tolist())),
    (_Cupy13Nccl(signed=False), tuple(RAW)),
], ids=["CuPy 14", "CuPy 13 signed char", "CuPy 13 unsigned char"])
def test_communicator_passes_the_id_as_this_cupy_takes_it(module, expected):
    uid = np.frombuffer(RAW, np.uint8).copy()
    assert nccl.communicator(module, 2, uid, 1) is module
    assert module.made == [expected]


def test_communicator_says_which_forms_it_tried():
    class Refuses:
        def NcclCommunicator(self, ndev, comm_id, rank):  # noqa: N802 - CuPy's name
            raise TypeError(f"expected str, got {type(comm_id).__name__}")

    with pytest.raises(TypeError, match=r"communicator: .* none of the forms tried .*bytes: expected str, got "
                                        r"bytes; tuple of signed chars: expected str"):
        nccl.communicator(Refuses(), 2, np.frombuffer(RAW, np.uint8).copy(), 0)
