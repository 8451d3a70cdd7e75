"""Every architecture family make-model builds passes the parity suites as a sound stack
(hf-generate vs hf, fp32, under the model's own profile, eager-only families included) with each
of its features reached by some check; a run too short to reach a feature is NOT CERTIFIED for
its coverage.

The parity suites are where an architecture's forward is compared (every position of a prompt,
of a rollout, decode against prefill); the other suites exercise the engine's sampling, batching
and caches, the same for every family. Every suite of every family, in fp32 and bf16, is the
matrix in docs/families.md (tools/family_matrix.py), a run of about an hour."""

from __future__ import annotations

import pytest
from support.certify_runs import ENGINES, VARIANT_EXAMPLES, certify

from conformance.models import ARCHS, make_model
from conformance.models.build import ROPE_ORIGINAL_POSITIONS

pytestmark = pytest.mark.families

#: the families with a distinguishing feature (the plain decoders and the first MoE certify in
#: the other environments)
FAMILIES = [arch for arch in ARCHS if arch not in ("llama", "qwen2", "qwen3", "qwen3-moe")]


#: the suites comparing the forward at every position
PARITY = ("--suite", "prefill_parity", "--suite", "rollout_parity", "--suite", "decode_vs_prefill")


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_sound_stack_of_each_family_passes_the_parity_suites_with_its_features_reached(
    tmp_path, cli_env, arch: str
) -> None:
    model = make_model(tmp_path / arch, arch=arch).path
    code, report, output = certify(
        "--model", str(model), *PARITY, *VARIANT_EXAMPLES, env=cli_env, out=tmp_path / "run"
    )
    assert code == 0, output[-3000:]
    assert report["verdict"] == "pass" and report["profile"]["name"].startswith("own-")
    assert {check["suite"] for check in report["checks"]} == set(PARITY[1::2])
    assert all(check["status"] == "pass" for check in report["checks"]), report["checks"]
    assert report["coverage"], f"{arch} declares no feature"
    assert all(feature["reached_by"] for feature in report["coverage"]), report["coverage"]


def test_a_run_too_short_for_the_scaled_rope_is_not_certified_for_its_coverage(
    tmp_path, cli_env
) -> None:
    model = make_model(tmp_path / "rope", arch="llama-rope-scaled").path
    # no check's sequences pass the original context (the sampler's 64-token rollouts
    # included), so the scaled positions are never drawn
    short = ("--max-prompt-len", "32", "--max-new-tokens", "16")
    code, report, output = certify(
        "--model", str(model), *short, *VARIANT_EXAMPLES, env=cli_env, out=tmp_path / "run"
    )
    assert code == 1, output[-3000:]
    assert report["verdict"] == "fail" and report["reason"].startswith("coverage:")
    assert f"llama3 RoPE scaling past {ROPE_ORIGINAL_POSITIONS} positions" in report["reason"]
    assert all(c["status"] != "fail" for c in report["checks"])  # no property was violated
    (rope,) = report["coverage"]
    assert rope["reached_by"] == []


def test_an_engine_dropping_the_attention_soft_cap_is_not_certified(tmp_path, cli_env) -> None:
    """The defect SGLang's CPU attention has on Gemma-2 (docs/findings/sglang-gemma2-softcap.md),
    on the reference engine: prefill parity fails it under the model's own profile, naming the
    log-probs that differ, not a sampler or a processed-log-prob mode."""
    model = make_model(tmp_path / "gemma2", arch="gemma2").path
    code, report, output = certify(
        "--engine", ENGINES + "DropsAttentionSoftcap", "--model", str(model),
        "--suite", "prefill_parity", *VARIANT_EXAMPLES, env=cli_env, out=tmp_path / "run",
    )  # fmt: skip
    assert code == 1, output[-3000:]
    assert report["verdict"] == "fail" and report["profile"]["name"].startswith("own-")
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed, report["checks"]
    assert all("PROCESSED" not in c["message"] for c in failed), failed
    assert any(c["violations"] for c in failed), failed
