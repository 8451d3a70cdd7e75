"""The routing suite's verdicts on the embedded MoE model (``--model embedded:moe``): engines whose
routers choose other experts than the model's rule (``tests/support/engines.py``) and a backend
whose routing replay drops the engine's routes (``tests/support/backends.py``) are NOT CERTIFIED
(exit 1) by a failed ``routing`` check; the sound hf-generate stack is CERTIFIED (exit 0) at
every engine precision, under the MoE profile its precision implies, with the routing checks
run; on a dense model the routing checks skip, saying why, and a run of nothing else is
incomplete (exit 2)."""

from __future__ import annotations

import pytest
from support.certify_runs import ENGINES, VARIANT_EXAMPLES, certify, failed_checks
from test_verdicts import NAMED_CAUSES

pytestmark = pytest.mark.slow

MOE = ("--model", "embedded:moe")
ROUTING_CHECKS = {"test_routing_agreement", "test_routing_replay"}


def _routing_checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"] if c["suite"] == "routing"}


@pytest.mark.parametrize("engine", ["LowPrecisionRouter", "TieBreakRouter"])
def test_an_engine_that_routes_otherwise_is_not_certified(tmp_path, cli_env, engine):
    code, report, output = certify(
        *MOE, "--engine", ENGINES + engine, "--suite", "routing", "--shrink-seconds", "60",
        env=cli_env, out=tmp_path / "run",
    )  # fmt: skip
    assert code == 1, output[-3000:]
    assert report["verdict"] == "fail"
    assert report["profile"]["name"] == "moe-fp32"
    failed = failed_checks(report)
    assert failed and {c["suite"] for c in failed} == {"routing"}, [c["nodeid"] for c in failed]
    # the agreement check catches it (the flips' mismatch, beyond the MoE profile), with a
    # case to replay
    by_name = {c["name"]: c for c in failed}
    assert "test_routing_agreement" in by_name, list(by_name)
    check = by_name["test_routing_agreement"]
    assert "(profile moe-fp32)" in check["message"], check["message"]
    assert any(cause in check["message"] for cause in NAMED_CAUSES), check["message"]
    assert check["metrics"]["route_agreement"] < 1.0, check["metrics"]
    case = check["worst_case"]
    assert case["prompt_ids"] and "--hypothesis-seed" in case["replay"], case


def test_a_replay_that_ignores_the_routes_is_not_certified(tmp_path, cli_env):
    code, report, output = certify(
        *MOE, "--backend", "tests.support.backends:ReplayIgnoresRoutes",
        "--engine-dtype", "bfloat16", "--suite", "routing",
        env=cli_env, out=tmp_path / "run",
    )  # fmt: skip
    assert code == 1, output[-3000:]
    assert report["verdict"] == "fail"
    failed = failed_checks(report)
    assert {c["suite"] for c in failed} == {"routing"}, [c["nodeid"] for c in failed]
    messages = {c["name"]: c["message"] for c in failed}
    assert "did not route as the engine did" in messages.get("test_routing_replay", ""), messages


#: fp32 and bf16 certify the whole stack (every suite); fp16 runs the routing and rollout suites
PARTIAL = ("--suite", "routing", "--suite", "rollout_parity")


@pytest.mark.parametrize(
    ("dtype", "profile", "suites"),
    [("float32", "moe-fp32", ()), ("bfloat16", "moe-bf16", ()), ("float16", "moe-fp16", PARTIAL)],
)
def test_the_sound_moe_stack_is_certified(tmp_path, cli_env, dtype, profile, suites):
    code, report, output = certify(
        *MOE, "--engine-dtype", dtype, *suites, *VARIANT_EXAMPLES, env=cli_env, out=tmp_path / "run"
    )
    assert code == 0, output[-3000:]
    assert report["verdict"] == "pass"
    assert report["scope"] == ("suites" if suites else "stack")
    assert report["profile"]["name"] == profile
    routing = _routing_checks(report)
    assert set(routing) == ROUTING_CHECKS
    assert {c["status"] for c in routing.values()} == {"pass"}, routing
    # the checks measured routes: the routing metrics are on record
    for check in routing.values():
        assert "route_agreement" in check["metrics"], check
    assert any(c["suite"] == "rollout_parity" and c["status"] == "pass" for c in report["checks"])


def test_on_a_dense_model_the_routing_checks_skip(tmp_path, cli_env):
    code, report, output = certify("--suite", "routing", env=cli_env, out=tmp_path / "run")
    # every check skipped: nothing was certified
    assert code == 2, output[-3000:]
    assert report["verdict"] == "incomplete"
    assert report["reason"] == "no check ran"
    assert report["profile"]["name"] == "fp32"
    routing = _routing_checks(report)
    assert set(routing) == ROUTING_CHECKS
    for check in routing.values():
        assert check["status"] == "skip"
        assert check["message"] == "a dense model has no routes (routing is checked on MoE models)"
