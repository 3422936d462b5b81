"""LAS/LAZ reading through laspy: tiles written here and the real LiDAR tiles."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from sciformer.data.pointcloud.io import read_point_file
from sciformer.errors import DataError

LIDAR_TABLE = {  # from the data README: points and class counts
    "append-bug.laz": (37805, {1: 355, 2: 22859, 3: 929, 4: 1816, 5: 9974, 17: 1333, 65: 539}, True),
    "autzen_trim.laz": (110000, {1: 83893, 2: 26107}, True),
    "file_with_both_wkt_and_geotiff_vlrs.las": (25408, {2: 9808, 3: 158, 4: 724, 5: 10956, 6: 3737, 7: 25}, False),
    "las_mvk-thin.las": (6280, {1: 129, 2: 1693, 4: 141, 5: 578, 9: 37, 12: 3702}, False),
    "las_sample_c.las": (14408, {2: 1368, 3: 93, 4: 29, 5: 7, 6: 12525, 11: 2, 14: 45, 31: 339}, True),
    "las_warsaw_small.las": (3000, {0: 433, 2: 1381, 3: 257, 4: 27, 5: 902}, True),
}


@pytest.mark.parametrize("suffix", [".las", ".laz"])
def test_las_round_trip(tmp_path: Path, fakes, suffix: str) -> None:
    written = fakes.las(tmp_path / f"tile{suffix}", n=500)
    data = read_point_file(tmp_path / f"tile{suffix}")
    assert data["coord"].dtype == np.float64
    np.testing.assert_allclose(data["coord"], written["coord"], atol=1e-6)  # large coordinates intact
    np.testing.assert_array_equal(data["label"], written["classification"])
    np.testing.assert_allclose(data["colour"], written["colour"] / 65535.0, rtol=1e-6)
    np.testing.assert_array_equal(data["intensity"], written["intensity"])


def test_las_eight_bit_colour_and_no_colour(tmp_path: Path, fakes) -> None:
    written = fakes.las(tmp_path / "eight.las", n=300, eight_bit=True)
    np.testing.assert_allclose(read_point_file(tmp_path / "eight.las")["colour"], written["colour"] / 255.0, rtol=1e-6)
    fakes.las(tmp_path / "plain.las", n=300, rgb=False)
    assert "colour" not in read_point_file(tmp_path / "plain.las")


def test_las_not_a_las_file(tmp_path: Path, one_line_error) -> None:
    (tmp_path / "x.las").write_bytes(b"not las at all")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "x.las")
    one_line_error(e, "x.las", "cannot read LAS")


@pytest.mark.parametrize("name", sorted(LIDAR_TABLE))
def test_real_lidar_tiles(fakes, name: str) -> None:
    path = fakes.real_path("lidar", name)
    points, classes, has_rgb = LIDAR_TABLE[name]
    data = read_point_file(path)
    assert data["coord"].shape == (points, 3)
    codes, counts = np.unique(data["label"], return_counts=True)
    assert dict(zip(codes.tolist(), counts.tolist(), strict=True)) == classes
    assert ("colour" in data) == has_rgb
    if has_rgb:
        assert 0.0 <= data["colour"].min() and data["colour"].max() <= 1.0
        assert data["colour"].max() > 0.5  # 8-bit and 16-bit files both span the range


def _edit(path: Path, offset: int, data: bytes) -> Path:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    out = path.with_name("damaged" + path.suffix)
    out.write_bytes(bytes(raw))
    return out


def test_damaged_headers_are_refused_before_allocation(tmp_path: Path, fakes, one_line_error) -> None:
    """Counts that a damaged header inflates would make the decoder allocate gigabytes (or abort)."""
    import laspy

    las = tmp_path / "tile.las"
    fakes.las(las, n=40)
    with pytest.raises(DataError) as e:  # legacy and 1.4 point counts (offsets 107 and 247) claim 2**31 points
        read_point_file(_edit(las, 107, (2**31).to_bytes(4, "little")) if laspy.read(las).header.version.minor < 4
                        else _edit(las, 247, (2**31).to_bytes(8, "little")))
    one_line_error(e, "damaged.las", "more than the", "file can hold")

    laz = tmp_path / "tile.laz"
    fakes.las(laz, n=40)
    with laspy.open(laz) as reader:
        point_offset = reader.header.offset_to_point_data
        vlr_data = next(v for v in reader.header.vlrs if v.record_id == 22204).record_data_bytes()
    raw = laz.read_bytes()
    chunk_at = raw.index(vlr_data) + 12  # chunk size: after compressor, coder, version, revision, options
    with pytest.raises(DataError) as e:
        read_point_file(_edit(laz, chunk_at, (0xFF00C350).to_bytes(4, "little")))
    one_line_error(e, "damaged.laz", "chunk size 4278240080")
    table_at = int.from_bytes(raw[point_offset : point_offset + 8], "little", signed=True)
    with pytest.raises(DataError) as e:
        read_point_file(_edit(laz, table_at + 4, (0xFFFFFF).to_bytes(4, "little")))
    one_line_error(e, "damaged.laz", "chunk table lists 16777215 chunks for 40 points")
    with pytest.raises(DataError) as e:
        read_point_file(_edit(laz, point_offset, (10**9).to_bytes(8, "little")))
    one_line_error(e, "damaged.laz", "chunk table offset 1000000000 lies outside")


@pytest.mark.parametrize(("at", "value", "needle"), [
    (96, (10).to_bytes(4, "little"), "puts the points at byte 10, inside its own"),
    (94, (65535).to_bytes(2, "little"), "inside its own 65535-byte header"),
    (94, (100).to_bytes(2, "little"), "header size 100 is below the 227 bytes"),
])
def test_point_offset_inside_the_header_is_named(tmp_path: Path, fakes, one_line_error, at: int, value: bytes,
                                                 needle: str) -> None:
    """A point offset below the header size says so (it said '0 variable-length records, more
    than the 0 bytes between its header and its points can hold')."""
    las = tmp_path / "tile.las"
    fakes.las(las, n=10)
    with pytest.raises(DataError) as e:
        read_point_file(_edit(las, at, value))
    msg = one_line_error(e, "damaged.las", needle)
    assert "variable-length" not in msg


@pytest.mark.parametrize("suffix", [".las", ".laz"])
def test_records_the_file_holds_are_read_and_counts_beyond_it_refused(tmp_path: Path, suffix: str, one_line_error) -> None:
    """A 1.4 file with VLRs and EVLRs (one of them empty) reads; record counts the file cannot hold are refused
    before laspy reads that many records (4e9 of them took memory without bound)."""
    import laspy
    from laspy.vlrs.vlrlist import VLRList

    header = laspy.LasHeader(point_format=6, version="1.4")
    header.vlrs.append(laspy.VLR(user_id="sciformer", record_id=1, record_data=b"v" * 100))
    las = laspy.LasData(header)
    las.x, las.y, las.z = np.arange(5.0), np.arange(5.0) * 2, np.arange(5.0) * 3
    las.evlrs = VLRList([laspy.VLR(user_id="sciformer", record_id=2, record_data=b"e" * 1000),
                         laspy.VLR(user_id="sciformer", record_id=3, record_data=b"")])
    path = tmp_path / f"tile{suffix}"
    las.write(path)
    np.testing.assert_array_equal(read_point_file(path)["coord"], np.stack([las.x, las.y, las.z], 1))
    raw = path.read_bytes()
    room = int.from_bytes(raw[96:100], "little") - int.from_bytes(raw[94:96], "little")  # bytes for the VLRs
    for at, value, needle in [(100, room // 54 + 1, "variable-length records, more than the"),
                              (243, (len(raw) - int.from_bytes(raw[235:243], "little")) // 60 + 1, "extended variable-length"),
                              (235, len(raw) + 1, "extended variable-length")]:
        with pytest.raises(DataError) as e:
            read_point_file(_edit(path, at, value.to_bytes(8 if at == 235 else 4, "little")))
        one_line_error(e, f"damaged{suffix}", needle)
    with pytest.raises(DataError) as e:  # int32 records times this scale pass float64's range
        read_point_file(_edit(path, 131, struct.pack("<d", 1e300)))
    one_line_error(e, "overflow float64")


@pytest.mark.parametrize("version", ["1.2", "1.4"])
def test_a_count_below_the_records_the_file_holds_is_said(tmp_path: Path, version: str) -> None:
    """A header declaring 3 of its 5 records would drop the last 2 from training and predictions
    without a word (laspy reads what the header says): a one-line warning says so (bytes another
    writer appended look the same, so the file is still read); EVLRs after the points are not records."""
    import laspy
    from laspy.vlrs.vlrlist import VLRList

    header = laspy.LasHeader(point_format=6 if version == "1.4" else 1, version=version)
    las = laspy.LasData(header)
    las.x, las.y, las.z = np.arange(5.0), np.arange(5.0) * 2, np.arange(5.0) * 3
    if version == "1.4":
        las.evlrs = VLRList([laspy.VLR(user_id="sciformer", record_id=2, record_data=b"e" * 1000)])
    path = tmp_path / "tile.las"
    las.write(path)
    assert len(read_point_file(path)["coord"]) == 5  # EVLR bytes after the points are not counted as records
    edits = [(107, 3, 4), (247, 3, 8)] if version == "1.4" else [(107, 3, 4)]  # legacy count; 1.4's 64-bit count
    damaged = path
    for at, value, width in edits:
        damaged = _edit(damaged, at, value.to_bytes(width, "little"))
    with pytest.warns(UserWarning, match="declares 3 points but 2 more point records' worth of bytes follow them; only 3 are read"):
        assert len(read_point_file(damaged)["coord"]) == 3


def test_internal_waveform_packets_after_the_points_are_not_records(tmp_path: Path) -> None:
    """LAS 1.3 with 'waveform data packets internal': the packets follow the points (from the
    header's start_of_waveform_data_packet_record) and are read as neither points nor a damaged count."""
    import warnings

    import laspy

    header = laspy.LasHeader(point_format=4, version="1.3")
    las = laspy.LasData(header)
    las.x, las.y, las.z = np.arange(100.0), np.arange(100.0), np.arange(100.0)
    path = tmp_path / "wave.las"
    las.write(path)
    raw = bytearray(path.read_bytes())
    start = len(raw)
    raw += struct.pack("<H16sHQ32s", 0, b"LASF_Spec", 65535, 5000, b"waveform data packets") + b"\x00" * 5000
    struct.pack_into("<H", raw, 6, struct.unpack_from("<H", raw, 6)[0] | 2)  # global encoding: packets internal
    struct.pack_into("<Q", raw, 227, start)  # start of waveform data packet record
    path.write_bytes(bytes(raw))
    assert laspy.read(path).header.point_count == 100  # the oracle reads the file as valid
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_point_file(path)["coord"]) == 100


def test_laz_header_declaring_fewer_points_than_its_chunks_warns(tmp_path: Path) -> None:
    """A LAZ header whose count is below what its chunk table holds dropped the rest without a
    word (laspy decodes the declared count): the chunk count bounds the points held from below."""
    import laspy

    n = 120_000  # three chunks of the writer's 50,000 points
    header = laspy.LasHeader(point_format=1, version="1.2")
    las = laspy.LasData(header)
    rng = np.random.default_rng(0)
    las.x, las.y, las.z = rng.uniform(0, 100, (3, n))  # incompressible enough to stay within the 100:1 bound
    path = tmp_path / "tile.laz"
    las.write(path)
    with laspy.open(path) as reader:
        chunk = next(v for v in reader.header.vlrs if v.record_id == 22204).record_data_bytes()[12:16]
    assert int.from_bytes(chunk, "little") == 50_000
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_point_file(path)["coord"]) == n  # the true count: no warning
    damaged = _edit(path, 107, (40_000).to_bytes(4, "little"))
    with pytest.warns(UserWarning, match="declares 40000 points but its chunk table lists 3 chunks of 50000, at least "
                                         "60001 more points; only 40000 are read"):
        assert len(read_point_file(damaged)["coord"]) == 40_000
    slack = _edit(path, 107, (100_001).to_bytes(4, "little"))  # within the last chunk: not detectable, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_point_file(slack)["coord"]) == 100_001
