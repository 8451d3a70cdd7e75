"""pytest plugin for tim-conformance (filled in with the suites)."""
