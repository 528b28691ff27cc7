"""JSON-lines files: the rows a test writes for a command to read, and the metrics and traces a run wrote."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    """Every row of the file (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
