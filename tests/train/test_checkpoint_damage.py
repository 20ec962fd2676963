"""A damaged checkpoint, a failed save and an unwritable --checkpoint-dir: each is one error naming the file and
what is wrong (never ``CheckpointException ranks:dict_keys([0, 1])``, ``KeyError: 'rng_state'`` or
``JSONDecodeError``), a FIFO never blocks ``--resume``, a failed save leaves no ``step-N.tmp``, and an unwritable
folder is refused before step 1."""

import json
import os
import shutil
import threading

import pytest

from tests.train.runs import SHRINK, config, run
from trainmath.errors import TrainmathError
from trainmath.runtime.train.config import validate

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved") / "ck"
    run(2, checkpoint_dir=str(d), stop_after=1)
    assert sorted(os.listdir(d)) == ["step-000001"]
    return d


def _copy(saved, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(saved, d)
    return d, d / "step-000001"


def _resume(d, **kw):
    return run(2, checkpoint_dir=str(d), resume=True, timeout_s=30, **kw)


def _edit_meta(folder, **change):
    meta = json.loads((folder / "trainmath.json").read_text())
    meta.update(change)
    for k, v in change.items():
        if v is None:
            del meta[k]
    (folder / "trainmath.json").write_text(json.dumps(meta))


def test_the_copy_resumes(saved, tmp_path):
    """The oracle that the checks refuse nothing sound: an undamaged copy resumes to the last step."""
    d, _ = _copy(saved, tmp_path)
    out = _resume(d)
    assert [r["step"] for r in out[0]["records"]] == [2, 3, 4]


@pytest.mark.parametrize("change,needle", [
    ({"step": -5}, r"trainmath.json: step -5 is not this folder's \(step-000001\)"),
    ({"step": 3}, r"step 3 is not this folder's"),
    ({"step": "1"}, r"step must be an integer"),
    ({"rng_state": None}, r"trainmath.json: lacks rng_state"),
    ({"rng_state": "not base64!"}, r"rng_state is not base64"),
    ({"rng_state": "AAAA"}, r"rng_state is not a torch RNG state"),
    ({"samples": -1}, r"samples -1"),
])
def test_bad_trainmath_json(saved, tmp_path, change, needle):
    d, folder = _copy(saved, tmp_path)
    _edit_meta(folder, **change)
    with pytest.raises(TrainmathError, match=needle):
        _resume(d)


def test_trainmath_json_not_json(saved, tmp_path):
    d, folder = _copy(saved, tmp_path)
    (folder / "trainmath.json").write_text('{"step": 1,')
    with pytest.raises(TrainmathError, match=r"trainmath.json' is not JSON"):
        _resume(d)


def test_metadata_damaged(saved, tmp_path):
    d, folder = _copy(saved, tmp_path)
    (folder / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(TrainmathError, match=r"cannot load .*step-000001: its .metadata or .distcp files are damaged"):
        _resume(d)


def test_distcp_truncated(saved, tmp_path):
    d, folder = _copy(saved, tmp_path)
    for f in folder.glob("*.distcp"):
        f.write_bytes(f.read_bytes()[:64])
    with pytest.raises(TrainmathError, match=r"cannot load .*step-000001: its .metadata or .distcp"):
        _resume(d)


def test_changed_model_shape(saved, tmp_path):
    d, _ = _copy(saved, tmp_path)
    with pytest.raises(TrainmathError, match=r"cannot load .*another model shape"):
        _resume(d, overrides={**SHRINK, "hidden": 64})


def test_fifo_metadata_does_not_hang(saved, tmp_path):
    d, folder = _copy(saved, tmp_path)
    (folder / ".metadata").unlink()
    os.mkfifo(folder / ".metadata")
    result = {}

    def attempt():
        try:
            _resume(d)
        except TrainmathError as e:
            result["error"] = str(e)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "--resume blocked on a FIFO"
    assert ".metadata is not a regular file" in result["error"]


def test_failed_save_leaves_no_tmp(tmp_path, monkeypatch):
    """A full disk while saving (a write that fails with ENOSPC, mocked: the ranks are forked and inherit it)."""
    import torch.distributed.checkpoint as dcp

    def full_disk(state, checkpoint_id, process_group):
        os.makedirs(checkpoint_id, exist_ok=True)
        with open(os.path.join(checkpoint_id, f"__{os.getpid()}_0.distcp"), "wb") as f:
            f.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp, "save", full_disk)
    d = tmp_path / "ck"
    with pytest.raises(TrainmathError, match=r"cannot save the checkpoint of step 1 .*No space left on device.*"
                                             r"step-000001.tmp was removed"):
        run(2, checkpoint_dir=str(d), checkpoint_every=1, stop_after=1)
    assert os.listdir(d) == []


@pytest.mark.parametrize("where,needle", [("/dev/null/ck", "/dev/null is not a folder"),
                                          ("{file}", "is not a folder"),
                                          ("/proc/ck", "cannot write in /proc")])
def test_unwritable_checkpoint_dir_is_refused_before_training(where, needle, tmp_path):
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(TrainmathError, match=needle):
        validate(config(checkpoint_dir=where.replace("{file}", str(file))), 2)
    assert os.listdir(tmp_path) == ["a-file"]  # the probe left nothing
