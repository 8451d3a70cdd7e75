"""End-to-end RL smoke run: a short GRPO run on the stack under test, with two detectors.

``run_smoke`` (in :mod:`conformance.rl.loop`) is the library entry point; the CLI, the suite and
``certify --rl-smoke`` call it.
"""
