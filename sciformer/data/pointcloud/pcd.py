"""PCD files (Point Cloud Library): ascii, binary and binary_compressed (built-in LZF decoder)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from sciformer.data.pointcloud.fields import PointData, cast_text_values, fail, from_named_columns
from sciformer.errors import DataError
from sciformer.utils.limits import check_bytes, header_line

_PCD_TYPES = {("F", 4), ("F", 8), *((t, s) for t in "IU" for s in (1, 2, 4, 8))}
LZF_MAX_RATIO = 150  # a 264-byte back-reference costs LZF at least 2 bytes of stream
MAX_PCD_RECORD = 1 << 20  # bytes per point; PCL's largest descriptors (e.g. SHOT, 352 floats) are about 1.4 KB


def lzf_decompress(data: bytes, out_len: int) -> bytes:
    """Decode an LZF stream (as used by PCD ``binary_compressed``) of known output size."""
    out = bytearray(out_len)
    i = o = 0
    n = len(data)
    while i < n:
        ctrl = data[i]
        i += 1
        if ctrl < 32:  # literal run of ctrl + 1 bytes
            length = ctrl + 1
            if i + length > n or o + length > out_len:
                raise ValueError("literal run past the end")
            out[o : o + length] = data[i : i + length]
            i += length
            o += length
            continue
        length = ctrl >> 5
        if length == 7:
            if i >= n:
                raise ValueError("truncated back-reference")
            length += data[i]
            i += 1
        if i >= n:
            raise ValueError("truncated back-reference")
        ref = o - ((ctrl & 0x1F) << 8) - 1 - data[i]
        i += 1
        length += 2
        if ref < 0 or o + length > out_len:
            raise ValueError("back-reference out of range")
        if ref + length <= o:
            out[o : o + length] = out[ref : ref + length]
        else:  # overlapping copy, byte by byte
            for k in range(length):
                out[o + k] = out[ref + k]
        o += length
    if o != out_len:
        raise ValueError(f"decoded {o} bytes, header says {out_len}")
    return bytes(out)


def read_pcd_header(fh: BinaryIO, max_lines: int = 200) -> dict[str, list[str]] | None:
    """The PCD header keys (upper case) and their words, up to and including ``DATA``, read
    from ``fh`` at the file start; None when no ``DATA`` line comes within ``max_lines``."""
    header: dict[str, list[str]] = {}
    for _ in range(max_lines):
        raw = header_line(fh, getattr(fh, "name", "PCD file"))
        if not raw:
            return None
        words = raw.decode("ascii", errors="replace").split()
        if not words or words[0].startswith("#"):
            continue
        header[words[0].upper()] = words[1:]
        if words[0].upper() == "DATA":
            return header
    return None


def _ascii_word_error(path: Path, body_start: int) -> DataError:
    """The error for an ascii PCD body holding a word that is not a number: its file line."""
    with open(path, "rb") as fh:
        lineno = fh.read(body_start).count(b"\n")
        for raw in fh:
            lineno += 1
            for word in raw.decode("ascii", errors="replace").split():
                try:
                    float(word)
                except ValueError:
                    return fail(f"{path}:{lineno}", f"ascii PCD value {word[:40]!r} is not a number")
    return fail(path, "ascii PCD data holds a value that is not a number")


def read_pcd(path: Path, keep_invalid: bool = False) -> PointData:
    """Read a PCD file; organised clouds' NaN holes are dropped unless ``keep_invalid``
    (then every point stays, in file order, and the caller masks the holes)."""
    with open(path, "rb") as fh:
        header = read_pcd_header(fh)
        if header is None:
            raise fail(path, "PCD header has no DATA line")
        body_start = fh.tell()
        body = fh.read()
    try:
        fields = header["FIELDS"]
        sizes = [int(s) for s in header["SIZE"]]
        types = header["TYPE"]
        counts = [int(c) for c in header.get("COUNT", ["1"] * len(fields))]
        npoints = int(header["POINTS"][0]) if "POINTS" in header else int(header["WIDTH"][0]) * int(header["HEIGHT"][0])
        mode = header["DATA"][0].lower()
        grid = int(header["WIDTH"][0]) * int(header["HEIGHT"][0]) if "WIDTH" in header and "HEIGHT" in header else npoints
    except (KeyError, IndexError, ValueError) as exc:
        raise fail(path, f"bad PCD header (missing or malformed {exc})") from exc
    if grid != npoints:  # PCL refuses this too: which count is right cannot be told
        raise fail(path, f"bad PCD header: WIDTH x HEIGHT = {grid} but POINTS {npoints}")
    if npoints < 0 or min(counts, default=1) < 1:
        raise fail(path, f"bad PCD header (POINTS {npoints}, COUNT {counts}); expected non-negative points and counts >= 1")
    if not (len(fields) == len(sizes) == len(types) == len(counts)):
        raise fail(path, "PCD header FIELDS, SIZE, TYPE and COUNT have different lengths")
    record = sum(size * count for size, count in zip(sizes, counts, strict=True))  # bytes per point
    if record > MAX_PCD_RECORD:  # before numpy builds a record type of that size
        raise fail(path, f"bad PCD header: points of {record} bytes (COUNT {' '.join(header.get('COUNT', []))[:80]}); "
                         f"expected at most {MAX_PCD_RECORD}")
    named = [f for f in fields if f != "_"]  # '_' pads records, possibly several times
    if len(set(named)) != len(named):
        raise fail(path, f"PCD header repeats a field name ({' '.join(fields)[:80]})")
    fields = [f if f != "_" else f" _{i}" for i, f in enumerate(fields)]  # one unique name per pad (no name has a space)
    for t, size in zip(types, sizes, strict=True):
        if (t.upper(), size) not in _PCD_TYPES:
            raise fail(path, f"unsupported PCD TYPE/SIZE {t}/{size}; expected F 4/8, I or U 1/2/4/8")
    kinds = {"F": "f", "I": "i", "U": "u"}
    try:
        dtypes = [np.dtype(f"<{kinds[t.upper()]}{s}") for t, s in zip(types, sizes, strict=True)]
    except (KeyError, TypeError) as exc:
        raise fail(path, f"unsupported PCD TYPE/SIZE {types}/{sizes}") from exc
    columns: dict[str, np.ndarray] = {}
    if mode == "ascii":
        text = body.decode("ascii", errors="replace").split()
        width = sum(counts)
        if len(text) < width * npoints:
            raise fail(path, f"truncated PCD: {len(text)} values for {npoints} points of {width}")
        try:
            table = np.asarray(text[: width * npoints], dtype=np.float64).reshape(npoints, width)  # (n, width)
        except ValueError:
            raise _ascii_word_error(path, body_start) from None
        col = 0
        for name, dt, c in zip(fields, dtypes, counts, strict=True):
            raw = table[:, col : col + c]  # (n, c)
            if name in ("rgb", "rgba"):  # packed colour: 4 bytes, viewed as uint32 below
                if dt.kind == "f" and _packed_as_integers(raw):  # PCL's uint32 text; a hole's nan packs no colour
                    raw = np.where(np.isfinite(raw), raw, 0)
                    dt = np.dtype(np.uint32)
                dt = np.dtype(np.float32 if dt.kind == "f" else np.uint32)
            values = cast_text_values(path, raw, dt, f"field '{name}'")  # (n, c)
            columns[name] = values[:, 0] if c == 1 else values
            col += c
    elif mode == "binary":
        dtype = np.dtype([(name, dt, (c,)) if c > 1 else (name, dt) for name, dt, c in zip(fields, dtypes, counts, strict=True)])
        if len(body) < dtype.itemsize * npoints:
            raise fail(path, f"truncated PCD: {len(body)} bytes for {npoints} points of {dtype.itemsize}")
        arr = np.frombuffer(body, dtype=dtype, count=npoints)
        columns = {name: arr[name] for name in fields}
    elif mode == "binary_compressed":
        if len(body) < 8:
            raise fail(path, "truncated PCD binary_compressed block")
        csize, usize = np.frombuffer(body[:8], dtype="<u4")
        expected = npoints * sum(dt.itemsize * c for dt, c in zip(dtypes, counts, strict=True))
        if int(usize) > LZF_MAX_RATIO * max(int(csize), 1):  # LZF cannot compress further: a forged header
            raise fail(path, f"corrupt PCD binary_compressed header: {int(usize)} bytes from {int(csize)} compressed is beyond LZF's ratio")
        check_bytes(int(usize), str(path), "decompressed PCD block")
        if int(usize) != expected:  # checked before allocating the output buffer
            raise fail(path, f"corrupt PCD binary_compressed header: {int(usize)} uncompressed bytes, expected {expected} for {npoints} points")
        try:
            raw = lzf_decompress(body[8 : 8 + int(csize)], int(usize))
        except ValueError as exc:
            raise fail(path, f"corrupt PCD binary_compressed data ({exc})") from exc
        pos = 0
        for name, dt, c in zip(fields, dtypes, counts, strict=True):  # column-major layout
            nbytes = dt.itemsize * c * npoints
            values = np.frombuffer(raw, dtype=dt, count=c * npoints, offset=pos)
            columns[name] = values if c == 1 else values.reshape(npoints, c)
            pos += nbytes
    else:
        raise fail(path, f"unknown PCD DATA mode {mode!r}; expected ascii, binary or binary_compressed")
    for name in ("rgb", "rgba"):
        if name in columns:
            packed = np.ascontiguousarray(columns.pop(name)).view(np.uint32)  # (n,)
            columns["red"] = ((packed >> 16) & 255).astype(np.uint8)
            columns["green"] = ((packed >> 8) & 255).astype(np.uint8)
            columns["blue"] = (packed & 255).astype(np.uint8)
    columns = {k: v for k, v in columns.items() if not k.startswith(" _")}  # the padding
    columns = {k: v for k, v in columns.items() if v.ndim == 1}  # per-point scalars only
    out = from_named_columns(path, columns)
    keep = np.all(np.isfinite(out["coord"]), axis=1)  # organised clouds mark holes with NaN
    if not keep.all() and not keep_invalid:
        n = out["coord"].shape[0]
        out = {k: (v[keep] if isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == n else v)
               for k, v in out.items()}
    return out


def _packed_as_integers(values: np.ndarray) -> bool:
    """Whether an ascii ``rgb`` / ``rgba`` column declared ``F 4`` holds its packed colours as uint32
    integers, as PCL's own ascii writer prints them (``1193046`` for 0x00123456), rather than as the
    packed float's value (``1.671834e-39``): every finite value a whole number in [0, 2^32). A packed float
    prints whole only for alpha bytes 0x3F-0x4B, which colour writers do not use.

    Shapes:
        values: (n, c) float64 -> bool
    """
    seen = values[np.isfinite(values)]  # holes (nan rows of an organised cloud) decide nothing
    return bool(seen.size) and bool(np.all((seen >= 0) & (seen < 2**32) & (seen == np.floor(seen))))
