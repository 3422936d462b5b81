from pathlib import Path

from sciformer.data.pointcloud.label_files import label_file_of, labelled_by, read_beside


def test_one_rule_names_the_label_file_of_a_point_file() -> None:
    pts = Path("/data/seq_00_points.npy")
    assert label_file_of(pts, ("_points.npy", "_labels.npy")) == Path("/data/seq_00_labels.npy")
    assert label_file_of(pts, (".bin", ".label")) is None and label_file_of(pts, None) is None
    assert read_beside(pts, {"label_files": ["_points.npy", "_labels.npy"]}) == [Path("/data/seq_00_labels.npy")]
    assert read_beside(pts, {}) == []
    assert labelled_by(Path("/data/seq_00_labels.npy"), {"label_files": ["_points.npy", "_labels.npy"]}) is None  # no such file


def test_an_output_is_labelled_by_the_existing_point_file_whose_label_file_it_is(tmp_path: Path) -> None:
    state = {"label_files": ["_points.npy", "_labels.npy"]}
    (tmp_path / "b_points.npy").write_bytes(b"")
    assert labelled_by(tmp_path / "b_labels.npy", state) == tmp_path / "b_points.npy"
    assert labelled_by(tmp_path / "c_labels.npy", state) is None  # no c_points.npy: no one's truth
    assert labelled_by(tmp_path / "b_labels.npy", {}) is None  # the model reads no label files
    (tmp_path / "d_points.npy").mkdir()  # a folder is no point file
    assert labelled_by(tmp_path / "d_labels.npy", state) is None
