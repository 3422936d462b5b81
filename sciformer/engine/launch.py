"""Training from a config, one code path for ``sciformer train`` and ``sciformer.train``.

:func:`prepare_training` resolves the experiment, the run folder and (for ``--resume``)
the checkpoint state; :func:`run_training` trains it with the run's ``train.log``
written beside its metrics and the report images (curves, confusion matrix) after.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sciformer import config
from sciformer.config import Experiment
from sciformer.errors import CheckpointError, ConfigError
from sciformer.frontend import option
from sciformer.utils.ranks import is_main_process


def prepare_training(
    config_source: str | Path | dict[str, Any] | None,
    overrides: Sequence[str] = (),
    *,
    output_dir: str | Path | None = None,
    resume: str | Path | None = None,
    seed: int | None = None,
    base_dir: str | Path | None = None,
    init_from: str | Path | None = None,
) -> tuple[Experiment, Path | None, dict[str, Any] | None]:
    """The validated experiment, its run folder (None for a new run without ``output_dir``: the
    trainer creates ``runs/<name>-<time>``) and the resumed checkpoint state (None for a new run).

    ``config_source``: a YAML path, or a dict of sections (paths in it relative to
    ``base_dir``, default the working folder). ``resume``: a run folder or checkpoint.
    ``init_from``: a checkpoint or run folder (its best.pt) whose matching weights start
    the new run; stored as ``train.init_from`` (an absolute path) in the run's config.
    """
    from sciformer.engine.checkpoint import checkpoint_file, load_checkpoint
    from sciformer.engine.inference import RESUME_KEYS, checkpoint_experiment
    from sciformer.engine.runfolder import (
        RunFolderError,
        check_new_run_dir,
        check_resume_config,
        check_resume_location,
        check_run_identity,
    )
    from sciformer.engine.weights import resolve_init_from

    overrides = [str(o) for o in overrides]
    if seed is not None:
        overrides.append(f"train.seed={seed}")
    out = Path(output_dir) if output_dir is not None else None
    if init_from is not None:
        if resume is not None:
            raise ConfigError(f"{option('--init-from')} starts a new run from a checkpoint's weights, {option('--resume')} continues a run; use one of them")
        overrides.append(f"train.init_from={json.dumps(str(checkpoint_file(Path(init_from).expanduser(), 'best.pt').resolve()))}")
    if resume is not None:
        resume = Path(resume)
        state = load_checkpoint(resume)
        ckpt_path = resume if resume.is_file() else resume / "checkpoints" / "last.pt"
        missing = [k for k in RESUME_KEYS if k not in state]
        if missing:
            raise CheckpointError(f"checkpoint '{ckpt_path}' cannot be resumed: it lacks {', '.join(missing)} "
                                  f"(a best.pt holds weights only); start a new run from its weights with {option('--init-from')}")
        run_dir = check_resume_location(ckpt_path)
        check_run_identity(run_dir, state, ckpt_path)
        exp = checkpoint_experiment(state, ckpt_path, overrides)
        check_resume_config(state["config"], exp.to_dict(), str(ckpt_path))
        stored_init = ((state["config"].get("train") or {}).get("init_from"))
        if exp.cfg.train.init_from != stored_init:
            raise ConfigError(f"{option('--resume')} cannot change train.init_from (checkpoint '{ckpt_path}' has {stored_init!r}); the weights come from the run")
        if out is not None and out.resolve() != run_dir:
            raise RunFolderError(f"{option('--output-dir', out)} differs from the resumed run folder {run_dir}; drop {option('--output-dir')}")
        if config_source is not None and is_main_process():
            print(f"note: {option('--resume')} takes the config stored in the run; {config_source} is not read "
                  f"(to fine-tune its weights on another experiment, use {option('--init-from')})", file=sys.stderr)
        return exp, run_dir, state
    if config_source is None:
        raise ConfigError(f"train needs {option('--config')} PATH (or {option('--resume')} RUN)")
    if isinstance(config_source, dict):
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        exp = config.from_dict(config_source, base, overrides, source="config dict")
    else:
        exp = config.load(config_source, overrides)
    if exp.cfg.train.init_from is not None:  # a missing or foreign file fails here, before any data is read
        init_file = checkpoint_file(resolve_init_from(exp.cfg.train.init_from, exp.base_dir), "best.pt")
        load_checkpoint(init_file)
        exp.cfg.train.init_from = str(init_file.resolve())  # the run's config.yaml names the file, wherever it is read from
    if out is not None:
        check_new_run_dir(out)  # before any data is read; a default folder is a new one (the Trainer names it)
    return exp, out, None


def run_training(exp: Experiment, run_dir: Path | None, state: dict[str, Any] | None = None) -> Any:
    """Train ``exp`` into ``run_dir`` (None: a new ``runs/<name>-<time>``; continuing ``state``); returns the trainer's RunResult.

    Everything printed meanwhile (and every warning) also goes to ``run_dir/train.log``;
    ``curves.png`` and ``confusion_matrix.png`` are drawn at the end.
    """
    from sciformer.engine.distributed import shutdown
    from sciformer.engine.reporting import RunLog, write_report
    from sciformer.engine.trainer import Trainer

    with RunLog() as run_log:
        trainer = Trainer(exp, run_dir, resume_state=state)
        try:
            try:
                if trainer.dist.is_main:
                    run_log.attach(trainer.run_dir / "train.log", append=state is not None)
                else:
                    run_log.drop()
                result = trainer.fit()
            finally:
                shutdown(trainer.dist)
            if trainer.dist.is_main:
                write_report(trainer.run_dir, quiet=True)
        finally:  # unlocked now, also after an error or Ctrl-C: a caller's traceback keeps the trainer (and
            if trainer._lock is not None:  # its lock) alive, and sciformer.train(resume=RUN) must find the folder free
                trainer._lock.release()
    return result
