"""The reference ``hf-generate`` engine with release ranges that leave out the installed
transformers, for the tests of ``conformance.releases`` through ``certify``. Everything else is
the real engine; only the declaration differs.

Plug one in as ``--engine support.release_engines:BeyondInstalled`` (``tests/`` on the path).
"""

from __future__ import annotations

from dataclasses import replace

from conformance.engines.hf_generate import HFGenerateEngine
from conformance.releases import ReleaseRange


class BeyondInstalled(HFGenerateEngine):
    """Declares it runs only on a transformers release no one has yet: the installed one is
    older than supported, and ``certify`` refuses before it starts anything."""

    name = "beyond-installed"
    capabilities = replace(
        HFGenerateEngine.capabilities,
        releases=ReleaseRange("transformers", min="999.0.0", max_tested="999.0.0"),
    )


class TestedOnOlder(HFGenerateEngine):
    """Declares it was checked up to a transformers release older than the installed one:
    ``certify`` runs, warns in one line and records the standing in report.json."""

    name = "tested-on-older"
    capabilities = replace(
        HFGenerateEngine.capabilities,
        releases=ReleaseRange("transformers", min="0.1.0", max_tested="0.1.0"),
    )
