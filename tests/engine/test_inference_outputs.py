"""``predict``'s output plan, checked before anything is loaded: never an input file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sciformer.engine.inference import plan_outputs
from sciformer.errors import SciformerError

SUFFIXES = (".npy", ".npz", ".ply")


def test_a_hard_link_to_the_input_is_the_input(tmp_path: Path) -> None:
    """A hard link passed every path comparison; with --overwrite its name was replaced."""
    scan = tmp_path / "room.npy"
    scan.write_bytes(b"points")
    os.link(scan, tmp_path / "link.npy")
    assert os.path.samefile(scan, tmp_path / "link.npy")  # oracle: the OS says it is the same file
    with pytest.raises(SciformerError, match="is an input file"):
        plan_outputs([scan], tmp_path / "link.npy", SUFFIXES, overwrite=True)
    os.symlink(scan, tmp_path / "sym.npy")
    with pytest.raises(SciformerError, match="is an input file"):
        plan_outputs([scan], tmp_path / "sym.npy", SUFFIXES, overwrite=True)
    (tmp_path / "other.npy").write_bytes(b"x")  # a different existing file: --overwrite may replace it
    assert plan_outputs([scan], tmp_path / "other.npy", SUFFIXES, overwrite=True) == [(scan, tmp_path / "other.npy")]


@pytest.mark.parametrize("beside", [False, True])
def test_a_name_too_long_for_the_folder_is_refused_before_anything_runs(tmp_path: Path, beside: bool) -> None:
    """The file system's NAME_MAX (255 here) counts the temporary name an output is written under
    (14 bytes longer than the name plus its suffix): a name that fits alone may not fit that."""
    source = tmp_path / "scene.npy"
    source.write_bytes(b"")
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    fits = "m" * (name_max - 14 - 4 - 4 - (len("_probabilities") if beside else 0)) + ".npy"
    extra = (lambda out: [out.with_name(out.stem + "_probabilities.npy")]) if beside else None
    assert plan_outputs([source], tmp_path / fits, (".npy",), beside=extra)  # at the limit: accepted
    too_long = "m" + fits
    with pytest.raises(SciformerError, match="choose a shorter output name"):
        plan_outputs([source], tmp_path / too_long, (".npy",), beside=extra)
    with pytest.raises(SciformerError, match="choose a shorter output name"):  # a folder output: the input's name
        plan_outputs([tmp_path / too_long], tmp_path / "out", (".npy",), many=True, beside=extra)


@pytest.mark.parametrize("name", ["scene.img.hdr", "scene.hdr", "SCENE.IMG.HDR", "scene.HDR"])
def test_a_header_the_input_would_pick_up_later_is_refused(tmp_path: Path, name: str) -> None:
    """``predict -i scene.img -o scene.img.hdr`` wrote a header that the input's reader then took
    as the input's own (before: only existing headers were protected)."""
    from sciformer.data.hsi.containers import _envi_header_for

    data = tmp_path / "scene.img"
    data.write_bytes(b"\0" * 8)
    with pytest.raises(SciformerError, match="would be read with input"):
        plan_outputs([data], tmp_path / name, (".npy", ".hdr", ".img", ".png"), overwrite=True)
    if name.islower():  # oracle: the reader pairs the data file with that header once it exists
        (tmp_path / name).write_text("ENVI\n")
        assert _envi_header_for(data) == tmp_path / name
    assert plan_outputs([data], tmp_path / "map.hdr", (".npy", ".hdr", ".img", ".png"))  # another name: fine


def test_a_map_beside_a_header_input_may_not_be_its_data_file(tmp_path: Path) -> None:
    header = tmp_path / "cube.hdr"
    header.write_text("ENVI\n")
    with pytest.raises(SciformerError, match="would be read with input|is an input file"):
        plan_outputs([header], tmp_path / "cube.img", (".npy", ".hdr", ".img"))


def test_files_read_by_their_suffix_pair_with_no_header() -> None:
    """A .npy, .npz, .mat, .lan, GeoTIFF or point file is read by its suffix's reader, which never
    looks for an ENVI header: an output `scene.hdr` beside `scene.npy` is no sidecar of it."""
    from sciformer.engine.inference import input_sidecars

    for name in ("sc.npy", "sc.npz", "sc.mat", "g.tif", "g.TIFF", "a.lan", "t.las"):
        assert input_sidecars(Path(name)) == [], name
    assert Path("scene.img.hdr") in input_sidecars(Path("scene.img"))
    assert Path("scene.hdr") in input_sidecars(Path("scene"))
