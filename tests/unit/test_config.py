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


def test_validation_is_one_module_with_one_meaning_per_value():
    """The checks every layer shares: numpy integers are integers, bools are not, 0 = no deadline."""
    np = pytest.importorskip("numpy")
    from mpidist import validation as v
    from mpidist.collectives.options import CallOptions
    from mpidist.cross_device import CommunicationOptions
    assert v.check_bytes_per_pack(np.int32(64), "f") == 64
    assert v.check_num_packs(None, "f", optional=True) is None
    assert v.check_timeout(None, "f") is None and v.check_timeout(0, "f") == v.NO_DEADLINE == 0
    assert v.check_timeout(np.float32(2.5), "f") == 2.5
    assert v.check_rank(np.int64(1), "f", "root", 2) == 1
    for bad in (True, -1, 1.5, "8"):
        for make in (lambda b: v.check_bytes_per_pack(b, "Where"), lambda b: CallOptions.checked("Where", bytes_per_pack=b)):
            with pytest.raises(ValueError, match="Where: `bytes_per_pack` must be an integer >= 0"):
                make(bad)
        with pytest.raises(ValueError, match="CommunicationOptions: `bytes_per_pack` must be an integer >= 0"):
            CommunicationOptions(bytes_per_pack=bad)
    assert CommunicationOptions(bytes_per_pack=np.int64(32)).bytes_per_pack == 32  # numpy ints everywhere
    for bad in (-1, True, "3", float("nan")):
        with pytest.raises(ValueError, match="`timeout_seconds` must be None, 0 \\(no deadline\\) or seconds > 0"):
            v.check_timeout(bad, "f")
        with pytest.raises(ValueError, match="CommunicationOptions: `timeout_seconds` must be None, 0"):
            CommunicationOptions(timeout_seconds=bad)
    # 0 is TensorFlow's "no timeout": accepted by the options, and it wins over a default deadline
    assert CommunicationOptions(timeout_seconds=0).timeout_seconds == 0
    assert CommunicationOptions(timeout_seconds=5).merge(CommunicationOptions(timeout_seconds=0)).timeout_seconds == 0
    assert CommunicationOptions(timeout_seconds=5).merge(CommunicationOptions()).timeout_seconds == 5  # None: inherit
    with rc.override(timeout_seconds=7):
        assert CallOptions().resolve().timeout == 7           # None: rc's default
        assert CallOptions(timeout_seconds=0).resolve().timeout is None  # 0: no deadline over rc
        assert CommunicationOptions(timeout_seconds=0).call_options().resolve().timeout is None
    with pytest.raises(ValueError, match="give `bytes_per_pack` or `num_packs`, not both"):
        CallOptions(bytes_per_pack=8, num_packs=2)
    with pytest.raises(ValueError, match="`implementation` must be one of AUTO, RING, NCCL, got 'gloo'"):
        CallOptions(implementation="gloo")


def _python(code: str, **env: str) -> None:
    import os
    import subprocess
    import sys
    full = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **env}
    done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_import_alone_leaves_excepthook_untouched_and_the_first_engine_installs_it():
    _python("import sys, threading\n"
            "hook, thread_hook = sys.excepthook, threading.excepthook\n"
            "import mpidist\n"
            "assert sys.excepthook is hook and threading.excepthook is thread_hook, 'import changed the hooks'\n"
            "mpidist.Engine()\n"
            "assert sys.excepthook is not hook and threading.excepthook is not thread_hook, 'Engine did not install'\n")


def test_abort_on_error_off_installs_nothing():
    _python("import sys\nhook = sys.excepthook\nimport mpidist\nmpidist.Engine()\n"
            "assert sys.excepthook is hook\n", MPIDIST_ABORT_ON_ERROR="0")


def test_preemption_signals_names_catchable_signals():
    import signal

    from mpidist import rc
    assert rc.preemption_signals == ("SIGTERM",)  # TensorFlow's own trigger
    with rc.override(preemption_signals="TERM, usr1"):
        assert rc.preemption_signals == ("SIGTERM", "SIGUSR1")
    with rc.override(preemption_signals=[signal.SIGUSR1, int(signal.SIGTERM), "SIGUSR1"]):
        assert rc.preemption_signals == ("SIGUSR1", "SIGTERM")
    for bad, shown in (("KILL", "'KILL'"), ("TERM,NOPE", "'NOPE'"), (999, "999")):
        with pytest.raises(ValueError, match=f"`preemption_signals` must name signals a handler can catch "
                                             f"\\(e.g. TERM,USR1\\), got {shown}"):
            rc.preemption_signals = bad
    with pytest.raises(ValueError, match="must name at least one signal"):
        rc.preemption_signals = " "
    assert rc.preemption_signals == ("SIGTERM",)
