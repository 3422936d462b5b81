"""One guard for every reader: regular files only, and a memory budget checked before allocating.

- :func:`regular_file` refuses FIFOs, devices (``/dev/zero``), sockets and folders before a
  byte is read, so a reader can neither hang on a pipe nor read an endless device;
  :func:`path_kind` says in words what such a path is.
- :func:`check_bytes` refuses an array (or a decompressed member) whose *declared* size
  exceeds the budget, before it is inflated or allocated: a 1 KB compressed file cannot ask
  for gigabytes. The budget is ``SCIFORMER_MAX_ARRAY_BYTES`` (bytes; suffixes K, M, G, T
  accepted), 4 GiB by default.
- :func:`read_errors` turns an operating-system error met while reading a file (EIO, no
  permission) into one DataError naming the file and the OS reason.
- :func:`check_npy` / :func:`npy_header` read a .npy header before numpy loads the file: a file
  without NumPy's magic is "not a .npy file" and an array of Python objects is refused (numpy
  calls both pickled data and suggests unpickling).
- :func:`header_line` reads one line of a text header (PLY, PCD) bounded in length.
- :func:`check_finite_coords` refuses coordinates that are, or would overflow to, inf/NaN.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from sciformer.errors import DataError

DEFAULT_MAX_ARRAY_BYTES = 4 * 2**30
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# more classes than this is a corrupt label, not a dataset (ImageNet-21k has ~2e4)
MAX_CLASS_ID = 1_000_000


def max_array_bytes() -> int:
    """The per-array memory budget in bytes (``SCIFORMER_MAX_ARRAY_BYTES``, default 4 GiB)."""
    raw = os.environ.get("SCIFORMER_MAX_ARRAY_BYTES", "").strip().upper().removesuffix("B").removesuffix("I")
    if not raw:
        return DEFAULT_MAX_ARRAY_BYTES
    unit = raw[-1] if raw[-1] in _UNITS else ""
    try:
        value = float(raw[: len(raw) - len(unit)])
    except ValueError:
        raise DataError(f"SCIFORMER_MAX_ARRAY_BYTES: expected a size such as 4G or 500000000, got {raw[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise DataError(f"SCIFORMER_MAX_ARRAY_BYTES: expected a positive size, got {raw[:40]!r}")
    return int(value * _UNITS[unit])


# a container's memory limit and use: cgroup v2, then v1 (a v1 limit near 2^63 means none)
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_memory() -> int | None:
    """Bytes this process can still be given without swapping: the system's ``MemAvailable``
    (``/proc/meminfo``), or less where a container's cgroup limit leaves less; None where
    neither is known (not Linux)."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            found += [int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")]  # kB
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            with open(limit_file, encoding="ascii") as fh:
                limit = fh.read().strip()
            with open(usage_file, encoding="ascii") as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**62:  # "max" (v2) or ~2^63 (v1): no limit
            found.append(max(0, int(limit) - usage))
        break
    return min(found) if found else None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_bytes(nbytes: float, where: str, what: str = "array") -> None:
    """Refuse ``nbytes`` (declared, before allocating or inflating) above the budget."""
    budget = max_array_bytes()
    if not nbytes >= 0 or nbytes > budget:  # also catches NaN
        raise DataError(f"{where}: {what} would need {_size(float(nbytes))} of memory, above the "
                        f"{_size(budget)} limit (raise SCIFORMER_MAX_ARRAY_BYTES if the file is genuine)")


def check_shape(shape: tuple[int, ...] | list[int], itemsize: int, where: str, what: str = "array") -> None:
    """Refuse a declared ``shape`` x ``itemsize`` above the budget (or with negative sizes)."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise DataError(f"{where}: {what} declares a negative size {tuple(dims)}")
    check_bytes(math.prod(dims) * int(itemsize), where, f"{what} of shape {tuple(dims)}")


# what a path is, in the words of a message ("is a FIFO"); see path_kind
REGULAR_FILE, FOLDER, MISSING, DANGLING_LINK = "a regular file", "a folder", "missing", "a link to nothing, or a loop"


def path_kind(path: str | os.PathLike[str]) -> str:
    """What ``path`` is, symlinks followed: :data:`REGULAR_FILE`, :data:`FOLDER`, :data:`MISSING`,
    :data:`DANGLING_LINK`, ``"a FIFO"``, ``"a device"``, ``"a socket"``, ``"a special file"`` or ``"out of reach (<OS
    reason>)"`` (e.g. behind a folder without permission). Only the path is looked at, never the file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP) and os.path.islink(path):
            return DANGLING_LINK
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return MISSING
        return f"out of reach ({os_reason(exc)})"
    if stat.S_ISREG(mode):
        return REGULAR_FILE
    if stat.S_ISDIR(mode):
        return FOLDER
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file"


# a text header's line (PLY, PCD) longer than this is no header line: a binary file or a line with no end
MAX_HEADER_LINE = 2**20  # a comment or obj_info line of embedded metadata (100 kB) is a header line


def header_line(fh: Any, where: str | os.PathLike[str]) -> bytes:
    """The next line of a text header from the binary file ``fh`` (b"" at its end), read at most
    MAX_HEADER_LINE bytes: a longer line is refused in one line, never read whole."""
    raw = fh.readline(MAX_HEADER_LINE + 1)
    if len(raw) > MAX_HEADER_LINE:
        raise DataError(f"{where}: a header line longer than {_size(MAX_HEADER_LINE)}; not a valid header")
    return raw


def regular_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` if it is a regular file (symlinks followed); one-line DataError otherwise."""
    path = Path(path)
    kind = path_kind(path)
    if kind == REGULAR_FILE:
        return path
    if kind == MISSING:
        raise DataError(f"{path}: {what} not found")
    if kind == FOLDER:
        raise DataError(f"{path}: not a file (a folder); expected a regular {what}")
    raise DataError(f"{path}: is {kind}; expected a regular {what}")


# running out of memory or open files is the machine's, not the file's: the CLI words those itself
_RESOURCE_ERRNOS = (errno.ENOMEM, errno.EMFILE, errno.ENFILE)


def os_reason(exc: OSError) -> str:
    """The operating system's words for ``exc`` ("Input/output error", "Permission denied"),
    without what a library wrapped around them (h5py puts a paragraph in ``strerror``)."""
    if isinstance(exc.errno, int) and exc.errno > 0:
        return os.strerror(exc.errno)
    return " ".join(str(exc).split())[:160] or type(exc).__name__


@contextmanager
def read_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError raised while reading ``path`` in the block becomes one DataError
    ``"<path>: cannot read (<OS reason>)"``; running out of memory or open files passes as it is."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _RESOURCE_ERRNOS:
            raise
        raise DataError(f"{path}: cannot read ({os_reason(exc)})") from exc


# a compressed array may inflate this much beyond its stored size only while it stays small;
# real data compress 2-10x, a constant array 1000x and more (a decompression bomb)
BOMB_MIN_BYTES = 256 * 2**20
BOMB_RATIO = 1000


def check_inflation(nbytes: int, stored: int, where: str) -> None:
    """Refuse a compressed (or sparse, never written) array that would inflate over BOMB_RATIO x its
    stored size (above BOMB_MIN_BYTES), unless ``SCIFORMER_MAX_ARRAY_BYTES`` is set: a budget the
    user chose bounds the array whatever its compression (a large, nearly uniform label map)."""
    check_bytes(nbytes, where)
    if os.environ.get("SCIFORMER_MAX_ARRAY_BYTES", "").strip():
        return
    if nbytes > BOMB_MIN_BYTES and nbytes > BOMB_RATIO * max(int(stored), 1):
        raise DataError(f"{where}: array of {_size(nbytes)} is stored in {_size(int(stored))} (compressed "
                        f"{nbytes // max(int(stored), 1):,}:1 or never written, a decompression bomb?); refusing to inflate it "
                        f"(a genuine file: set SCIFORMER_MAX_ARRAY_BYTES={-(-max(nbytes, max_array_bytes()) // 2**20)}M or more to accept it)")


def check_hdf5_dataset(ds: object, where: str, stored: bool = True) -> None:
    """An h5py Dataset: its data in this file (no external storage, no virtual sources), and its
    declared size within the budget and (``stored``) a plausible compression ratio, checked before
    reading. A caller that only lists the dataset passes ``stored=False`` and applies the ratio
    when it reads it (a never-written placeholder beside the cube is no reason to refuse the file)."""
    if getattr(ds, "is_virtual", False):
        raise DataError(f"{where}: a virtual HDF5 dataset (its data lives in other files); unsupported, save the array itself")
    external = getattr(ds, "external", None)
    if external:
        raise DataError(f"{where}: an HDF5 dataset with external storage ({str(external[0][0])[:80]}); unsupported, save the array itself")
    shape, dtype = tuple(getattr(ds, "shape", ()) or ()), getattr(ds, "dtype", None)
    itemsize = int(getattr(dtype, "itemsize", 8) or 8)
    check_shape(shape, itemsize, where)
    if not stored:
        return
    # compressed, chunked or contiguous alike: a dataset never written holds no bytes (its fill value only)
    check_inflation(math.prod(int(d) for d in shape) * itemsize, int(ds.id.get_storage_size()), where)  # type: ignore[attr-defined]


class ObjectArrayError(DataError):
    """A .npy array of Python objects (pickled data): refused, never loaded."""


def npy_header(handle: BinaryIO, where: str) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype from the .npy header at ``handle``'s position (its magic first): a file
    without the NumPy magic, a damaged header, or an array of Python objects (pickled data,
    never loaded) is a one-line DataError naming ``where``."""
    import numpy as np

    head = handle.read(8)
    if head[:6] != b"\x93NUMPY" or len(head) < 8:
        raise DataError(f"{where}: not a .npy file (no NumPy header)")
    read_header = np.lib.format.read_array_header_1_0 if head[6:8] == b"\x01\x00" else np.lib.format.read_array_header_2_0
    try:
        shape, _, dtype = read_header(handle)
    except Exception as exc:  # noqa: BLE001 - numpy reports a damaged header as ValueError, SyntaxError, EOFError, ...
        raise DataError(f"{where}: not a readable .npy file (damaged header; {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:120]})") from None
    if dtype.hasobject:
        raise ObjectArrayError(f"{where}: the array holds Python objects (dtype {str(dtype)[:60]}), which are refused: "
                        "only numeric arrays are read, and pickled data is never loaded")
    return tuple(int(s) for s in shape), dtype


def check_npy(path: str | os.PathLike[str]) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype of the .npy file ``path`` from its header (see :func:`npy_header`)."""
    with open(path, "rb") as handle:
        return npy_header(handle, str(path))


def npz_members(path: str | os.PathLike[str],
                refused: dict[str, str] | None = None) -> dict[str, tuple[tuple[int, ...], object, int | None]]:
    """Shape, dtype and compressed size (None if stored) of each array member of an .npz, keyed as
    ``np.load`` keys them (``coord.npy`` -> ``coord``), from the member headers only; each checked
    against the budget before anything is inflated. An array member is one in .npy format whatever
    its name (``np.load`` reads a ``coord`` member holding .npy bytes as an array too); any other
    member (a ``readme``) is no array: it is left out, so a caller reading only these keys never
    inflates it. A member of Python objects (a ``meta`` dict) is left out too and never loaded: its
    one-line refusal goes into ``refused`` (for a caller that names it), and is raised when no
    numeric member is left (it was the only candidate)."""
    import zipfile

    out: dict[str, tuple[tuple[int, ...], object, int | None]] = {}
    objects: dict[str, str] = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.infolist():
            key = member.filename.removesuffix(".npy")
            where = f"{path} [{key}]"
            with archive.open(member) as handle:
                if handle.read(6) != b"\x93NUMPY":
                    continue  # not in .npy format: np.load would hand back its raw bytes, never read here
                handle.seek(0)
                try:
                    shape, dtype = npy_header(handle, where)  # a damaged header: one line
                except ObjectArrayError as exc:
                    objects[key] = str(exc)
                    continue
            stored = member.compress_size if member.compress_type != zipfile.ZIP_STORED else None
            nbytes = math.prod(int(s) for s in shape) * int(dtype.itemsize)
            check_inflation(nbytes, stored, where) if stored is not None else check_bytes(nbytes, where)
            out[key] = (tuple(int(s) for s in shape), dtype, stored)
    if objects and not out:
        raise DataError(next(iter(objects.values())))
    if refused is not None:
        refused.update(objects)
    return out
