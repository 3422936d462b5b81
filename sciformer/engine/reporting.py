"""What a person looks at in a run folder: ``train.log``, ``curves.png``, ``confusion_matrix.png``.

:class:`RunLog` copies every line the console shows during a run (stdout, stderr, and
so every warning) into ``train.log``; :func:`write_report` draws the training curves from
``metrics.csv`` and the normalised confusion matrix from ``confusion_matrix.csv``, during
training and again with ``sciformer report RUN``.
"""

from __future__ import annotations

import csv
import io
import math
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

from sciformer.errors import DataError, SciformerError
from sciformer.utils.atomic import atomic_write_with
from sciformer.utils.text import drawable

# ------------------------------------------------------------------------- train.log


class _Tee(io.TextIOBase):
    """A text stream writing to ``stream`` and handing each finished line to ``sink``."""

    def __init__(self, stream: IO[str], sink: Any) -> None:
        super().__init__()
        self._stream, self._sink, self._partial = stream, sink, ""

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        self._partial += text
        if "\n" in self._partial:
            *lines, self._partial = self._partial.split("\n")
            for line in lines:
                self._sink(line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r"))
        return n if isinstance(n, int) else len(text)

    def flush(self) -> None:
        self._stream.flush()

    def finish(self) -> None:
        if self._partial.strip():
            self._sink(self._partial.rsplit("\r", 1)[-1])
        self._partial = ""

    def isatty(self) -> bool:
        return bool(getattr(self._stream, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8") or "utf-8"


class RunLog:
    """Copy the console (stdout and stderr lines, warnings included) into a log file.

    Lines are held in memory until :meth:`attach` names the file (the run folder may not
    exist when the run starts), then written as they come. Used as a context manager;
    the streams are restored on exit, also on errors (whose message the CLI prints after,
    so the log ends with what was printed up to the failure).
    """

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._file: IO[str] | None = None
        self._saved: tuple[Any, Any] | None = None
        self._tees: list[_Tee] = []
        self._showwarning: Any = warnings.showwarning
        self._dropped = False

    def _sink(self, line: str) -> None:
        if self._dropped:
            return
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        else:
            self._lines.append(line)

    def attach(self, path: Path, *, append: bool = False) -> None:
        """Write the lines so far and every later one to ``path`` (appended when ``append``)."""
        # surrogateescape: a path of undecodable bytes in a message is written back as those bytes
        self._file = open(path, "a" if append else "w", encoding="utf-8", errors="surrogateescape")  # noqa: SIM115 - closed on exit
        if append:
            self._file.write("\n")
        for line in self._lines:
            self._file.write(line + "\n")
        self._file.flush()
        self._lines = []

    def drop(self) -> None:
        """Keep no lines (a process that writes no log, e.g. a rank other than 0)."""
        self._dropped, self._lines = True, []

    def __enter__(self) -> RunLog:
        self._saved = (sys.stdout, sys.stderr)
        self._tees = [_Tee(sys.stdout, self._sink), _Tee(sys.stderr, self._sink)]
        sys.stdout, sys.stderr = self._tees  # type: ignore[assignment]
        self._showwarning = warnings.showwarning
        real_stderr = self._saved[1]

        def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            for text in warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n").split("\n"):
                self._sink(text)
            # shown where it would have been, but not through the tee (already logged)
            self._showwarning(message, category, filename, lineno, real_stderr if file is None else file, line)

        warnings.showwarning = showwarning
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for tee in self._tees:
            tee.finish()
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            warnings.showwarning = self._showwarning
        if exc is not None and self._file is not None:
            text = str(exc)
            if isinstance(exc, KeyboardInterrupt):  # a signal carries no message
                self._file.write(f"interrupted: {text or 'Ctrl-C or SIGTERM'}\n")
            else:
                self._file.write(f"error: {text or type(exc).__name__}\n")
        if self._file is not None:
            self._file.close()
            self._file = None


# ------------------------------------------------------------------------- images


def metrics_csv_text(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    """A run's ``metrics.csv``: a header of ``fields``, then one line per row (keys not in
    ``fields`` left out, None as an empty cell; read back by :func:`read_metrics_csv`)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def read_metrics_csv(path: Path) -> list[dict[str, float]]:
    """Rows of a run's ``metrics.csv`` as floats (NaN for empty cells); a file without its header
    line (an ``epoch`` column), a row of another length or a value that is no number is a one-line
    DataError naming the file."""
    with open(path, newline="", encoding="utf-8") as fh:
        lines = [row for row in csv.reader(fh) if row]
    if not lines or "epoch" not in lines[0]:
        raise DataError(f"'{path}' has no header line naming its columns (epoch, train_loss, ...); it is not a metrics.csv sciformer writes")
    header, rows = lines[0], []
    for number, row in enumerate(lines[1:], 2):
        if len(row) != len(header):
            raise DataError(f"'{path}' row {number} has {len(row)} values for the header's {len(header)} columns")
        try:
            rows.append({k: (float(v) if v != "" else math.nan) for k, v in zip(header, row, strict=True)})
        except ValueError:
            raise DataError(f"'{path}' row {number} holds a value that is not a number") from None
    return rows


def read_confusion_csv(path: Path) -> tuple[list[str], np.ndarray]:
    """Class names and the (K, K) count matrix (rows: truth) of a ``confusion_matrix.csv``."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if len(rows) < 2:
        raise SciformerError(f"{path}: expected a header row and one row per class")
    names = rows[0][1:]
    matrix = np.array([[float(v) for v in row[1:]] for row in rows[1:]], dtype=np.float64)  # (K, K)
    if matrix.shape != (len(names), len(names)):
        raise SciformerError(f"{path}: expected a {len(names)} x {len(names)} matrix, got {matrix.shape}")
    return names, matrix


def _save(fig: Any, path: Path) -> Path:
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    return path


def plot_curves(rows: list[dict[str, float]], path: Path, title: str = "", no_scores: str = "no validation split") -> Path:
    """``curves.png``: training / validation loss, learning rate and validation scores per epoch
    (``no_scores``: what the scores panel says when there are none)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    epochs = [r.get("epoch", i + 1) for i, r in enumerate(rows)]
    fig = Figure(figsize=(13, 3.8))
    FigureCanvasAgg(fig)
    ax_loss, ax_lr, ax_score = fig.subplots(1, 3)
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        ys = [r.get(key, math.nan) for r in rows]
        if any(np.isfinite(ys)):
            ax_loss.plot(epochs, ys, marker="o", ms=3, label=label)
    ax_loss.set(title="loss", xlabel="epoch")
    ax_loss.legend(loc="best")
    ax_lr.plot(epochs, [r.get("lr", math.nan) for r in rows], marker="o", ms=3, color="tab:purple")
    ax_lr.set(title="learning rate (end of epoch)", xlabel="epoch")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    shown = False
    for key in ("val_oa", "val_aa", "val_kappa", "val_miou", "val_instance_miou", "val_category_miou"):
        ys = [100 * r.get(key, math.nan) for r in rows]
        if any(np.isfinite(ys)):
            ax_score.plot(epochs, ys, marker="o", ms=3, label=key[4:].upper())
            shown = True
    ax_score.set(title="validation scores (%)", xlabel="epoch")
    if shown:
        ax_score.legend(loc="best")
    else:
        ax_score.text(0.5, 0.5, no_scores, ha="center", va="center", transform=ax_score.transAxes)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_confusion(names: list[str], matrix: np.ndarray, path: Path, title: str = "") -> Path:
    """``confusion_matrix.png``: rows (true classes) normalised to 1, class names on both axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    k = len(names)
    names = [drawable(n) for n in names]  # class names from a CSV: drawn as written
    support = matrix.sum(axis=1, keepdims=True)  # (K, 1)
    norm = np.divide(matrix, support, out=np.zeros_like(matrix), where=support > 0)  # (K, K)
    side = min(4.0 + 0.45 * k, 24.0)
    fig = Figure(figsize=(side + 1.5, side))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    image = ax.imshow(norm, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(k), names, rotation=60, ha="right", fontsize=8 if k > 12 else 10)
    ax.set_yticks(range(k), [f"{n} ({int(s)})" for n, s in zip(names, support[:, 0], strict=True)], fontsize=8 if k > 12 else 10)
    ax.set(xlabel="predicted", ylabel="true (support)", title=title or "confusion matrix (rows normalised)")
    if k <= 25:
        for i in range(k):
            for j in range(k):
                if norm[i, j] >= 0.005:
                    ax.text(j, i, f"{norm[i, j]:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if norm[i, j] > 0.6 else "black")
    return _save(fig, path)


def write_report(run_dir: str | Path, *, quiet: bool = False) -> list[Path]:
    """Draw ``curves.png`` and ``confusion_matrix.png`` into ``run_dir`` from its CSV files.

    Returns the images written. ``quiet``: a failure to draw becomes a warning (training
    never fails over a figure); otherwise a SciformerError names what is missing.
    """
    run_dir = Path(run_dir)
    written: list[Path] = []
    try:
        if not run_dir.is_dir():
            raise SciformerError(f"report: '{run_dir}' is not a run folder")
        label = drawable(run_dir.name)  # a title any font can draw (undecodable bytes too)
        metrics, confusion = run_dir / "metrics.csv", run_dir / "confusion_matrix.csv"
        if not metrics.is_file() and not confusion.is_file():
            raise SciformerError(f"report: '{run_dir}' holds neither metrics.csv nor confusion_matrix.csv; is it a run folder?")
        if not (run_dir / "config.yaml").is_file():  # its curves.png would be someone else's figure
            raise SciformerError(f"report: '{run_dir}' has no config.yaml, so it is not a sciformer run folder; "
                                 "report redraws only a run's own curves.png and confusion_matrix.png")
        if not metrics.is_file():  # curves.png would stay as it was, looking redrawn
            raise SciformerError(f"report: '{metrics}' is missing, so curves.png cannot be redrawn; restore the run's file")
        rows = read_metrics_csv(metrics)
        if not rows:
            raise SciformerError(f"report: '{metrics}' holds no epoch rows, so curves.png cannot be drawn")
        pretraining = (run_dir / "pretrain.json").is_file()  # `sciformer pretrain`: the loss is the masked-band loss
        written.append(plot_curves(rows, run_dir / "curves.png", title=label + (" (masked-band pre-training)" if pretraining else ""),
                                   no_scores="no labels: masked-band pre-training" if pretraining else "no validation split"))
        if confusion.is_file():
            names, matrix = read_confusion_csv(confusion)
            written.append(plot_confusion(names, matrix, run_dir / "confusion_matrix.png",
                                          title=f"{label}: confusion matrix (rows normalised)"))
    except (SciformerError, OSError, ValueError) as exc:
        if not quiet:
            if isinstance(exc, SciformerError):
                raise
            raise SciformerError(f"report: {run_dir}: {exc}") from None
        warnings.warn(f"run report not drawn: {exc}", stacklevel=2)
    return written
