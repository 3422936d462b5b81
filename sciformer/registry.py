"""Name -> builder registries: the one registry type (models, datasets, point transforms).

Each entry pairs a builder with a pydantic model of its parameters (unknown keys
forbidden), so an experiment's ``model:`` and ``data:`` sections (and transform lists)
are validated with the same rules as the rest of the config::

    @MODELS.register("spectralformer", config=SpectralFormerConfig)
    def build_spectralformer(cfg: SpectralFormerConfig, info: DataInfo) -> nn.Module: ...

Unknown names raise :class:`~sciformer.errors.ConfigError` listing the valid ones.
Built-in models and datasets register when their modules are imported, which
:func:`load_builtins` does by name (``importlib``) on the first lookup, so this
module imports no layer above it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from sciformer.errors import ConfigError
from sciformer.utils.suggest import did_you_mean


class NoParams(BaseModel):
    """Parameter model of a builder that takes no parameters."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Entry:
    """One registered builder."""

    name: str
    builder: Callable[..., Any]
    config: type[BaseModel]
    summary: str
    predictor: Callable[..., Any] | None = None


class Registry:
    """A named collection of builders with validated parameters.

    ``builtins``: look-ups first import the built-in model and dataset modules
    (:func:`load_builtins`); a registry filled where it is defined (transforms) passes False.
    """

    def __init__(self, kind: str, *, builtins: bool = True) -> None:
        self.kind = kind
        self._builtins = builtins
        self._entries: dict[str, Entry] = {}
        self._aliases: dict[str, str] = {}

    def _load(self) -> None:
        if self._builtins:
            load_builtins()

    def register(
        self,
        name: str,
        *,
        config: type[BaseModel] = NoParams,
        predictor: Callable[..., Any] | None = None,
        aliases: tuple[str, ...] = (),
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``builder`` under ``name`` (and ``aliases``, e.g. a class name).

        ``predictor`` (datasets only) predicts a whole input file with a trained
        model, without building the training data; see ``sciformer.contracts``.
        """

        def decorator(builder: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries and self._entries[name].builder is not builder:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            doc = (builder.__doc__ or "").strip().splitlines()
            self._entries[name] = Entry(name, builder, config, doc[0] if doc else "", predictor)
            self._aliases.update({alias: name for alias in aliases})
            return builder

        return decorator

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        self._load()
        return [self._entries[n] for n in sorted(self._entries)]

    def get(self, name: str, *, key: str | None = None) -> Entry:
        """Look up ``name`` (or an alias); ``key`` is the dotted config key used in errors."""
        self._load()
        name = self._aliases.get(name, name)
        if name not in self._entries:
            valid = ", ".join(sorted(self._entries)) or "(none)"
            where = f"{key}: " if key else ""
            raise ConfigError(
                f"{where}unknown {self.kind} '{name}'{did_you_mean(name, [*self._entries, *self._aliases])}; "
                f"valid {self.kind}s: {valid}"
            )
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries or name in self._aliases


MODELS = Registry("model")
DATASETS = Registry("dataset")

# Modules whose import registers the built-in models and datasets.
_BUILTIN_MODULES: tuple[str, ...] = (
    "sciformer.spectral.models",
    "sciformer.data.hsi.task",
    "sciformer.data.pointcloud",
    "sciformer.pointcloud.models",
    "sciformer.pointcloud.ptv3",
)
_loaded = False


def load_builtins() -> None:
    """Import every module that registers built-in entries (once)."""
    global _loaded
    if _loaded:
        return
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    _loaded = True  # only once all are in: an import stopped part way (Ctrl-C) is tried again next time
