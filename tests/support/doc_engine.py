"""The example engine of docs/adding-an-engine.md, executed from the page itself, so that the
engine contract and the knob suite run exactly the code the documentation shows."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "adding-an-engine.md"
#: the first Python block of the page is the engine module
SOURCE = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL).group(1)

exec(compile(SOURCE, str(PAGE), "exec"), globals())
