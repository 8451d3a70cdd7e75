"""The example engines of docs/adding-an-engine.md, executed from the page itself, so that the
engine contract, certify and the knob suite run exactly the code the documentation shows.

Each engine is a Python block that opens with its module's docstring, ``name.py: ...``;
the page's other blocks (a registration line) are not modules and are not run.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "adding-an-engine.md"
#: the page's engine modules, in page order: ``LoopEngine`` (from scratch), ``MicroBatchedEngine``
MODULES = [
    block
    for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    if re.match(r'"""\w+\.py: ', block)
]

for source in MODULES:
    exec(compile(source, str(PAGE), "exec"), globals())
