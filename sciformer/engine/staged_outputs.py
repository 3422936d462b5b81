"""``sciformer predict``'s outputs as one set: every file is written into a hidden stage folder
beside its final place, and the files are renamed into place only when every input was predicted.

So a damaged input, a refusal or Ctrl-C part way through a folder of inputs writes and replaces
nothing (the stage is removed), while memory stays bounded: each prediction goes to disk as soon
as it is made (the stages need the outputs' disk space until they are renamed). A process killed
with SIGKILL may leave a stage folder ``.predict.sciformer-stage-<8 characters>``: safe to delete.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sciformer.engine.folder_lock import missing_folders, remove_empty_folders
from sciformer.engine.signals import outputs_complete, signals_held
from sciformer.errors import SciformerError
from sciformer.utils.atomic import STAGE_MARK

STAGE_PREFIX = f".predict{STAGE_MARK}"


class StagedOutputs:
    """Hidden stage folders, one per output folder; :meth:`path` names where to write a final file."""

    def __init__(self) -> None:
        self.stages: dict[Path, Path] = {}  # final folder -> its stage
        self.shown: dict[Path, Path] = {}  # final folder -> that folder as the command line spelled it
        self.order: list[Path] = []  # staged outputs in input order (files written beside them follow)
        self.created: list[tuple[Path, ...]] = []  # output folders this command made (removed on failure)

    def path(self, final: Path) -> Path:
        """Where the file that becomes ``final`` is written (files written beside it land beside it there)."""
        folder = Path(os.path.abspath(final.parent))
        if folder not in self.stages:
            missing = missing_folders(folder)
            folder.mkdir(parents=True, exist_ok=True)
            self.created.append(missing)
            self.stages[folder] = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=folder))
            self.shown[folder] = final.parent
        self.order.append(self.stages[folder] / final.name)
        return self.order[-1]

    def publish(self, *, overwrite: bool) -> list[Path]:
        """Rename every staged file into place (an existing file only with ``overwrite``: one that
        appeared meanwhile is refused, and nothing is renamed); returns the final paths as the
        command line spelled their folders."""
        where = {stage: folder for folder, stage in self.stages.items()}
        files = [f for f in self.order if f.exists()] + sorted(f for stage in where for f in stage.iterdir() if f not in self.order)
        moves = [(f, where[f.parent] / f.name) for f in files]
        if not overwrite:
            for _, target in moves:
                if os.path.lexists(target):
                    raise SciformerError(f"--output '{target}' appeared while predicting; pass --overwrite to replace it")
        for _, target in moves:
            if target.is_dir() and not target.is_symlink():
                raise SciformerError(f"--output '{target}' became a folder while predicting")
        outputs_complete()  # every output is made: a signal from here on cannot make the command look failed
        with signals_held():  # and, where it still counts (a script calling main), not half the set replaced
            for staged, target in moves:
                with contextlib.suppress(FileNotFoundError):  # a replaced file keeps its permission bits
                    os.chmod(staged, stat.S_IMODE(os.stat(target).st_mode))
                os.replace(staged, target)
            self.discard(created_too=False)
        return [self.shown[target.parent] / target.name for _, target in moves]

    def final_names(self, exc: BaseException) -> None:
        """Name the outputs' final places instead of their stages in ``exc`` (a writer that
        refuses or fails names the path it was given: the staged one)."""
        if isinstance(exc, OSError) and isinstance(exc.filename, str):  # printed as "<reason>: '<file>'"
            exc.filename = self._final_text(exc.filename)
        elif isinstance(exc, SciformerError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (self._final_text(exc.args[0]),)

    def _final_text(self, text: str) -> str:
        for folder, stage in self.stages.items():
            inside = re.escape(f"{stage}{os.sep}") + r"([^\s'\"]*)"  # a staged file: the final file as the command line spelled it
            text = re.sub(inside, lambda m, shown=self.shown[folder]: str(shown / m.group(1)), text)
            text = text.replace(str(stage), str(self.shown[folder]))
        return text

    def discard(self, *, created_too: bool = True) -> None:
        """Remove the stages (and, after a failure, the output folders this command created, if empty)."""
        for stage in self.stages.values():
            shutil.rmtree(stage, ignore_errors=True)
        if created_too:
            for missing in self.created:
                remove_empty_folders(missing)
        self.stages.clear()


@contextlib.contextmanager
def staged_outputs() -> Iterator[StagedOutputs]:
    """A :class:`StagedOutputs` whose stages are removed when the block fails (publish it inside the block)."""
    outputs = StagedOutputs()
    try:
        yield outputs
    except BaseException as exc:
        outputs.final_names(exc)
        outputs.discard()
        raise
