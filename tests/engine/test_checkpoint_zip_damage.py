"""Damage in a checkpoint's zip records (central directory, end records, local headers): every edit
either loads the very tensors written or is the one-line CheckpointError, never another exception
from zipfile and never other numbers. Oracle: torch.load of the undamaged file."""

import io
import random
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from sciformer.engine.checkpoint import load_checkpoint, save_checkpoint
from sciformer.errors import CheckpointError


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 6)).sum().backward()
    optimizer.step()
    path = tmp_path_factory.mktemp("ckpt") / "last.pt"
    save_checkpoint(path, {"config": {"name": "x"}, "data_info": {"num_classes": 3, "in_channels": 6}, "model": model.state_dict(),
                           "optimizer": optimizer.state_dict(), "epoch": 1, "step_in_epoch": 0, "history": [{"epoch": 0, "loss": 0.5}]})
    return path, path.read_bytes(), torch.load(path, map_location="cpu", weights_only=True)


def _load_or_refuse(path: Path, raw: bytes, reference: Any) -> str:
    path.write_bytes(raw)
    try:
        data = load_checkpoint(path)
    except CheckpointError as exc:
        assert "\n" not in str(exc)
        return "refused"
    assert _same(reference, data), "a damaged checkpoint loaded other numbers"
    return "same"


def _central_entries(raw: bytes) -> list[int]:
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        start = archive.start_dir
    at, out = start, []
    while raw[at : at + 4] == b"PK\x01\x02":
        out.append(at)
        name, extra, comment = struct.unpack_from("<3H", raw, at + 28)
        at += 46 + name + extra + comment
    return out


def _edited(raw: bytes, offset: int, value: int) -> bytes:
    out = bytearray(raw)
    out[offset] = value
    return bytes(out)


def test_named_damage_in_the_records_is_the_one_line_error(written: tuple[Path, bytes, Any], tmp_path: Path) -> None:
    """The edits zipfile answers with its own exceptions (multi-disk, newer version, encryption) and
    the one torch's reader skips (the MS-DOS folder attribute: the tensor loads as uninitialised memory)."""
    _, raw, reference = written
    first = _central_entries(raw)[0]
    locator = raw.rfind(b"PK\x06\x07")
    disks = locator + 16 if locator >= 0 else len(raw) - 22 + 4  # the zip64 locator's disk count, else the end record's disk number
    cases = {
        "multi-disk": _edited(raw, disks + 1, raw[disks + 1] ^ 0x80),  # zipfile.BadZipFile from is_zipfile
        "version 12.8": _edited(raw, first + 6, 128),  # NotImplementedError from ZipFile()
        "encrypted": _edited(raw, first + 8, raw[first + 8] | 0x01),  # RuntimeError from ZipFile.open
        "strong encryption": _edited(raw, first + 8, raw[first + 8] | 0x40),  # NotImplementedError from ZipFile.open
    }
    for index, entry in enumerate(_central_entries(raw)):
        cases[f"folder attribute {index}"] = _edited(raw, entry + 38, raw[entry + 38] | 0x10)
    for name, damaged in cases.items():
        with pytest.raises(CheckpointError, match="truncated or not a torch file|is damaged") as caught:
            load_checkpoint(_write(tmp_path / "bad.pt", damaged))
        assert "\n" not in str(caught.value), name


def _write(path: Path, raw: bytes) -> Path:
    path.write_bytes(raw)
    return path


def test_random_edits_of_the_zip_records_load_the_same_tensors_or_are_refused(written: tuple[Path, bytes, Any], tmp_path: Path) -> None:
    _, raw, reference = written
    entries = _central_entries(raw)
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        locals_ = [m.header_offset for m in archive.infolist()]
    records = list(range(entries[0], len(raw)))  # central directory, zip64 end record and locator, end record
    records += [at + k for at in locals_ for k in range(30)]  # the local headers' fixed part
    rng = random.Random(18)
    seen = {"same": 0, "refused": 0}
    for _ in range(500):
        damaged = bytearray(raw)
        for _ in range(rng.choice((1, 1, 2))):
            offset = rng.choice(records)
            damaged[offset] = damaged[offset] ^ (1 << rng.randrange(8)) if rng.random() < 0.7 else rng.randrange(256)
        seen[_load_or_refuse(tmp_path / "fuzz.pt", bytes(damaged), reference)] += 1
    assert seen["refused"] > 100 and seen["same"] > 20  # both outcomes are exercised


def test_a_checkpoint_zipped_again_with_folder_entries_loads(written: tuple[Path, bytes, Any], tmp_path: Path) -> None:
    """Unpacked and packed again stored with its folders (as `zip -0 -r` does: 'archive/' entries with
    the folder attribute and no bytes), a checkpoint holds the same tensors; it was refused as damaged."""
    _, raw, reference = written
    out = tmp_path / "repacked.pt"
    with zipfile.ZipFile(io.BytesIO(raw)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        folders = sorted({m.filename.rsplit("/", 1)[0] + "/" for m in src.infolist() if "/" in m.filename})
        for folder in folders:
            info = zipfile.ZipInfo(folder)
            info.external_attr = 0o40755 << 16 | 0x10  # what Info-ZIP writes for a folder
            dst.writestr(info, b"")
        for member in src.infolist():
            dst.writestr(member.filename, src.read(member))
    assert _same(load_checkpoint(out), reference)
