"""ENVI headers in the encodings real files use, for the ``spectral`` reader.

``spectral`` opens a header in the locale's text encoding (UTF-8 here) and refuses anything
else as "a binary file", and a byte-order mark as "missing ENVI at the beginning". Real headers
carry both: ENVI on Windows writes the system code page (``description = {... µm ...}`` in
Latin-1 / cp1252), and editors add a UTF-8 BOM. :func:`readable_header` hands ``spectral`` the
header as it is when it is plain UTF-8, and otherwise a UTF-8 copy in a temporary folder (the
data file is then located beside the *original* header, as ``spectral`` would). The text is
decoded as UTF-8 (BOM removed) or, failing that, as cp1252 with Latin-1 for its five undefined
bytes, which never fails; the numeric fields a reader needs are ASCII in every one of them.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_BOM = b"\xef\xbb\xbf"
_DATA_EXTS = ("img", "dat", "sli", "hyspex", "raw", "bin")  # spectral.io.envi.KNOWN_EXTS


def _cp1252_over_latin1() -> dict[int, str]:
    """Latin-1 code points 0x80-0x9f -> the cp1252 characters of those bytes (5 are undefined and stay)."""
    table = {}
    for byte in range(0x80, 0xA0):
        try:
            table[byte] = bytes([byte]).decode("cp1252")
        except UnicodeDecodeError:  # 0x81, 0x8d, 0x8f, 0x90, 0x9d
            pass
    return table


_CP1252 = _cp1252_over_latin1()


def decode_header(raw: bytes) -> str:
    """Header bytes -> text: UTF-8 (a leading BOM dropped), else cp1252 with Latin-1 for its undefined bytes."""
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1").translate(_CP1252)


def _data_file_beside(header: Path, text: str) -> Path | None:
    """The data file ``spectral`` would pair with ``header``: its name without ``.hdr``, then with
    the usual extensions and the interleave name, lower then upper case."""
    stem, ext = os.path.splitext(str(header))
    if ext.lower() != ".hdr":
        return None
    found = re.search(r"^\s*interleave\s*=\s*(\w+)", text, flags=re.IGNORECASE | re.MULTILINE)
    exts = [*_DATA_EXTS, *([found.group(1).lower()] if found else [])]
    for cand in ["", *exts, *(e.upper() for e in exts)]:
        path = Path(f"{stem}.{cand}" if cand else stem)
        if path.is_file():
            return path
    return None


@contextmanager
def readable_header(header: Path, data_file: Path | None) -> Iterator[tuple[Path, Path | None]]:
    """``(header, data file)`` for ``spectral.io.envi.open``: unchanged for a plain UTF-8 header;
    for one with a BOM or another encoding a UTF-8 copy (removed on exit) and the data file
    beside the original (None when there is none: ``spectral`` then says so)."""
    raw = header.read_bytes()  # callers bound the size first (check_text_size)
    text = decode_header(raw)
    if text.encode("utf-8") == raw:  # plain UTF-8 already: spectral reads the file itself
        yield header, data_file
        return
    with tempfile.TemporaryDirectory(prefix="sciformer-envi-") as tmp:
        copy = Path(tmp) / header.name
        copy.write_text(text, encoding="utf-8")
        yield copy, data_file if data_file is not None else _data_file_beside(header, text)
