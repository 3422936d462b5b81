"""MATLAB v5 ``.mat`` files: a compressed variable's data tags checked against its dimensions.

scipy inflates as many bytes as a data element's tag claims before it compares them with the
dimensions: a 1 MB file declaring 10 x 10 x 200 doubles (which the 1000:1 rule lets through)
whose data tag claims 1 GiB of compressed zeros was inflated in full. :func:`check_v5_file`
inflates only the start of each compressed element (its flags, dimensions, name and data tags)
and refuses a data tag claiming more than 8 bytes per value, before scipy reads the file. A
complex matrix whose real data runs past that start is streamed, in bounded steps, to its
imaginary tag once the real claim has passed.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

from sciformer.errors import DataError

_FILE_HEADER = 128
_MI_MATRIX, _MI_COMPRESSED = 14, 15
_NUMERIC_CLASSES = range(6, 16)  # mxDOUBLE_CLASS .. mxUINT64_CLASS
_HEAD = 64 * 2**10  # inflated bytes that hold a matrix's tags, flags, dimensions and name
_MAX_ITEM = 8  # bytes per value of the widest numeric type


def check_v5_file(path: Path) -> None:
    """Refuse a v5 .mat file with a compressed numeric variable whose real or imaginary data tag
    claims more than 8 bytes per value of its dimensions; a file scipy cannot parse is left to it."""
    with open(path, "rb") as fh:
        head = fh.read(_FILE_HEADER)
        if len(head) < _FILE_HEADER:
            return
        order = "<" if head[126:128] == b"IM" else ">"
        size, pos = os.fstat(fh.fileno()).st_size, _FILE_HEADER
        while pos + 8 <= size:
            fh.seek(pos)
            mtype, nbytes = struct.unpack(order + "II", fh.read(8))
            if mtype == _MI_COMPRESSED:
                start = _inflate_start(fh.read(min(nbytes, _HEAD)))
                parts = _matrix_parts(start, order)
                if parts is not None:
                    key, dims, claims, imaginary = parts
                    _check_parts(path, key, dims, claims)  # the real claim, before inflating past the head
                    if imaginary is not None:  # streamed to past the real data (its size now checked), then checked
                        fh.seek(pos + 8)
                        tag = _inflated_at(fh, nbytes, imaginary, 8)
                        if len(tag) == 8:
                            _check_parts(path, key, dims, [_tag(tag, 0, order)[1]])
                elif len(start) == _HEAD:  # it inflates on, yet its tags do not fit: they cannot be checked
                    raise DataError(f"{path}: a compressed element's header is longer than {_HEAD // 1024} KiB "
                                    "inflated; refusing to inflate it")
            pos += 8 + nbytes  # scipy's next element (compressed ones are not padded)


def _check_parts(path: Path, key: str, dims: tuple[int, ...], claims: list[int]) -> None:
    limit = math.prod(dims) * _MAX_ITEM
    for claim in claims:
        if claim > limit:
            raise DataError(f"{path} [{key}]: its data element claims {claim:,} bytes, but {len(dims)}-d dimensions "
                            f"{dims} hold at most {limit:,}; refusing to inflate it (a decompression bomb?)")


def _inflate_start(compressed: bytes) -> bytes:
    """The first ``_HEAD`` bytes ``compressed`` inflates to (fewer if it ends or is damaged)."""
    try:
        return zlib.decompressobj().decompress(compressed, _HEAD)
    except zlib.error:
        return b""


def _inflated_at(fh: BinaryIO, nbytes: int, offset: int, length: int) -> bytes:
    """``length`` inflated bytes at ``offset`` of the ``nbytes`` compressed ones at ``fh``'s position,
    inflating in bounded steps and dropping what comes before (fewer bytes if it ends or is damaged)."""
    inflater, done, out = zlib.decompressobj(), 0, b""
    try:
        while nbytes > 0 and len(out) < length:
            chunk = fh.read(min(nbytes, _HEAD))
            if not chunk:
                break
            nbytes -= len(chunk)
            while chunk and len(out) < length:
                piece = inflater.decompress(chunk, _HEAD)  # at most 64 KiB held at once
                chunk = inflater.unconsumed_tail
                if done + len(piece) > offset:
                    out += piece[max(offset - done, 0):]
                done += len(piece)
                if not piece:
                    break
    except zlib.error:
        return b""
    return out[:length]


def _tag(buf: bytes, pos: int, order: str) -> tuple[int, int, int, int]:
    """(type, byte count, data start, next element) of the sub-element at ``pos`` (small format too)."""
    first, second = struct.unpack_from(order + "II", buf, pos)
    if first >> 16:  # small data element: count and type in one word, data in the next four bytes
        return first & 0xFFFF, first >> 16, pos + 4, pos + 8
    return first, second, pos + 8, pos + 8 + second + (-second % 8)


def _matrix_parts(buf: bytes, order: str) -> tuple[str, tuple[int, ...], list[int], int | None] | None:
    """(name, dimensions, byte counts its real and imaginary data tags claim) of the matrix at the
    start of ``buf``, and the inflated offset of the imaginary tag when it lies past ``buf`` (a real
    part longer than the head; else None); no claims for a class that is not numeric; None when
    ``buf`` is too short for the tags up to the real one."""
    try:
        mtype, _, _, _ = _tag(buf, 0, order)
        if mtype != _MI_MATRIX:
            return None
        _, _, data, pos = _tag(buf, 8, order)  # array flags
        flags = struct.unpack_from(order + "I", buf, data)[0]
        _, count, data, pos = _tag(buf, pos, order)  # dimensions
        dims = struct.unpack_from(f"{order}{count // 4}i", buf, data)
        _, count, data, pos = _tag(buf, pos, order)  # name
        name = buf[data:data + count].decode("latin-1")
        if data + count > len(buf):
            return None
        if flags & 0xFF not in _NUMERIC_CLASSES:
            return name, tuple(dims), [], None
        claims = []
        _, count, _, pos = _tag(buf, pos, order)  # the real part
        claims.append(count)
        imaginary = pos if flags & 0x0800 else None  # a complex matrix's imaginary tag follows the real data
        if imaginary is not None and pos + 8 <= len(buf):
            claims.append(_tag(buf, pos, order)[1])
            imaginary = None
    except struct.error:
        return None
    return name, tuple(max(d, 0) for d in dims), claims, imaginary
