"""Files of the splits: no file in two splits under any name or as a byte-identical copy."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sciformer.data.pointcloud import split_files
from sciformer.data.pointcloud.split_files import check_disjoint_splits, scene_names
from sciformer.errors import DataError

SPAN = 1 << 13  # the ends read by the first test


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_copy_in_another_split_is_refused_by_name(tmp_path: Path) -> None:
    a = write(tmp_path / "a.las", b"x" * 1000 + b"tile-a")
    b = write(tmp_path / "b.las", b"y" * 1006)
    copy = tmp_path / "sub" / "renamed.las"
    copy.parent.mkdir()
    shutil.copyfile(a, copy)
    with pytest.raises(DataError, match=r"data.test_files: renamed.las has the same bytes as .*a.las in data.train_files; "
                                        r"splits must not share tiles"):
        check_disjoint_splits({"train": [a, b], "val": [], "test": [copy]}, "tiles")
    check_disjoint_splits({"train": [a, copy], "val": [b], "test": []})  # a copy within one split is allowed


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_files_of_one_size_that_differ_anywhere_are_different(tmp_path: Path, where: str) -> None:
    size = 3 * SPAN + 5  # the middle lies outside both ends read by the first test
    data = bytearray(random.Random(0).randbytes(size))
    a = write(tmp_path / "a.bin", bytes(data))
    data[{"first": 0, "middle": size // 2, "last": size - 1}[where]] ^= 0xFF
    b = write(tmp_path / "b.bin", bytes(data))
    check_disjoint_splits({"train": [a], "val": [b], "test": []})


def test_empty_files_are_left_to_their_reader(tmp_path: Path) -> None:
    check_disjoint_splits({"train": [write(tmp_path / "a.npy", b"")], "val": [write(tmp_path / "b.npy", b"")], "test": []})


def test_only_files_of_a_shared_size_in_two_splits_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    for name in ("ends_sha256", "file_sha256"):
        fn = getattr(split_files, name)
        monkeypatch.setattr(split_files, name, lambda p, _fn=fn: (read.append(p.name), _fn(p))[1])
    files = {n: write(tmp_path / n, bytes([i]) * (100 + i)) for i, n in enumerate("abcde")}
    check_disjoint_splits({"train": [files["a"], files["b"]], "val": [files["c"]], "test": [files["d"], files["e"]]})
    assert read == []  # all sizes differ
    twin = write(tmp_path / "twin", bytes([9]) * 100)  # a's size, other bytes, in the same split as a
    check_disjoint_splits({"train": [files["a"], twin], "val": [files["c"]], "test": []})
    assert read == []
    other = write(tmp_path / "other", bytes([9]) * 102)  # c's size in another split, other bytes
    check_disjoint_splits({"train": [files["a"]], "val": [files["c"]], "test": [other]})
    assert sorted(read) == ["c", "other"]  # their ends differ: neither is read whole


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.sampled_from([1, 7, SPAN, 2 * SPAN + 3])),
                min_size=1, max_size=8), st.integers(0, 2**31))
def test_refused_exactly_when_some_content_is_in_two_splits(tmp_path_factory: pytest.TempPathFactory,
                                                            files: list[tuple[int, int, int]], seed: int) -> None:
    """Files drawn from a few contents (some of one size, differing in one middle byte):
    refused if and only if one content is listed in two splits."""
    root = tmp_path_factory.mktemp("splits")
    rng = random.Random(seed)
    contents = {}
    paths: dict[str, list[Path]] = {"train": [], "val": [], "test": []}
    for i, (split, content, size) in enumerate(files):
        if (content, size) not in contents:
            data = bytearray(rng.randbytes(size))
            data[size // 2] = content  # contents of one size differ (only) here
            data[0] = data[-1] = 0
            contents[(content, size)] = bytes(data)
        name = list(paths)[split]
        paths[name].append(write(root / f"{i}.bin", contents[(content, size)]))
    splits_of: dict[bytes, set[int]] = {}
    for split, content, size in files:
        splits_of.setdefault(contents[(content, size)], set()).add(split)
    shared = any(len(s) > 1 for s in splits_of.values())
    if shared:
        with pytest.raises(DataError, match="has the same bytes as .* splits must not share files"):
            check_disjoint_splits(paths)
    else:
        check_disjoint_splits(paths)


def test_a_file_that_cannot_be_read_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = write(tmp_path / "a.las", b"a" * 50), write(tmp_path / "b.las", b"b" * 50)

    def denied(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(split_files, "ends_sha256", denied)
    with pytest.raises(DataError, match=r"^data.train_files: .*a.las: cannot read \(Permission denied\)$"):
        check_disjoint_splits({"train": [a], "val": [b], "test": []})
    gone = tmp_path / "gone.las"  # listed, then removed before the check
    with pytest.raises(DataError, match=r"^data.val_files: .*gone.las: cannot read \(No such file or directory\)$"):
        check_disjoint_splits({"train": [a], "val": [gone], "test": []})


def test_scene_names_are_distinct_and_keep_unshared_stems(tmp_path: Path) -> None:
    """Each file of a split names its own predictions: the stem where no other file shares it,
    else its path from the shared folder (or, where only the suffix differs, with the suffix)."""
    paths = [tmp_path / "a" / "t_points.npy", tmp_path / "b" / "c" / "t_points.npy", tmp_path / "x.npy",
             tmp_path / "d" / "s.npy", tmp_path / "d" / "s.ply"]
    assert scene_names(paths, "data.test_files") == ["a__t_points", "b__c__t_points", "x", "s_npy", "s_ply"]
    with pytest.raises(DataError, match=r"data.test_files: .*a__t_points.npy and .*t_points.npy would both write predictions named 'a__t_points'"):
        scene_names([tmp_path / "a__t_points.npy", tmp_path / "a" / "t_points.npy", tmp_path / "b" / "t_points.npy"],
                    "data.test_files")
