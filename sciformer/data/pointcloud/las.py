"""LAS/LAZ files through laspy (``pip install "laspy[lazrs]"`` for .laz)."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.pointcloud.fields import PointData, fail, scale_colour
from sciformer.utils.limits import read_errors, regular_file

# LAZ compresses points 5-15x in practice; a header promising more than this many times
# the file's size in point records is damaged (the decoder would allocate it up front).
MAX_LAZ_RATIO = 100
# Points per LAZ chunk (laszip's default is 50,000; 2**32 - 1 means variable-sized
# chunks). The decoder allocates a chunk's worth up front, so a damaged value would
# ask for gigabytes.
MAX_LAZ_CHUNK = 10_000_000
_VARIABLE_CHUNKS = 0xFFFFFFFF
VLR_HEADER, EVLR_HEADER = 54, 60  # bytes before each (extended) variable-length record's data


def check_record_counts(path: str | os.PathLike[str]) -> None:
    """Refuse a header listing more (extended) variable-length records than the file can hold.

    laspy reads every listed record before anything else, so a damaged count of 4e9 would
    take memory without bound. VLRs lie between the header and the point data; EVLRs (LAS
    1.4) from their start to the end of the file. Byte offsets are those of the LAS spec.
    """
    size = Path(path).stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(247)
    if len(head) < 104 or head[:4] != b"LASF":
        return  # not a LAS header: laspy says so
    header_size = int.from_bytes(head[94:96], "little")
    offset = int.from_bytes(head[96:100], "little")  # offset_to_point_data
    if header_size < 227:  # the LAS 1.0 header's size; later versions only add to it
        raise fail(path, f"LAS header size {header_size} is below the 227 bytes of every LAS header; the file is damaged")
    if offset < header_size:
        raise fail(path, f"LAS header puts the points at byte {offset}, inside its own {header_size}-byte header; "
                         "the file is damaged")
    room = offset - header_size  # bytes between header and points
    vlrs = int.from_bytes(head[100:104], "little")
    if vlrs * VLR_HEADER > room:
        raise fail(path, f"LAS header lists {vlrs} variable-length records, more than the {room} bytes "
                         "between its header and its points can hold; the file is damaged")
    if head[25] >= 4 and len(head) == 247:  # version 1.4
        start = int.from_bytes(head[235:243], "little")
        evlrs = int.from_bytes(head[243:247], "little")
        if evlrs and (start > size or evlrs * EVLR_HEADER > size - start):
            raise fail(path, f"LAS header lists {evlrs} extended variable-length records from byte {start}, more than the "
                             f"{size}-byte file can hold; the file is damaged or truncated")


def check_point_count(path: Path, header: object) -> None:
    """Refuse a header whose point count the file cannot hold (damaged or truncated).

    LAS stores records uncompressed: ``offset_to_point_data + count * record_length``
    must fit in the file. LAZ may compress, but not beyond :data:`MAX_LAZ_RATIO`.
    """
    size = Path(path).stat().st_size
    scales = [float(v) for v in header.scales]  # type: ignore[attr-defined]
    offsets = [float(v) for v in header.offsets]  # type: ignore[attr-defined]
    if not all(math.isfinite(v) and v != 0 for v in scales) or not all(math.isfinite(v) for v in offsets):
        raise fail(path, f"LAS header scale {scales} / offset {offsets}: scales must be finite and non-zero, offsets finite")
    if not all(math.isfinite(abs(s) * 2.0**31 + abs(o)) for s, o in zip(scales, offsets)):  # int32 records * scale + offset
        raise fail(path, f"LAS header scale {scales} / offset {offsets}: coordinates would overflow float64; the header is damaged")
    count = int(header.point_count)  # type: ignore[attr-defined]
    record = int(header.point_format.size)  # type: ignore[attr-defined]
    payload = max(0, size - int(header.offset_to_point_data))  # type: ignore[attr-defined]
    compressed = bool(header.are_points_compressed)  # type: ignore[attr-defined]
    limit = payload * MAX_LAZ_RATIO if compressed else payload
    if count * record > limit:
        what, ratio = ("LAZ", f" at up to {MAX_LAZ_RATIO}:1 compression") if compressed else ("LAS", "")
        raise fail(path, f"{what} header declares {count} points of {record} bytes, more than the "
                         f"{size}-byte file can hold{ratio}; the file is damaged or truncated")
    if not compressed:  # records beyond the declared count would be dropped without a word
        ends = [size]
        if int(getattr(header, "number_of_evlrs", 0) or 0):
            ends.append(int(getattr(header, "start_of_first_evlr", 0) or size))  # 1.4: EVLRs follow the points
        waveform = int(getattr(header, "start_of_waveform_data_packet_record", 0) or 0)
        if waveform > int(header.offset_to_point_data):  # type: ignore[attr-defined]  # 1.3+: internal waveform packets
            ends.append(waveform)
        held = max(0, min(ends) - int(header.offset_to_point_data)) // record  # type: ignore[attr-defined]
        if held > count:  # a damaged count, or bytes another writer appended: say so, read what the header declares
            warnings.warn(f"{path}: the LAS header declares {count} points but {held - count} more point records' worth "
                          f"of bytes follow them; only {count} are read (if the count is damaged, rewrite it, e.g. with "
                          "laspy or lasinfo -repair)", stacklevel=2)
    if compressed:
        chunk = laz_chunk_size(header)
        if chunk is not None and chunk != _VARIABLE_CHUNKS and chunk > MAX_LAZ_CHUNK:
            raise fail(path, f"LAZ chunk size {chunk} points is beyond any writer's ({MAX_LAZ_CHUNK}); the laszip record is damaged")
        chunks = check_chunk_table(path, int(header.offset_to_point_data), count, size)  # type: ignore[attr-defined]
        if chunk is not None and chunk != _VARIABLE_CHUNKS and chunk > 0 and chunks > 1:
            held = (chunks - 1) * chunk + 1  # every chunk but the last is full; the last holds at least one point
            if held > count:  # laspy decodes what the header declares: the rest would be dropped without a word
                warnings.warn(f"{path}: the LAZ header declares {count} points but its chunk table lists {chunks} chunks "
                              f"of {chunk}, at least {held - count} more points; only {count} are read (if the count "
                              "is damaged, rewrite it, e.g. with laspy or lasinfo -repair)", stacklevel=2)


def check_chunk_table(path: Path, point_offset: int, count: int, size: int) -> int:
    """The LAZ chunk table must lie inside the file and list no more chunks than points.

    Returns the number of chunks the table lists.

    The point data starts with the table's offset (int64; -1: stored in the file's last
    8 bytes); the table starts with a version and the number of chunks (uint32 each).
    """
    with open(path, "rb") as fh:
        fh.seek(point_offset)
        head = fh.read(8)
        if len(head) < 8:
            raise fail(path, "LAZ point data is missing (file truncated)")
        offset = int.from_bytes(head, "little", signed=True)
        if offset == -1:
            fh.seek(max(0, size - 8))
            offset = int.from_bytes(fh.read(8), "little", signed=True)
        if not point_offset + 8 <= offset <= size - 8:
            raise fail(path, f"LAZ chunk table offset {offset} lies outside the {size}-byte file; the file is damaged or truncated")
        fh.seek(offset)
        table = fh.read(8)
    chunks = int.from_bytes(table[4:8], "little")
    if chunks > max(1, count):
        raise fail(path, f"LAZ chunk table lists {chunks} chunks for {count} points; the file is damaged")
    return chunks


def laz_chunk_size(header: object) -> int | None:
    """Points per chunk from the header's laszip VLR (None when it has none)."""
    for vlr in getattr(header, "vlrs", []):
        if getattr(vlr, "user_id", "") == "laszip encoded" and getattr(vlr, "record_id", None) == 22204:
            data = vlr.record_data_bytes() if hasattr(vlr, "record_data_bytes") else getattr(vlr, "record_data", b"")
            if len(data) >= 16:
                return int.from_bytes(data[12:16], "little")  # after compressor, coder, version, revision, options
    return None


@contextmanager
def laspy_errors(path: str | os.PathLike[str], what: str, verb: str = "read") -> Iterator[None]:
    """Turn any laspy failure into one line naming ``path``.

    laspy raises several types, and lazrs panics derive from BaseException, so
    everything but interrupts is caught.
    """
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise fail(path, f"cannot {verb} {what} ({type(exc).__name__}: {exc})") from exc


def read_las_header(path: str | os.PathLike[str]) -> Any:
    """The laspy header of a LAS/LAZ file (points are not read)."""
    try:
        import laspy
    except ImportError as exc:  # pragma: no cover - laspy is a declared extra
        raise fail(path, 'reading LAS/LAZ needs laspy: pip install "laspy[lazrs]"') from exc
    regular_file(path, "LAS/LAZ file")
    with read_errors(path):  # also reached outside read_point_file (las_has_rgb)
        check_record_counts(path)
    with laspy_errors(path, "LAS/LAZ header"), laspy.open(path) as reader:
        return reader.header


def read_las(path: Path) -> PointData:
    import laspy

    check_point_count(path, read_las_header(path))  # before the decoder allocates what the header claims
    with laspy_errors(path, "LAS/LAZ"):
        las = laspy.read(path)
    coord = np.stack([np.asarray(las.x), np.asarray(las.y), np.asarray(las.z)], axis=1)  # (n, 3) float64
    out: PointData = {"coord": coord.astype(np.float64)}
    dims = set(las.point_format.dimension_names)
    if {"red", "green", "blue"} <= dims:
        rgb = np.stack([np.asarray(las.red), np.asarray(las.green), np.asarray(las.blue)], axis=1)  # (n, 3) uint16
        out["colour"] = scale_colour(rgb)
    out["intensity"] = np.asarray(las.intensity, dtype=np.float32)  # (n,)
    out["label"] = np.asarray(las.classification, dtype=np.int64)  # (n,) ASPRS codes
    return out


def las_has_rgb(path: str | os.PathLike[str]) -> bool:
    """Whether a LAS/LAZ file's point format stores red/green/blue (header only)."""
    return {"red", "green", "blue"} <= set(read_las_header(path).point_format.dimension_names)
