"""The `compression` setting: its one check, CallOptions/Resolved, CommunicationOptions, mpidist.rc,
and the codecs of collectives/compression.py on one process (no communication)."""
from __future__ import annotations

import numpy as np
import pytest

from mpidist._config import Settings, rc
from mpidist.collectives import compression
from mpidist.collectives.options import CallOptions, Resolved
from mpidist.cross_device.options import CommunicationOptions, as_options
from mpidist.validation import check_compression


@pytest.mark.parametrize("given, expected", [
    ("none", "none"), ("OFF", "none"), ("float16", "float16"), (" fp16 ", "float16"), ("Half", "float16"),
    ("bfloat16", "bfloat16"), ("BF16", "bfloat16"), (np.float16, "float16"), (np.dtype("float16"), "float16"),
])
def test_check_compression_spellings(given, expected):
    assert check_compression(given, "f") == expected


def test_check_compression_none_and_errors():
    assert check_compression(None, "f") == "none"
    assert check_compression(None, "f", optional=True) is None
    for bad in ("float32", "int8", True, 16, ""):
        with pytest.raises(ValueError) as info:
            check_compression(bad, "CommunicationOptions")
        assert str(info.value) == (f"CommunicationOptions: `compression` must be one of none, float16, bfloat16 "
                                   f"(or off, fp16, half, bf16), got {bad!r}")


def test_call_options_field_merge_and_resolve():
    assert CallOptions().compression is None
    opts = CallOptions(compression="bf16")
    assert opts.compression == "bfloat16"
    assert CallOptions(bytes_per_pack=8).merged(opts).compression == "bfloat16"
    assert opts.merged(CallOptions(compression="none")).compression == "none"
    assert opts.merged(CallOptions(bytes_per_pack=8)).compression == "bfloat16"  # not set: kept
    assert CommunicationOptions(compression="bf16").call_options() == opts  # the one conversion keeps it
    with pytest.raises(ValueError, match="allreduce: `compression` must be one of"):
        CallOptions.checked("allreduce", compression="fp8")
    with pytest.raises(ValueError, match="CallOptions: `compression`"):
        CallOptions(compression="fp8")
    with rc.override(compression="float16"):
        assert CallOptions().resolve().compression == "float16"
        assert opts.resolve().compression == "bfloat16"
        assert Resolved.defaults().compression == "float16"
        assert Resolved.from_arguments("allreduce", None, None, None, None).compression == "float16"
    assert Resolved.defaults().compression == "none"
    assert "compression='none'" in repr(Resolved.defaults())


def test_communication_options_extension():
    assert CommunicationOptions().compression is None
    assert "compression" not in repr(CommunicationOptions())
    opts = CommunicationOptions(compression="half")
    assert opts.compression == "float16" and "compression='float16'" in repr(opts)
    assert opts.call_options().compression == "float16"
    assert CommunicationOptions().call_options().compression is None
    assert opts.merge(CommunicationOptions(bytes_per_pack=4)).compression == "float16"
    assert opts.merge(CommunicationOptions(compression="none")).compression == "none"
    assert CommunicationOptions().merge(opts).compression == "float16"
    assert opts == CommunicationOptions(compression="fp16") and opts != CommunicationOptions()
    with pytest.raises(ValueError, match="CommunicationOptions: `compression` must be one of .* got 'lz4'"):
        CommunicationOptions(compression="lz4")

    class TfLike:  # TensorFlow's own class has no compression attribute; an object that has one keeps it
        bytes_per_pack, timeout_seconds, compression = 0, None, "bf16"
    assert as_options(TfLike(), "x").compression == "bfloat16"


def test_rc_setting_and_environment():
    assert Settings({}).compression == "none"
    assert Settings({"MPIDIST_COMPRESSION": "FP16"}).compression == "float16"
    assert Settings({"MPIDIST_COMPRESSION": "bfloat16"}).compression == "bfloat16"
    assert Settings({"MPIDIST_COMPRESSION": ""}).compression == "none"
    with pytest.raises(ValueError, match="mpidist.rc: `MPIDIST_COMPRESSION` must be one of none, float16, "
                                         "bfloat16 .* got 'gzip'"):
        Settings({"MPIDIST_COMPRESSION": "gzip"})
    s = Settings({})
    s.compression = "bf16"
    assert s.compression == "bfloat16"
    s.compression = None
    assert s.compression == "none"
    with pytest.raises(ValueError, match="mpidist.rc: `compression`"):
        s.compression = "float32"
    assert "compression" in Settings.describe()


def _round_trip(kind: str, x: np.ndarray) -> np.ndarray:
    codec = compression.codec(kind)
    wire = np.empty(codec.header + x.size, np.uint16)
    codec.encode(x, wire)
    return codec.decode(wire, np.empty(x.size, np.float32))


def test_bfloat16_codec_rounds_to_nearest_even():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-30, 30, 4096)).astype(np.float32)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, 3.3895314e38, 1.0]
    got = _round_trip("bfloat16", x)
    ml_dtypes = pytest.importorskip("ml_dtypes")  # the reference implementation, where installed
    assert np.array_equal(got.view(np.uint32), x.astype(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32))


def test_bfloat16_codec_keeps_nan():
    nans = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7FC00000], np.uint32).view(np.float32)
    assert np.all(np.isnan(_round_trip("bfloat16", nans)))


def test_float16_codec_scales_by_powers_of_two():
    x = np.array([1e9, -2.5e8, 3.0, 0.0], np.float32)
    shift = compression.scale_exponent(x)
    assert 2.0 ** 14 <= 1e9 * 2.0 ** shift < 2.0 ** 15
    got = _round_trip("float16", x)
    assert np.all(np.abs(got - x) <= 2.0 ** -11 * np.abs(x) + 1e9 * 2.0 ** -38)
    assert compression.scale_exponent(np.zeros(3, np.float32)) == 0
    assert compression.scale_exponent(np.array([np.inf, 1.0], np.float32)) == 0
    assert compression.scale_exponent(np.array([1e-44], np.float32)) == 100  # clamped
    small = np.array([3e-20, -1e-21], np.float32)
    assert np.all(np.abs(_round_trip("float16", small) - small) <= 2.0 ** -11 * np.abs(small))


def test_blocks_cut_like_array_split():
    for count, size in ((10, 3), (2, 4), (0, 2), (7, 1)):
        counts, offsets = compression.blocks(count, size)
        parts = np.array_split(np.arange(count), size)
        assert counts == [len(p) for p in parts]
        assert offsets == [int(p[0]) if len(p) else sum(counts[:i]) for i, p in enumerate(parts)]
