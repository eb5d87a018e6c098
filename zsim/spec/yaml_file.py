"""Reading user YAML files (hardware profiles, scenarios): strict about duplicate keys,
and every failure a ConfigError naming the file. Owns nothing else."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from zsim.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML keeps the last silently)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)  # type: ignore[no-untyped-call]
        if not isinstance(key, Hashable):  # `? [1, 2]`: construct_mapping says so
            break
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_duplicates)


MAX_FLOW_DEPTH = 200
"""Deepest nesting of [ and { a file may have. PyYAML's scanner slows down with depth
(1,000 levels took 4.8 s, 3,000 over 20 s), so deeper text is refused before parsing; no
profile, scenario or config nests more than a few levels."""


def _flow_depth(text: str) -> int:
    """The deepest nesting of flow brackets, counting brackets inside quoted strings
    too: an upper bound, exact for files without quoted brackets."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def read_yaml(path: Path, *, field: str) -> Any:
    """Parse a YAML file.

    Args:
        path: the file.
        field: what the file is ("hardware", "scenario"), named in errors.

    Raises:
        ConfigError: missing or unreadable file, malformed YAML (or brackets nested
            deeper than MAX_FLOW_DEPTH), or a duplicate key (the message gives the line).
    """
    try:
        text = Path(path).read_text()
        depth = _flow_depth(text)
        if depth > MAX_FLOW_DEPTH:
            raise ConfigError(field, str(path), f"malformed YAML: brackets nested {depth} "
                              f"deep (at most {MAX_FLOW_DEPTH})")
        return yaml.load(text, Loader=_StrictLoader)
    except FileNotFoundError:
        raise ConfigError(field, str(path), "no such file") from None
    except OSError as e:
        raise ConfigError(field, str(path), f"cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(field, str(path), f"not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise ConfigError(field, str(path), "malformed YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None)
        raise ConfigError(field, str(path),
                          f"malformed YAML{where}" + (f": {problem}" if problem else "")
                          ) from None
