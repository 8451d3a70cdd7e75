"""The engine contract as a tool: the protocol checks and precision controls every engine must
pass, run against any engine — built-in or your own ``module:Class`` — without editing the
project: ``tim-conformance contract --engine mymod:MyEngine``.

``checks`` holds the checks (pytest tests over a ``subject`` fixture); ``test_contract`` is the
pytest module the subcommand runs, its options added by this folder's ``conftest``; the
project's own ``tests/engines/test_contract.py`` runs the same checks over the built-in engines.
A capability the engine declares it lacks (``conformance.engines.Unsupported``, or
``info()["seeded"]`` false) skips with the engine's reason.
"""
