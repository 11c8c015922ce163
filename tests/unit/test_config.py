"""mpidist.rc: defaults, environment overrides, rejection of unknown names and bad values."""
from __future__ import annotations

import pytest

from mpidist._config import Settings, rc


def test_defaults_and_environment():
    s = Settings({})
    assert (s.algorithm, s.bytes_per_pack, s.local_size, s.check_agreement, s.timeout_seconds) == \
        ("auto", 0, 0, True, None)
    s = Settings({"MPIDIST_ALGORITHM": "Hierarchical", "MPIDIST_BYTES_PER_PACK": "4096",
                  "MPIDIST_LOCAL_SIZE": "2", "MPIDIST_CHECK_AGREEMENT": "off", "MPIDIST_TIMEOUT_SECONDS": "2.5"})
    assert (s.algorithm, s.bytes_per_pack, s.local_size, s.check_agreement, s.timeout_seconds) == \
        ("hierarchical", 4096, 2, False, 2.5)


def test_unknown_environment_name_is_rejected():
    with pytest.raises(ValueError, match="unknown setting\\(s\\) MPIDIST_ALGORITHMS in the environment"):
        Settings({"MPIDIST_ALGORITHMS": "flat"})


@pytest.mark.parametrize("env, message", [
    ({"MPIDIST_ALGORITHM": "ring"}, "`MPIDIST_ALGORITHM` must be one of auto, flat, hierarchical, got 'ring'"),
    ({"MPIDIST_BYTES_PER_PACK": "-1"}, "`MPIDIST_BYTES_PER_PACK` must be an integer >= 0, got '-1'"),
    ({"MPIDIST_CHECK_AGREEMENT": "maybe"}, "`MPIDIST_CHECK_AGREEMENT` must be a boolean"),
    ({"MPIDIST_TIMEOUT_SECONDS": "-3"}, "`MPIDIST_TIMEOUT_SECONDS` must be None, 0 (no deadline) or seconds > 0, got '-3'"),
])
def test_bad_environment_values(env, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        Settings(env)


def test_attribute_access_is_checked():
    s = Settings({})
    with pytest.raises(AttributeError, match="mpidist.rc has no setting 'algoritm'"):
        s.algoritm = "flat"
    with pytest.raises(AttributeError, match="no setting 'nope'"):
        s.nope
    with pytest.raises(ValueError, match="`bytes_per_pack` must be an integer >= 0, got True"):
        s.bytes_per_pack = True
    s(algorithm="flat", bytes_per_pack=128)
    assert (s.algorithm, s.bytes_per_pack) == ("flat", 128)


def test_override_restores_even_on_error():
    before = rc.as_dict()
    with pytest.raises(RuntimeError):
        with rc.override(algorithm="flat", timeout_seconds=3):
            assert rc.algorithm == "flat" and rc.timeout_seconds == 3.0
            raise RuntimeError
    assert rc.as_dict() == before
    assert set(Settings.describe()) == set(before)


@pytest.mark.parametrize("zero", [0, 0.0, "0", "none", "", None])
def test_timeout_zero_and_none_mean_no_deadline(zero):
    """rc is the last default, so None and 0 both mean no deadline, in code as in the environment."""
    assert Settings({"MPIDIST_TIMEOUT_SECONDS": str(zero) if zero is not None else "none"}).timeout_seconds is None
    s = Settings({})
    s.timeout_seconds = 5
    s.timeout_seconds = zero
    assert s.timeout_seconds is None


def test_numpy_integers_are_integers_everywhere():
    np = pytest.importorskip("numpy")
    s = Settings({})
    s.bytes_per_pack = np.int64(4096)
    assert s.bytes_per_pack == 4096 and type(s.bytes_per_pack) is int
    with pytest.raises(ValueError, match="`bytes_per_pack` must be an integer >= 0, got 1.5"):
        s.bytes_per_pack = 1.5
