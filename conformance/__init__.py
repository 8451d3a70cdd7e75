"""tim-conformance: a numerical conformance harness for training–inference mismatch.

Importing this package is cheap: engines, backends and torch load lazily.
"""

__version__ = "0.1.0"
