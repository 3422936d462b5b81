"""No true/false where a config number goes: pydantic's lax mode reads ``true`` as 1 (an
``epochs: true`` would train one epoch), so every config model is checked before validation."""

from __future__ import annotations

from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel


def _members(annotation: Any) -> list[Any]:
    """The types of a field's annotation, ``None`` left out (``int | None`` -> [int])."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return [a for a in args if a is not type(None)]


def number_only(annotation: Any) -> bool:
    """Whether a field takes numbers only (int / float, optional), so a bool is a mistake."""
    members = _members(annotation)
    return bool(members) and all(a in (int, float) for a in members)


def bool_for_number(model: type[BaseModel], values: Any, where: str) -> str | None:
    """``"<where>.<key>: expected a number, got true"`` for the first bool given to a number-only
    field of ``model`` (nested models included; ``where`` empty: the key alone), None where there is none."""
    if not isinstance(values, dict):
        return None
    for key, value in values.items():
        path = f"{where}.{key}" if where else str(key)
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        if isinstance(value, bool) and number_only(field.annotation):
            null = " or null" if type(None) in get_args(field.annotation) else ""
            return f"{path}: expected a number{null}, got {str(value).lower()}"
        for member in _members(field.annotation):
            if isinstance(member, type) and issubclass(member, BaseModel):
                found = bool_for_number(member, value, path)
                if found:
                    return found
    return None
