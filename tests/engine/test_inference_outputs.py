"""``predict``'s inputs and output plan, checked before anything is loaded: never an input file
written over, never an input left out unsaid."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sciformer.engine.inference import expand_inputs, plan_outputs
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


_UNREADABLE = {  # an entry named as an input that is no readable regular file -> the kind a message names
    "link to a tile on an unmounted drive": (lambda p: p.symlink_to("/mnt/unmounted/tile_b.las"), "a link to nothing, or a loop"),
    "FIFO": (os.mkfifo, "a FIFO"),
    "/dev/zero link": (lambda p: p.symlink_to("/dev/zero"), "a device"),
    "folder named like a file": (Path.mkdir, "is a folder"),
}


@pytest.mark.parametrize("case", list(_UNREADABLE))
def test_an_entry_of_a_folder_or_glob_that_cannot_be_read_stops_the_command(tmp_path: Path, case: str) -> None:
    """A folder or glob --input left such an entry out with no word and predicted the rest (exit 0),
    where the same entry alone was a one-line error."""
    make, kind = _UNREADABLE[case]
    tiles = tmp_path / "tiles"
    tiles.mkdir()
    (tiles / "a_good.npy").write_bytes(b"points")
    bad = tiles / "b_bad.las"
    make(bad)
    assert not bad.is_file()  # oracle: the OS says it is no regular file
    for spec in (str(tiles), str(tiles / "*")):
        with pytest.raises(SciformerError) as e:
            expand_inputs([spec])
        assert str(e.value).startswith(f"--input '{spec}': '{bad}' ") and kind in str(e.value) and "\n" not in str(e.value)
    if not bad.is_dir():  # alone: refused too, in the same words (a folder alone is a folder input)
        with pytest.raises(SciformerError, match=re.escape(f"--input '{bad}' is not a regular file or folder ({kind})")):
            expand_inputs([str(bad)])


def test_an_entry_without_permission_stops_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.npy").write_bytes(b"points")
    (tmp_path / "b.npy").write_bytes(b"points")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p).name != "b.npy" and real(p, mode))  # as for chmod 000, not root
    with pytest.raises(SciformerError, match=re.escape(f"'{tmp_path / 'b.npy'}' cannot be read (Permission denied)")):
        expand_inputs([str(tmp_path)])


def test_what_is_no_input_by_its_name_stays_out_of_a_folder_or_glob(tmp_path: Path) -> None:
    (tmp_path / "a.npy").write_bytes(b"points")
    (tmp_path / "notes.md").write_text("a glob takes it; its reader then names it")
    (tmp_path / "sub").mkdir()  # a sub-folder: no input
    (tmp_path / ".hidden.las").symlink_to("/mnt/unmounted/x.las")  # hidden: no input of a folder
    assert expand_inputs([str(tmp_path)]) == [tmp_path / "a.npy"]
    assert expand_inputs([str(tmp_path / "*")]) == [tmp_path / "a.npy", tmp_path / "notes.md"]


def test_a_refused_output_names_what_was_given_then_the_file_it_writes(tmp_path: Path) -> None:
    header = tmp_path / "cp.hdr"
    header.write_text("ENVI\n")
    given = tmp_path / "cp.img"  # an ENVI map: it writes cp.hdr, the input
    with pytest.raises(SciformerError, match=rf"^--output '{given}': '{header}' is an input file"):
        plan_outputs([header], given, (".npy", ".hdr", ".img"))
    with pytest.raises(SciformerError, match=rf"^--output '{header}' is an input file"):  # the file given: named once
        plan_outputs([header], header, (".npy", ".hdr", ".img"))
