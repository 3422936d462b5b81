"""``sciformer compare RUN...`` (config differences and metrics of runs, one table) and
``sciformer config --list NAME`` (a model's, dataset's or section's keys with type, default, meaning).
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sciformer.errors import ConfigError, SciformerError
from sciformer.utils import yamlio

METRIC_KEYS = ("oa", "aa", "macc", "kappa", "miou", "best_epoch", "best_val", "pretrain_loss")
PRETRAIN_RECORD_ONLY = ("history", "env", "train_pixels_sha256")  # pretrain.json keys that are results, not settings
EVERY_POINT_KEYS = ("oa", "miou")  # whole scenes: metrics.json's full_resolution (every point, with the test views)

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


def compare_runs(runs: list[str | Path]) -> tuple[list[str], list[list[str]]]:
    """Header and rows (one per run): run name, the config keys whose values differ, then metrics."""
    if len(runs) < 1:
        raise SciformerError("compare: give at least one run folder")
    configs, metrics, names = [], [], []
    for run in map(Path, runs):
        cfg_path = run / "config.yaml"
        if not cfg_path.is_file():
            raise SciformerError(f"compare: '{run}' is not a run folder (no config.yaml)")
        configs.append(_flatten(yamlio.load_file(cfg_path) or {}))
        mpath = run / "metrics.json"
        metrics.append(json.loads(mpath.read_text(encoding="utf-8")) if mpath.is_file() else {})
        pre = run / "pretrain.json"
        if pre.is_file():  # a `sciformer pretrain` folder: its settings compare as pretrain.*, its last loss as a metric
            record = json.loads(pre.read_text(encoding="utf-8"))
            configs[-1].update({f"pretrain.{k}": v for k, v in record.items() if k not in PRETRAIN_RECORD_ONLY})
            history = record.get("history") or [{}]
            metrics[-1]["pretrain_loss"] = history[-1].get("train_loss")
        names.append(str(run))
    keys = sorted({k for c in configs for k in c})
    differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    shown = [m for m in METRIC_KEYS if any(m in d for d in metrics)]
    every = [m for m in EVERY_POINT_KEYS if any(m in d.get("full_resolution", {}) for d in metrics)]
    header = ["run", *differ, *(f"test_{m}" if m in ("oa", "aa", "macc", "kappa", "miou") else m for m in shown),
              *(f"every_point_{m}" for m in every)]
    rows = []
    for name, cfg, met in zip(names, configs, metrics, strict=True):
        full = met.get("full_resolution", {})
        rows.append([name, *(_cell(cfg.get(k)) for k in differ), *(_cell(met.get(m)) for m in shown), *(_cell(full.get(m)) for m in every)])
    return header, rows


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns aligned with two spaces, a rule under the header."""
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
