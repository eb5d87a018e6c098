"""Read a JSON file (a HuggingFace config.json, a DeepSpeed config), every failure a
ConfigError naming the file. Owns nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError


def read_json(path: Path, *, field: str) -> Any:
    """Parse a JSON file.

    Args:
        path: the file.
        field: what the file is ("model", "ds_config"), named in errors.

    Raises:
        ConfigError: missing or unreadable file, text that is not JSON (or not UTF-8), or
            nesting too deep for the parser.
    """
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(field, str(path), "no such file") from None
    except OSError as e:
        raise ConfigError(field, str(path), f"cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(field, str(path), f"not valid JSON ({e})") from None
    except RecursionError:
        raise ConfigError(field, str(path), "nested too deeply to read") from None
