"""mpidist.files.write_atomically: a failure at any point leaves the old file (or none) and no
temporary file; a success leaves the complete new file, its bytes and the rename fsync'ed."""
from __future__ import annotations

import os
import pathlib
import pickle

import pytest

from mpidist import files

ROOT = pathlib.Path(__file__).resolve().parents[2] / "mpidist"


def writer(content: bytes, fail_after: int | None = None):
    """write(tmp): writes ``content``, or its first ``fail_after`` bytes and then fails (a crash midway)."""
    def write(tmp: str) -> str:
        with open(tmp, "wb") as f:
            f.write(content if fail_after is None else content[:fail_after])
            if fail_after is not None:
                f.flush()
                raise OSError("disk full (simulated)")
        return "written"
    return write


def leftovers(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".mpidist-tmp-" in p.name)


def test_new_file_complete(tmp_path):
    path = tmp_path / "state.bin"
    assert files.write_atomically(path, writer(b"new" * 1000)) == "written"
    assert path.read_bytes() == b"new" * 1000
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fail_after", [0, 1, 1500])
def test_failure_midway_leaves_the_old_file(tmp_path, fail_after):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="simulated"):
        files.write_atomically(path, writer(b"new" * 1000, fail_after))
    assert path.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_failure_midway_leaves_no_file(tmp_path):
    path = tmp_path / "state.bin"
    with pytest.raises(OSError, match="simulated"):
        files.write_atomically(path, writer(b"new", 1))
    assert not path.exists() and leftovers(tmp_path) == []


def test_failure_at_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")

    def refuse(src, dst):
        raise OSError("rename refused (simulated)")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError, match="rename refused"):
        files.write_atomically(path, writer(b"new"))
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_fsyncs_file_before_rename_and_directory_after(tmp_path, monkeypatch):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    events: list[tuple[str, str]] = []
    names: dict[int, str] = {}
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def opening(name, flags, *args, **kwargs):
        fd = real_open(name, flags, *args, **kwargs)
        names[fd] = os.fspath(name)
        return fd

    def fsync(fd):
        events.append(("fsync", names.get(fd, "?")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.fspath(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(files.os, "open", opening)
    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    files.write_atomically(path, writer(b"new"))
    tmp = files.temporary_name(path)
    assert events == [("fsync", tmp), ("replace", str(path)), ("fsync", str(tmp_path))]
    assert path.read_bytes() == b"new"


def test_temporary_in_another_directory_is_refused(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match=r"write_atomically: `temporary` must be in the directory of"):
        files.write_atomically(tmp_path / "a.bin", writer(b"x"), temporary=str(tmp_path / "sub" / "t"))


def test_temporary_name_keeps_the_ending_and_stale_ones_are_found(tmp_path):
    path = tmp_path / "model.weights.h5"
    tmp = files.temporary_name(path, ".weights.h5")
    assert os.path.dirname(tmp) == str(tmp_path) and tmp.endswith(".weights.h5")
    assert os.path.basename(tmp).startswith(".model.mpidist-tmp-")
    assert files.temporary_name(path, ".keras").endswith(f"-{os.getpid()}")  # not its ending: none kept
    pathlib.Path(tmp).write_bytes(b"half")
    (tmp_path / ".other.mpidist-tmp-1").write_bytes(b"")
    assert files.stale_temporaries(path, ".weights.h5") == [tmp]


def test_numpy_checkpoint_and_preemption_write_through_it(tmp_path, monkeypatch):
    """The writers: a failure midway in mpidist.checkpoint and the elastic snapshot keeps the old file."""
    import numpy as np

    from mpidist import checkpoint
    from mpidist.elastic import preemption

    calls = []
    real = files.write_atomically

    def spy(path, write, **kwargs):
        calls.append(os.path.basename(os.fspath(path)))
        return real(path, write, **kwargs)

    monkeypatch.setattr(files, "write_atomically", spy)
    checkpoint._write({"w": np.arange(3)}, str(tmp_path / "ckpt.npz"))
    snapshot = preemption.Preemption.__new__(preemption.Preemption)
    snapshot.path, snapshot._writing = str(tmp_path / "elastic.pkl"), False
    snapshot.write({"step": 3})
    assert calls == ["ckpt.npz", "elastic.pkl"]
    assert pickle.loads((tmp_path / "elastic.pkl").read_bytes())["snapshot"] == {"step": 3}
    with np.load(tmp_path / "ckpt.npz") as saved:
        assert saved["leaf_000000"].tolist() == [0, 1, 2]


def test_no_writer_renames_files_itself():
    """Every atomic write goes through mpidist/files.py: no other module calls os.replace / os.rename."""
    found = [f"{path.relative_to(ROOT.parent)}:{n}" for path in sorted(ROOT.rglob("*.py")) if path.name != "files.py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "os.replace(" in line or "os.rename(" in line]
    assert found == [], f"write through mpidist.files.write_atomically instead: {found}"
