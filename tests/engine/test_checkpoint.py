import os
import pickle
from pathlib import Path

import pytest
import torch

from sciformer.engine.checkpoint import (
    checkpoint_file,
    load_checkpoint,
    save_checkpoint,
)
from sciformer.errors import CheckpointError


def _payload() -> dict:
    return {"config": {"name": "x"}, "data_info": {"num_classes": 2}, "model": {"w": torch.arange(4.0)}, "epoch": 1}


def test_round_trip_and_no_temporary_left(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint(path, _payload())
    save_checkpoint(path, {**_payload(), "epoch": 2})  # overwrite atomically
    data = load_checkpoint(path)
    assert data["epoch"] == 2 and torch.equal(data["model"]["w"], torch.arange(4.0))
    assert os.listdir(path.parent) == ["last.pt"]
    assert load_checkpoint(tmp_path)["epoch"] == 2  # a run folder resolves to checkpoints/last.pt
    with pytest.raises(CheckpointError, match="without checkpoints/best.pt"):
        load_checkpoint(tmp_path, in_run="best.pt")
    save_checkpoint(tmp_path / "checkpoints" / "best.pt", _payload())
    assert load_checkpoint(tmp_path, in_run="best.pt")["epoch"] == 1  # evaluate / predict read best.pt
    assert checkpoint_file(tmp_path, in_run="best.pt") == tmp_path / "checkpoints" / "best.pt"
    assert checkpoint_file(path, in_run="best.pt") == path  # a file is taken as it is


def test_truncated_foreign_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, _payload())
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or not a torch file"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match="not a sciformer checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    text = tmp_path / "text.pt"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="truncated or not a torch file"):
        load_checkpoint(text)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format": "sciformer-checkpoint", "version": 1, "config": {}, "model": {}, "data_info": {}, "x": _Payload()}, path, pickle_protocol=pickle.DEFAULT_PROTOCOL)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(path)


def test_the_digest_is_of_the_file_loaded_even_when_the_path_is_replaced_meanwhile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run writing a new best.pt (an atomic rename) between the digest and the load: both
    come from the file that was opened, never a digest of one and tensors of the other."""
    import hashlib

    from sciformer.engine import checkpoint

    def payload(value: float) -> dict:
        return {"config": {}, "model": {"w": torch.full((4,), value)}, "data_info": {"num_classes": 2, "in_channels": 3}}

    path, newer = tmp_path / "best.pt", tmp_path / "newer.pt"
    save_checkpoint(path, payload(1.0))
    save_checkpoint(newer, payload(2.0))
    first = hashlib.sha256(path.read_bytes()).hexdigest()
    real = checkpoint.stream_sha256

    def digest_then_replace(handle):
        out = real(handle)
        os.replace(newer, path)  # what the training run does meanwhile
        return out

    monkeypatch.setattr(checkpoint, "stream_sha256", digest_then_replace)
    state, sha = checkpoint.load_checkpoint_and_digest(path)
    assert sha == first and torch.equal(state["model"]["w"], torch.full((4,), 1.0))
    assert checkpoint.load_checkpoint(path)["model"]["w"][0] == 2.0  # the path now names the newer file


@pytest.mark.parametrize("becomes", ["gone", "folder"])
def test_a_checkpoint_replaced_between_the_check_and_the_open_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                           becomes: str) -> None:
    import shutil

    from sciformer.engine import checkpoint

    path = tmp_path / "best.pt"
    save_checkpoint(path, {"config": {}, "model": {}, "data_info": {"num_classes": 2}})
    real = checkpoint.regular_file

    def then_replaced(p, what):
        out = real(p, what)
        path.unlink()
        if becomes == "folder":
            path.mkdir()
        return out

    monkeypatch.setattr(checkpoint, "regular_file", then_replaced)
    with pytest.raises(CheckpointError, match="best.pt"):
        checkpoint.load_checkpoint(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("where", ["tensor", "records"])
def test_a_flipped_bit_anywhere_in_a_member_is_refused(tmp_path: Path, where: str) -> None:
    """torch.load itself loads a tensor with a flipped bit silently; the zip's CRC-32 (zipfile's own
    reading as the oracle) catches a change in any member."""
    import zipfile

    path = tmp_path / "last.pt"
    save_checkpoint(path, {**_payload(), "model": {"w": torch.arange(1000.0)}})
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
    info = next(m for m in infos if (m.filename.endswith("/data/0") if where == "tensor" else m.filename.endswith("data.pkl")))
    raw = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26 : info.header_offset + 28], "little"), int.from_bytes(
        raw[info.header_offset + 28 : info.header_offset + 30], "little"
    )  # the local header's own lengths (torch pads its extra field to align the data)
    start = info.header_offset + 30 + name_len + extra_len
    for offset in (0, info.file_size // 2, info.file_size - 1):
        flipped = bytearray(raw)
        flipped[start + offset] ^= 0x01
        bad = tmp_path / f"bad{offset}.pt"
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match=r"is damaged|truncated or not a torch file|not a sciformer checkpoint"):
            load_checkpoint(bad)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.arange(1000.0))


def test_a_checkpoint_written_without_crcs_loads(tmp_path: Path) -> None:
    """torch.serialization.set_crc32_options(False) (a documented speed option) writes CRC 0 for every
    member: that is no checksum to compare against, not damage."""
    import zipfile

    set_crc = getattr(torch.serialization, "set_crc32_options", None)
    if set_crc is None:
        pytest.skip("this torch has no set_crc32_options")
    path = tmp_path / "nocrc.pt"
    set_crc(False)
    try:
        save_checkpoint(path, _payload())
    finally:
        set_crc(True)
    with zipfile.ZipFile(path) as archive:
        assert all(m.CRC == 0 for m in archive.infolist() if m.file_size)  # oracle: the zip itself
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.arange(4.0))


def test_a_member_whose_true_crc_is_zero_is_still_checked(tmp_path: Path) -> None:
    """Only a file without any CRC (every member 0) goes unchecked: a tensor whose bytes happen to
    have CRC-32 0 keeps its check, so a flipped bit in it is refused."""
    import zlib

    data = bytes([1, 2, 3, 4, 80, 241, 229, 219])
    assert zlib.crc32(data) == 0  # oracle: zlib
    path = tmp_path / "zero.pt"
    save_checkpoint(path, {**_payload(), "model": {"w": torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()}})
    raw = bytearray(path.read_bytes())
    at = raw.find(data)
    raw[at] ^= 0x01
    (tmp_path / "flipped.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="is damaged"):
        load_checkpoint(tmp_path / "flipped.pt")
    assert load_checkpoint(path)["model"]["w"].tolist() == list(data)
