"""Name -> builder registries for models and datasets.

Each entry pairs a builder with a pydantic model of its parameters (unknown keys
forbidden), so an experiment's ``model:`` and ``data:`` sections are validated
with the same rules as the rest of the config::

    @MODELS.register("spectralformer", config=SpectralFormerConfig)
    def build_spectralformer(cfg: SpectralFormerConfig, info: DataInfo) -> nn.Module: ...

Unknown names raise :class:`~sciformer.errors.ConfigError` listing the valid ones.
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
    """A named collection of builders with validated parameters."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(
        self,
        name: str,
        *,
        config: type[BaseModel] = NoParams,
        predictor: Callable[..., Any] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``builder`` under ``name``.

        ``predictor`` (datasets only) predicts a whole input file with a trained
        model, without building the training data; see ``sciformer.contracts``.
        """

        def decorator(builder: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries and self._entries[name].builder is not builder:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            doc = (builder.__doc__ or "").strip().splitlines()
            self._entries[name] = Entry(name, builder, config, doc[0] if doc else "", predictor)
            return builder

        return decorator

    def names(self) -> list[str]:
        load_builtins()
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        load_builtins()
        return [self._entries[n] for n in sorted(self._entries)]

    def get(self, name: str, *, key: str | None = None) -> Entry:
        """Look up ``name``; ``key`` is the dotted config key used in errors."""
        load_builtins()
        if name not in self._entries:
            valid = ", ".join(sorted(self._entries)) or "(none)"
            where = f"{key}: " if key else ""
            raise ConfigError(
                f"{where}unknown {self.kind} '{name}'{did_you_mean(name, self._entries)}; "
                f"valid {self.kind}s: {valid}"
            )
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        load_builtins()
        return name in self._entries


MODELS = Registry("model")
DATASETS = Registry("dataset")

# Modules whose import registers the built-in models and datasets.
_BUILTIN_MODULES: tuple[str, ...] = (
    "sciformer.spectral.models",
    "sciformer.data.hsi.task",
    "sciformer.data.pointcloud",
    "sciformer.pointcloud.models",
)
_loaded = False


def load_builtins() -> None:
    """Import every module that registers built-in entries (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
