"""Safe YAML loading with YAML 1.2 scalars and one-line errors.

PyYAML follows YAML 1.1: ``1e-3`` loads as a string, ``on``/``off``/``yes``/``no``
as booleans, ``010`` as octal 8 and ``1:30`` as sexagesimal 90. Experiment files expect
YAML 1.2 (core schema) behaviour, so this loader reads exponent floats without a dot as
floats, keeps ``on``/``yes`` as strings, and reads integers as decimal (``010`` is 10),
``0o17`` octal or ``0x1F`` hexadecimal; ``1:30`` or ``0b101`` are strings. (``_`` between
digits, as in ``1_000``, is kept from YAML 1.1 for integers and floats alike.)
Only plain data is constructed: ``!!python/...`` tags are refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from sciformer.errors import ConfigError

_FLOAT_12 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_INT_12 = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7]+|0x[0-9a-fA-F]+)$")
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_MAX_INT_DIGITS = 1_000  # far below Python's int-to-text limit (4300), far above any real config number
_MAX_EXPANDED_NODES = 100_000  # guards against "billion laughs" alias bombs


MAX_CONFIG_BYTES = 2**20  # a config is text written by hand (a few KB); 1 MiB is a mistake


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 float and bool resolution; a repeated key is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: the base class reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {str(key)[:60]!r} (a repeated key would silently replace the first)",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """A YAML 1.2 integer: decimal (leading zeros too), ``0o`` octal or ``0x`` hexadecimal."""
        text = str(self.construct_scalar(node)).replace("_", "")
        digits = len(text.lstrip("+-"))
        try:
            if digits > _MAX_INT_DIGITS:  # Python refuses such a decimal text (and to print such a number) with a bare ValueError
                raise ValueError(f"an integer of {digits:,} digits; at most {_MAX_INT_DIGITS:,} are read")
            if text[:2] in ("0o", "0x"):
                return int(text[2:], 8 if text[1] == "o" else 16)
            return int(text)
        except ValueError as exc:  # also an explicit !!int tag on something else
            problem = str(exc) if digits > _MAX_INT_DIGITS else f"expected an integer, got {text[:40]!r}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


# Drop the YAML 1.1 resolvers for bool, int and float, then add the 1.2 ones.
_Loader.yaml_implicit_resolvers = {
    key: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_12, list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_12, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def loads(text: str, *, source: str = "<string>") -> Any:
    """Parse YAML text safely; errors become one-line :class:`ConfigError` naming ``source``."""
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = str(getattr(exc, "problem", None) or exc)[:200]
        if isinstance(exc, yaml.constructor.ConstructorError) and "tag" in problem:
            problem += "; only plain YAML data is read (no !!python or other custom tags)"
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None
    size = _expanded_size(data, {})
    if size > _MAX_EXPANDED_NODES:
        raise ConfigError(f"{source}: YAML aliases expand to more than {_MAX_EXPANDED_NODES:,} values; refusing it")
    return data


def _expanded_size(node: Any, memo: dict[int, int]) -> int:
    """Number of values once aliases are expanded (shared nodes counted every time)."""
    if not isinstance(node, (dict, list)):
        return 1
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = _MAX_EXPANDED_NODES + 1  # a self-referencing node counts as too large
    children = node.values() if isinstance(node, dict) else node
    total = 1
    for child in children:
        total += _expanded_size(child, memo)
        if total > _MAX_EXPANDED_NODES:
            break
    memo[key] = total
    return total


def load_file(path: Path) -> Any:
    """Read and parse a YAML file; missing, unreadable, binary or non-UTF-8 files raise ConfigError."""
    if not path.exists():
        raise ConfigError(f"config file '{path}' does not exist")
    if path.is_dir():
        raise ConfigError(f"config file '{path}' is a directory; expected a YAML file")
    if not path.is_file():  # a FIFO would hang, /dev/zero would never end
        raise ConfigError(f"config file '{path}' is not a regular file (a pipe or a device); expected a YAML file")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file '{path}' is {path.stat().st_size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,}")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file '{path}' cannot be read: {exc.strerror}") from None
    if b"\x00" in raw:
        raise ConfigError(f"config file '{path}' is binary; expected a YAML text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file '{path}' is not UTF-8 text (byte {exc.start})") from None
    return loads(text, source=str(path))


class _Dumper(yaml.SafeDumper):
    """Quotes a string that either YAML 1.1 or this loader would read as another type (``0o17``, ``1e3``, ``010``, ``yes``)."""


_Dumper.yaml_implicit_resolvers = {
    key: [*yaml.SafeDumper.yaml_implicit_resolvers.get(key, []), *_Loader.yaml_implicit_resolvers.get(key, [])]
    for key in {*yaml.SafeDumper.yaml_implicit_resolvers, *_Loader.yaml_implicit_resolvers}
}


def _line_break_quoted(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    """A string with a character YAML folds or reads as a line break (NEL, LS, PS) in double quotes, escaped."""
    if any(c in text for c in "\x85\u2028\u2029"):
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style='"')
    return dumper.represent_str(text)


_Dumper.add_representer(str, _line_break_quoted)


def dumps(data: Any) -> str:
    """Dump plain data as block-style YAML with keys in insertion order (read back by :func:`loads` as it was)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
