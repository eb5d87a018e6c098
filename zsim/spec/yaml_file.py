"""Reading user YAML files (hardware profiles, scenarios): strict about duplicate keys,
and every failure a ConfigError naming the file. Owns nothing else."""

from __future__ import annotations

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
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_duplicates)


def read_yaml(path: Path, *, field: str) -> Any:
    """Parse a YAML file.

    Args:
        path: the file.
        field: what the file is ("hardware", "scenario"), named in errors.

    Raises:
        ConfigError: missing or unreadable file, malformed YAML, or a duplicate key (the
            message gives the line).
    """
    try:
        return yaml.load(Path(path).read_text(), Loader=_StrictLoader)
    except FileNotFoundError:
        raise ConfigError(field, str(path), "no such file") from None
    except OSError as e:
        raise ConfigError(field, str(path), f"cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None)
        raise ConfigError(field, str(path),
                          f"malformed YAML{where}" + (f": {problem}" if problem else "")
                          ) from None
