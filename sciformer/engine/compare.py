"""``sciformer compare RUN...`` (config differences and metrics of runs, one table) and
``sciformer config --list NAME`` (a model's, dataset's or section's keys with type, default, meaning).
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sciformer.engine.folder_lock import lock_holder
from sciformer.errors import ConfigError, DataError, SciformerError
from sciformer.utils import yamlio
from sciformer.utils.atomic import atomic_write_text
from sciformer.utils.limits import regular_file

SCORE_KEYS = ("oa", "aa", "macc", "kappa", "miou")  # named by the split metrics.json was computed on: test_oa, val_oa
RECORD_KEYS = ("best_epoch", "best_val", "pretrain_loss")
PRETRAIN_RECORD_ONLY = ("history", "env", "train_pixels_sha256")  # pretrain.json keys that are results, not settings
EVERY_POINT_KEYS = ("oa", "miou")  # whole scenes: metrics.json's full_resolution (every point, with the test views)
MAX_RECORD_BYTES = 64 * 2**20  # a metrics.json / pretrain.json larger than this is not one sciformer wrote

# ------------------------------------------------------------------------- compare


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _damaged(path: Path, what: str) -> DataError:
    return DataError(f"'{path}' {what}; restore the run's file or leave the run out of compare")


def read_json_object(path: Path) -> dict[str, Any]:
    """A run's JSON record (metrics.json, pretrain.json) as a dict; one-line DataError naming the file otherwise."""
    regular_file(path, path.name)
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise _damaged(path, f"is larger than {MAX_RECORD_BYTES >> 20} MiB, not a record sciformer writes")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise _damaged(path, "is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise _damaged(path, "is empty" if not exc.doc.strip() else f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise _damaged(path, f"holds a JSON {type(data).__name__}, not the object sciformer writes")
    return data


def _run_files(run: Path) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(flattened config, metrics, is a pre-training folder) of one run folder, each checked."""
    cfg_path = run / "config.yaml"
    if not cfg_path.is_file():
        raise SciformerError(f"compare: '{run}' is not a run folder (no config.yaml)")
    config = yamlio.load_file(cfg_path)
    if not isinstance(config, dict) or not config:
        raise _damaged(cfg_path, "is not a run's config (a YAML mapping of sections expected)")
    flat = _flatten(config)
    mpath = run / "metrics.json"
    metrics = read_json_object(mpath) if os.path.lexists(mpath) else {}
    full = metrics.get("full_resolution", {})
    if not isinstance(full, dict) or not isinstance(metrics.get("split", "test"), str):
        raise _damaged(mpath, "has a 'full_resolution' that is no object or a 'split' that is no name")
    pre = run / "pretrain.json"
    if os.path.lexists(pre):  # a `sciformer pretrain` folder: its settings compare as pretrain.*, its last loss as a metric
        record = read_json_object(pre)
        history = record.get("history") or [{}]
        if not isinstance(history, list) or not isinstance(history[-1], dict):
            raise _damaged(pre, "has a 'history' that is not a list of per-epoch objects")
        flat.update({f"pretrain.{k}": v for k, v in record.items() if k not in PRETRAIN_RECORD_ONLY})
        metrics = {**metrics, "pretrain_loss": history[-1].get("train_loss")}
    return flat, metrics, os.path.lexists(pre)


def run_status(run: Path, config: dict[str, Any], metrics: dict[str, Any], pretrain: bool) -> str:
    """``finished`` or ``unfinished: epoch E of N`` from ``checkpoints/last.pt``'s records (its
    tensors are not read) against ``train.epochs`` of ``config.yaml``, and whether ``metrics.json``
    belongs to that state (a run resumed with more epochs keeps its earlier result until it ends);
    ``unfinished: final evaluation not done`` for a run whose training ended without a
    ``metrics.json`` (killed while testing); ``running (pid P): epoch E of N`` or ``running (pid P):
    final evaluation`` while a live process of this machine holds the run's lock."""
    from sciformer.engine.checkpoint import checkpoint_progress  # torch: only when runs are compared
    from sciformer.engine.selection import stopped_early

    last = run / "checkpoints" / "last.pt"
    holder = lock_holder(run)  # a run that a process of this machine is writing now
    running = f"running (pid {holder})" if holder is not None else None
    if pretrain:  # pretrain.json is written after checkpoints/best.pt; a kill between older writes left it without
        return "finished" if (run / "checkpoints" / "best.pt").is_file() else "unfinished: no checkpoints/best.pt"
    if not os.path.lexists(last):
        return f"{running}: no checkpoints/last.pt yet" if running else "no checkpoints/last.pt"
    progress = checkpoint_progress(last)
    done, step, best = progress["epoch"], progress["step_in_epoch"], progress["best_epoch"]
    epochs, patience = config.get("train.epochs"), config.get("train.early_stop_patience")
    val_every = config.get("train.val_every") or 1
    last_row = progress["last_row"]
    early = (isinstance(patience, int) and isinstance(val_every, int) and best is not None and last_row is not None
             and stopped_early({"epoch": best}, [last_row], patience, val_every))  # the rule the trainer stops by
    if not isinstance(epochs, int) or step or not (done >= epochs or early):
        where = f"epoch {done} of {epochs}" + (f" (+{step} steps)" if step else "")
        return f"{running or 'unfinished'}: {where}" + ("; metrics.json is from an earlier end" if metrics.keys() - {"pretrain_loss"} else "")
    if running:  # training is over; the process is testing best.pt and writing metrics.json
        return f"{running}: final evaluation"
    if not metrics.keys() - {"pretrain_loss"}:  # stopped (killed) between its last epoch and its test result
        return "unfinished: final evaluation not done" + (" (after an early stop)" if done < epochs else "")
    status = "finished" + (" (early stop)" if done < epochs else "")
    if isinstance(metrics.get("best_epoch"), int) and best is not None and metrics["best_epoch"] != best:
        return status + f"; metrics.json is of epoch {metrics['best_epoch']}, best.pt of epoch {best}"
    return status


def compare_runs(runs: list[str | Path]) -> tuple[list[str], list[list[str]]]:
    """Header and rows (one per run): run name, status, the config keys whose values differ, then
    metrics, each score named by the split it was computed on (``test_oa``, ``val_oa``)."""
    if len(runs) < 1:
        raise SciformerError("compare: give at least one run folder")
    configs, metrics, statuses = [], [], []
    for run in map(Path, runs):
        config, met, pretrain = _run_files(run)
        configs.append(config)
        metrics.append(met)
        statuses.append(run_status(run, config, met, pretrain))
    keys = sorted({k for c in configs for k in c})
    differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    splits = list(dict.fromkeys(m.get("split", "test") for m in metrics))
    scores = [(s, k) for s in splits for k in SCORE_KEYS if any(m.get("split", "test") == s and k in m for m in metrics)]
    records = [k for k in RECORD_KEYS if any(k in m for m in metrics)]
    every = [(s, k) for s in splits for k in EVERY_POINT_KEYS
             if any(m.get("split", "test") == s and k in m.get("full_resolution", {}) for m in metrics)]
    header = ["run", "status", *differ, *(f"{s}_{k}" for s, k in scores), *records,
              *(f"every_point_{k}" if s == "test" else f"{s}_every_point_{k}" for s, k in every)]
    rows = []
    for name, status, cfg, met in zip(map(str, runs), statuses, configs, metrics, strict=True):
        split, full = met.get("split", "test"), met.get("full_resolution", {})
        rows.append([name, status, *(_cell(cfg.get(k)) for k in differ), *(_cell(met.get(k) if s == split else None) for s, k in scores),
                     *(_cell(met.get(k)) for k in records), *(_cell(full.get(k) if s == split else None) for s, k in every)])
    return header, rows


def write_csv(out: Path, text: str, runs: list[Path], *, overwrite: bool = False) -> None:
    """``compare --csv PATH``: never inside a compared run folder (at any depth, links resolved),
    never over an existing file unless ``overwrite``; written atomically."""
    if out.is_dir():
        raise SciformerError(f"--csv '{out}' is a directory; name a .csv file")
    target = out.resolve()
    for run in runs:
        root = Path(run).resolve()
        if target == root or root in target.parents:
            raise SciformerError(f"--csv '{out}' lies in a compared run folder ('{run}'); its files are never replaced: name a file outside it")
    if os.path.lexists(out):
        if out.suffix.lower() != ".csv":
            raise SciformerError(f"--csv '{out}' exists and is not a .csv file; name a .csv file")
        if not overwrite:
            raise SciformerError(f"--csv '{out}' exists; pass --overwrite to replace it")
    atomic_write_text(out, text)


def _shown(cell: str) -> str:
    """A table cell on one line: trailing whitespace dropped (a folded YAML ``description: >`` ends
    in a newline), other newlines, tabs and control characters escaped (``\\n``)."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], cell.rstrip())


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns aligned with two spaces, a rule under the header; one line per row (:func:`_shown`)."""
    header, rows = [_shown(c) for c in header], [[_shown(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def to_csv(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


# ------------------------------------------------------------------------- config --list


def _source_comments(cls: type) -> dict[str, str]:
    """``name -> trailing comment`` of ``name: type = ...  # comment`` lines in the class bodies of ``cls``'s MRO."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is BaseModel or not issubclass(klass, BaseModel):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for match in re.finditer(r"^\s{4}(\w+)\s*:[^\n#]*#\s*(.+)$", source, flags=re.MULTILINE):
            out[match.group(1)] = match.group(2).strip()
    return out


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    text = re.sub(r"typing\.|typing_extensions\.|<class '([^']+)'>", lambda m: m.group(1) or "", text)
    text = re.sub(r"Annotated\[(.+?), .*\]$", r"\1", text)
    text = re.sub(r"\b(?:[a-z_]+\.)+([A-Za-z_]+)", r"\1", text)  # module paths
    return text.replace("NoneType", "None")


def _default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def config_keys(model: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every field of a pydantic model."""
    comments = _source_comments(model)
    rows = []
    for name, info in model.model_fields.items():
        if info.is_required():
            default = "(required)"
        elif info.default_factory is not None:
            default = _default(info.default_factory())  # type: ignore[call-arg]
        else:
            value = info.default
            default = _default(value.model_dump() if isinstance(value, BaseModel) else value)
        text = " ".join((info.description or comments.get(name, "")).split())
        text = text if len(text) <= 100 else text[:97] + "..."
        rows.append((name, _type_name(info.annotation), default, text))
    return rows


def list_config(name: str) -> str:
    """The keys of model ``name``, dataset ``name`` or top-level section ``name`` (e.g. ``train``), as text."""
    from sciformer.config import ExperimentConfig
    from sciformer.registry import DATASETS, MODELS

    found: list[tuple[str, type[BaseModel]]] = []
    if name in MODELS:
        found.append((f"model '{name}' (model.*)", MODELS.get(name).config))
    if name in DATASETS:
        found.append((f"dataset '{name}' (data.*)", DATASETS.get(name).config))
    section = ExperimentConfig.model_fields.get(name) if name not in ("data", "model") else None
    if section is not None and isinstance(section.annotation, type) and issubclass(section.annotation, BaseModel):
        found.append((f"section '{name}' ({name}.*)", section.annotation))
    if not found:
        from sciformer.utils.suggest import did_you_mean

        sections = [k for k, f in ExperimentConfig.model_fields.items()
                    if k not in ("data", "model") and isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)]
        choices = [*MODELS.names(), *DATASETS.names(), *sections]
        raise ConfigError(f"config --list: unknown name '{name}'{did_you_mean(name, choices)}; "
                          f"models: {', '.join(MODELS.names())}; datasets: {', '.join(DATASETS.names())}; "
                          f"sections: {', '.join(sections)}")
    blocks = []
    for title, model in found:
        rows = config_keys(model)
        header = ["key", "type", "default", "description"]
        body = [[k, t, d if len(d) <= 60 else d[:57] + "...", desc] for k, t, d, desc in rows]
        blocks.append(f"{title}:\n" + format_table(header, body))
    return "\n\n".join(blocks)
