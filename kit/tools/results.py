"""Results a notebook hands to whoever ran it (the demo, a sweep): one JSON file per run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def save(path: str | os.PathLike, results: Any) -> Path:
    """Write ``results`` (JSON-able) to ``path`` atomically, creating its folder."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    partial.write_text(json.dumps(results, indent=2, sort_keys=True))
    partial.replace(target)
    return target


def load(path: str | os.PathLike) -> Any:
    """Read results written by :func:`save`."""
    return json.loads(Path(path).read_text())
