"""``results.jsonl``: a run's events, one JSON object per line, appended as they happen, so that
a run cut short keeps every one logged before it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the log's file name in a report folder
RESULTS_LOG = "results.jsonl"


class ResultsLog:
    """Appends each event it is called with to ``folder``/:data:`RESULTS_LOG`, which it starts
    empty; with no folder (a run without a report) it logs nowhere."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / RESULTS_LOG if folder is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def __call__(self, **event: Any) -> None:
        if self.path is None:
            return
        with self.path.open("a") as stream:
            stream.write(json.dumps(event, default=str) + "\n")
