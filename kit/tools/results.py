"""Results a notebook hands to whoever ran it (the demo, a sweep): one JSON file per run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..core.files import write_atomic


def save_results(path: str | os.PathLike, results: Any) -> Path:
    """Write ``results`` (JSON-able) to ``path`` atomically, creating its folder."""
    return write_atomic(path, json.dumps(results, indent=2, sort_keys=True))


def read_results(path: str | os.PathLike) -> Any:
    """Read results written by :func:`save_results`."""
    return json.loads(Path(path).read_text())
