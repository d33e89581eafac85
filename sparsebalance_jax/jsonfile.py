"""Result files the library writes (run config, latency tables, evaluation and study results,
mesh ablations, benchmark tables): whole or not at all. A run killed mid-write, or a payload
that fails to serialise, leaves the previous file in place rather than a truncated one a later
step reads."""

from __future__ import annotations

import json
import os
from typing import IO, Any, Callable


def write_text(path: str, text: str) -> None:
    """`text` to `path` through a temporary file beside it, then one rename."""
    _replace(path, lambda f: f.write(text))


def write_json(path: str, obj: Any, **dump_kwargs) -> None:
    """json.dump(obj) to `path` through a temporary file beside it, then one rename."""
    _replace(path, lambda f: json.dump(obj, f, **dump_kwargs))


def _replace(path: str, write: Callable[[IO[str]], Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
