"""Overrides that switch what a section is: a ``kind`` (``data.split.kind=stratified``) or a
registry ``name`` (``model.name=point_transformer_v3_cls``).

A key the YAML (or a checkpoint's stored config) set for the old kind or model only is dropped
with a one-line note naming it, so that the override alone switches the section; a key set on
the command line for another kind than the section's is refused in one line naming that
override. A section with kind-specific keys declares them in a ``KIND_OPTIONS`` class variable
(kind -> its own keys), as :class:`sciformer.data.hsi.config.SplitConfig` does.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from sciformer.errors import ConfigError
from sciformer.frontend import from_python
from sciformer.utils.ranks import is_main_process

Registries = Mapping[str, Any]  # config section -> its registry (sciformer.registry.Registry: ``in``, ``get(name).config``)


def _section_model(raw: dict[str, Any], path: list[str], registries: Registries) -> type[BaseModel] | None:
    """The parameter model of the mapping at ``path`` (``["data", "split"]`` -> SplitConfig), or
    None where the path names no model (an unknown ``name``: validation reports it)."""
    if not path or path[0] not in registries:
        return None
    section = raw.get(path[0])
    name = section.get("name") if isinstance(section, dict) else None
    if not isinstance(name, str) or name not in registries[path[0]]:
        return None
    model: type[BaseModel] | None = registries[path[0]].get(name).config
    for part in path[1:]:
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        args = getattr(field.annotation, "__args__", (field.annotation,))
        model = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return model


def _node(raw: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    node: Any = raw
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _setter(parsed: list[tuple[str, list[str], Any]], path: list[str]) -> str | None:
    """The last override that set the value at ``path`` (itself, a key below it or a mapping above it)."""
    for text, parts, _ in reversed(parsed):
        n = min(len(parts), len(path))
        if parts[:n] == path[:n]:
            return text
    return None


def _kind_of(options: dict[str, tuple[str, ...]], key: str) -> str | None:
    return next((kind for kind, keys in options.items() if key in keys), None)


def settle_kinds(raw: dict[str, Any], parsed: list[tuple[str, list[str], Any]], source: str, registries: Registries) -> dict[str, Any]:
    """Drop (in place) the keys that ``source`` set for a kind or model an override switched away
    from, with a note; refuse an override that sets a key of another kind. ``parsed`` holds
    (override text, dotted key parts, value) in command-line order, already applied to ``raw``; ``registries`` names the registry of each section with a ``name``."""
    who = "override" if from_python() else "command line"
    for text, parts, value in parsed:
        path, key = parts[:-1], parts[-1]
        node = _node(raw, path)
        if node is None:
            continue
        if key == "name" and len(path) == 1 and path[0] in registries:
            entry_model = _section_model(raw, path, registries)
            keep = set(entry_model.model_fields) if entry_model is not None else None
            dropped = [k for k in node if keep is not None and k != "name" and k not in keep and _setter(parsed, [*path, k]) is None]
            what = f"{path[0]} '{value}'"
            model = None
        else:
            model = _section_model(raw, path, registries)
            options: dict[str, tuple[str, ...]] = getattr(model, "KIND_OPTIONS", {}) if model is not None else {}
            kind = node.get("kind", model.model_fields["kind"].default if options and model is not None else None)
            if not options or kind not in options:
                continue
            if key != "kind":
                owner = _kind_of(options, key)
                if owner is not None and owner != kind and (model is None or value != model.model_fields[key].default):
                    dotted = ".".join(parts)
                    raise ConfigError(f"{who} '{text}': {dotted} applies to kind '{owner}', not to kind '{kind}' "
                                      f"(set {'.'.join([*path, 'kind'])}={owner} as well, or leave {dotted} out)")
                continue
            dropped = [k for k in node if _kind_of(options, k) not in (None, kind) and _setter(parsed, [*path, k]) is None]
            what = f"kind '{kind}'"
        # a stored config repeats every default: only a changed value is worth a note
        noted = [k for k in dropped if model is None or k not in model.model_fields or node[k] != model.model_fields[k].default]
        if noted and is_main_process():
            names = ", ".join(".".join([*path, k]) for k in noted)
            print(f"note: {who} '{text}': {names} from {source} {'do' if len(noted) > 1 else 'does'} not apply "
                  f"to {what} and {'are' if len(noted) > 1 else 'is'} left out", file=sys.stderr)
        for k in dropped:
            del node[k]
    return raw
