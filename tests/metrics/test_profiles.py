"""Tolerance profiles: loading, every error, check direction, and the calibration holding."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
import torch

from conformance.calibration.runner import DEPTH_BATCHES
from conformance.errors import ProfileError
from conformance.metric_table import BY_NAME, EXAMPLE_METRICS, METRICS, metric
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.profiles import available_profiles, load_profile

SHIPPED = ("bf16", "exact", "fp16", "fp32")
#: calibrated on the embedded MoE model, implied for MoE models
SHIPPED_MOE = ("moe-bf16", "moe-fp16", "moe-fp32")
#: what the shipped profiles bound: every mismatch metric but those that grow with length
BOUNDED = {m.name for m in METRICS if not m.grows_with_length and m.family == "mismatch"}
#: what an MoE profile bounds besides: the routing metrics measured (no flipped-token mean
#: where the calibration saw no flip)
ROUTING = {m.name for m in METRICS if m.family == "routing"}
EXP_SCALE = {m.name for m in METRICS if m.exp_scale}


def test_the_shipped_profiles_have_one_sourced_threshold_per_bounded_metric() -> None:
    assert available_profiles() == sorted(SHIPPED + SHIPPED_MOE)
    for name in SHIPPED + SHIPPED_MOE:
        profile = load_profile(name)
        assert profile.name == name and profile.source.is_file()
        if name in SHIPPED:
            assert set(profile.thresholds) == BOUNDED
        else:
            routing = {"route_agreement", "route_flip_tokens", "abs_diff_mean_route_kept"}
            # where routes flip, the metrics on ρ itself are left unbounded, saying so
            unbounded = BOUNDED - set(profile.thresholds)
            assert unbounded <= EXP_SCALE, unbounded
            assert routing <= set(profile.thresholds) <= BOUNDED | ROUTING
            text = profile.source.read_text()
            assert all(f"# {n} not bounded: routes flip" in text for n in unbounded), name
        for line in profile.source.read_text().splitlines():
            if line.split("=")[0].strip() in BY_NAME:
                assert "#" in line, f"{name}: threshold without a source comment: {line}"


def test_profiles_tighten_with_precision() -> None:
    """exact ⊂ fp32 ⊂ fp16 ⊂ bf16: every bound loosens (or stays) from one to the next."""
    chain = [load_profile(n).thresholds for n in ("exact", "fp32", "fp16", "bf16")]
    for tighter, looser in itertools.pairwise(chain):
        for name in BOUNDED:
            fact = metric(name)
            if fact.bound == "min":
                assert looser[name] <= tighter[name], name
            else:
                assert fact.deviation(looser[name]) >= fact.deviation(tighter[name]), name


def test_each_bound_is_violated_on_its_wrong_side_only() -> None:
    profile = load_profile("fp32")
    for name, threshold in profile.bounds().items():
        fact = metric(name)
        step = max(fact.deviation(threshold), 1e-12) * 1e-3
        away = 1.0 if threshold >= fact.ideal else -1.0
        worse, better = threshold + away * step, threshold - away * step
        if fact.bound == "min":
            worse, better = threshold - step, threshold + step
        (violation,) = profile.check({name: worse})
        assert (violation.metric, violation.value, violation.threshold) == (name, worse, threshold)
        assert violation.bound == fact.bound
        assert profile.check({name: better}) == []
        assert profile.check({name: threshold}) == []  # the bound itself passes
        if fact.bound == "abs":
            # signed metrics are as wrong below the ideal as above it
            mirrored = 2 * fact.ideal - worse
            assert [v.metric for v in profile.check({name: mirrored})] == [name]
            assert profile.check({name: 2 * fact.ideal - better}) == []


def test_nan_always_violates_and_unmeasured_metrics_are_skipped() -> None:
    profile = load_profile("bf16")
    assert [v.metric for v in profile.check({"pcc": math.nan, "rho_std": math.nan})] == [
        "rho_std",
        "pcc",
    ]
    assert profile.check({}) == []
    assert profile.check({"not_a_metric": 1e9}) == []


def test_exact_profile_is_bitwise() -> None:
    lp = torch.log_softmax(torch.randn(3, 20, generator=torch.Generator().manual_seed(0)), -1)
    mask = torch.ones_like(lp, dtype=torch.bool)
    exact = load_profile("exact")
    assert exact.check(mismatch_metrics(lp, lp.clone(), mask)) == []
    off_by_one_ulp = lp.clone()
    off_by_one_ulp[1, 7] = torch.nextafter(lp[1, 7], torch.tensor(0.0))
    violated = {v.metric for v in exact.check(mismatch_metrics(lp, off_by_one_ulp, mask))}
    assert {"abs_diff_max", "exact_match_rate"} <= violated


# --- errors ---------------------------------------------------------------------------------


def test_unknown_name_lists_the_available_profiles() -> None:
    with pytest.raises(ProfileError, match=r"unknown profile 'fp8'.*bf16, exact, fp16, fp32"):
        load_profile("fp8")


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ProfileError, match="not found"):
        load_profile(tmp_path / "nope.toml")


def test_malformed_toml_carries_the_parse_message(tmp_path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("abs_diff_max = = 1\n")
    with pytest.raises(ProfileError, match=r"not valid TOML \(.*line 1"):
        load_profile(path)


def test_unknown_metric_lists_the_valid_names(tmp_path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text("abs_diff_maxx = 1e-5\n")
    with pytest.raises(ProfileError, match=r"abs_diff_maxx.*abs_diff_mean, abs_diff_p99"):
        load_profile(path)


@pytest.mark.parametrize("value", ['"1e-5"', "true", "nan", "[1.0]"])
def test_non_numeric_threshold(tmp_path, value: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"rho_std = {value}\n")
    with pytest.raises(ProfileError, match=r"rho_std = .* is not a number"):
        load_profile(path)


def test_a_user_file_loads_by_path(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('description = "loose"\nabs_diff_max = 1\npcc = 0.5\n')
    profile = load_profile(str(path))
    assert (profile.name, profile.thresholds) == ("mine", {"abs_diff_max": 1.0, "pcc": 0.5})
    assert profile.description == "loose"
    assert profile.min_pooled_tokens == 1  # unless it says otherwise, every pool is judged


def test_a_suite_table_replaces_the_bounds_it_names_for_that_suite_alone(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("k1 = 0.01\npcc = 0.99\n\n[suites.multi_turn]\nk1 = 0.05\n")
    profile = load_profile(path)
    assert profile.bounds("multi_turn") == {"k1": 0.05, "pcc": 0.99}
    assert profile.bounds("rollout_parity") == profile.bounds(None)
    drift = {"k1": 0.03, "pcc": 0.995}
    assert [v.metric for v in profile.check(drift, suite="rollout_parity")] == ["k1"]
    assert profile.check(drift, suite="multi_turn") == []


def test_a_weight_sync_table_is_ignored_with_a_warning(tmp_path, capsys) -> None:
    """calibrate wrote one before its method 10, bounding the engine against a backend holding
    new weights; the suite now judges the engine against itself under the base bounds. Loading
    says nothing; a run's preflight warns of it, once however often the profile is loaded."""
    from conformance.preflight import preflight
    from conformance.stack import StackSpec

    path = tmp_path / "old.toml"
    path.write_text("k1 = 0.01\n\n[suites.weight_sync]\nk1 = 19\n")
    profile = load_profile(path)
    assert profile.bounds("weight_sync") == {"k1": 0.01}
    (ignored,) = profile.ignored
    assert "[suites.weight_sync] table is ignored" in ignored
    assert capsys.readouterr().err == ""
    for _ in range(2):
        preflight(StackSpec(profile=str(path), profile_named=True))
        said = capsys.readouterr().err.splitlines()
        assert said.count(f"tim-conformance: warning: {ignored}") == 1, said


@pytest.mark.parametrize("pool", [500, 1_000, 4_000, 100_000])
def test_a_sound_systematic_bias_stays_inside_its_pool_scaled_bound(tmp_path, pool) -> None:
    """The reference stack's own per-token bias b, calibrated at 1,000 tokens (|Σ log ρ|/√n =
    b·√1000), passes at every pool; a bias 3× larger fails at every pool, past the calibrated
    one too."""
    import torch

    from conformance.metrics import mismatch_metrics

    bias = 0.002
    path = tmp_path / "mine.toml"
    path.write_text(
        # rounded up, as calibrate writes it
        f"max_pooled_tokens = 1000\nlog_ratio_sum_per_sqrt_tokens = {1.01 * bias * 1000**0.5}\n"
    )
    profile = load_profile(path)

    def measured(b: float) -> dict[str, float]:
        infer = torch.full((1, pool), -1.0, dtype=torch.float64)
        return mismatch_metrics(infer - b, infer, torch.ones(1, pool, dtype=torch.bool))

    assert profile.check(measured(bias), tokens=pool) == []
    assert [v.metric for v in profile.check(measured(3 * bias), tokens=pool)] == [
        "log_ratio_sum_per_sqrt_tokens"
    ]
    grown = profile.bounds(tokens=pool)["log_ratio_sum_per_sqrt_tokens"]
    assert grown == pytest.approx(1.01 * bias * max(1_000, pool) ** 0.5)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("suites = 3\n", "suites is not a set of tables"),
        ("[suites]\nk1 = 0.1\n", "suites is not a set of tables"),
        ("[suites.multi_turn]\nk1x = 0.1\n", r"\[suites.multi_turn\] names unknown metric"),
        ('[suites.multi_turn]\nk1 = "0.1"\n', r"\[suites.multi_turn\]: k1 = .* not a number"),
    ],
)
def test_a_malformed_suite_table_is_one_line(tmp_path, text: str, says: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=says) as caught:
        load_profile(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "true", '"256"'])
def test_min_pooled_tokens_must_be_a_positive_integer(tmp_path, value: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"min_pooled_tokens = {value}\nrho_std = 1e-5\n")
    with pytest.raises(ProfileError, match=r"min_pooled_tokens = .* not a positive integer"):
        load_profile(path)


def test_calibrated_profiles_judge_pools_from_the_smallest_calibrated_batch() -> None:
    smallest = min(prompts * new for prompts, _, new in DEPTH_BATCHES["deep"])
    for name in ("fp32", "bf16", "fp16"):
        assert load_profile(name).min_pooled_tokens == smallest, name
    assert load_profile("exact").min_pooled_tokens == 1  # bitwise equality holds at any size


def test_a_pool_below_the_calibrated_size_is_held_to_the_per_example_bounds_only() -> None:
    """One token's log-ratio is its own mean: a sound fp32 token 4e-6 apart breaks k1's pooled
    bound (≈ 2e-6, calibrated on ≥ 256 tokens) but no per-token bound."""
    fp32 = load_profile("fp32")
    lp = torch.tensor([[-2.0]], dtype=torch.float64)
    one_token = mismatch_metrics(lp, lp + 4e-6, torch.ones_like(lp, dtype=torch.bool))
    judged = {v.metric for v in fp32.check(one_token)}
    assert "k1" in judged and not judged & EXAMPLE_METRICS
    assert fp32.check(one_token, tokens=1) == []
    assert {v.metric for v in fp32.check(one_token, tokens=fp32.min_pooled_tokens)} == judged
    far = {**one_token, "abs_diff_max": 1.0, "k1": 1.0}
    assert {v.metric for v in fp32.check(far, tokens=1)} == {"abs_diff_max"}


def test_a_signed_mean_is_judged_past_its_noise_over_the_pool(tmp_path) -> None:
    """A few batches' worst mean can sit inside a small pool's noise: a sound bf16 stack's
    378-token pool read χ² 0.0058 against 3 × a worst of 0.0019 from two small batches. Under
    bounds that tight, sound 256-token pools whose log ρ spreads by 0.03 a token pass (the
    signed means are held to ``MEAN_NOISE_SIGMAS`` standard errors at least), though most stray
    past the bounds as written; a bias of one σ a token, 16 standard errors, still fails."""
    from conformance.profiles import MEAN_NOISE_SIGMAS

    path = tmp_path / "tight.toml"
    path.write_text("min_pooled_tokens = 256\nk1 = 3e-4\nrho_mean = 1.0003\nchi2_token = 6e-4\n")
    profile = load_profile(path)
    signed = {m.name for m in METRICS if m.noise_slope}
    assert signed == {"rho_mean", "k1", "chi2_token"}
    sigma, pool, stray = 0.03, 256, 0
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(1, pool, dtype=torch.bool)
    for _ in range(200):
        lp = -torch.rand(1, pool, generator=gen, dtype=torch.float64) * 5
        noise = torch.randn(1, pool, generator=gen, dtype=torch.float64) * sigma
        found = mismatch_metrics(lp + noise, lp, mask)
        assert not profile.check(found, tokens=pool)
        stray += bool(profile.check(found))  # the bounds as written, no pool size to scale by
        floor = profile.bounds(tokens=pool, metrics=found)["k1"]
        assert floor == pytest.approx(MEAN_NOISE_SIGMAS * math.sqrt(2 * found["k2"] / pool))
    assert stray > 150
    biased = mismatch_metrics(lp + noise + sigma, lp, mask)
    assert {v.metric for v in profile.check(biased, tokens=pool)} == signed


def test_a_mean_over_one_side_of_the_routing_split_is_judged_by_that_side_s_size() -> None:
    """A sound fp16 MoE stack's mean |log ρ| over the 3 flipped tokens of a 6,266-token pool
    read 0.81 against 0.72: a mean of 3 tokens, judged as if it were the pool's. The flipped
    side is judged from ``min_pooled_tokens`` flipped tokens on, and says why it is not below;
    the kept side likewise."""
    profile = load_profile("moe-fp16")
    bound = profile.thresholds["abs_diff_mean_route_flipped"]
    pool, few = 6266, {"route_flip_tokens": 3 / 6266, "abs_diff_mean_route_flipped": 2 * bound}
    assert profile.check(few) and not profile.check(few, tokens=pool)
    why = profile.unjudged(few, tokens=pool)
    assert set(why) == {"abs_diff_mean_route_flipped"}
    assert f"3 of the pool's {pool} tokens" in why["abs_diff_mean_route_flipped"]
    many = {**few, "route_flip_tokens": profile.min_pooled_tokens / pool}
    assert "abs_diff_mean_route_flipped" in {v.metric for v in profile.check(many, tokens=pool)}
    kept = {"route_flip_tokens": 1 - 3 / pool, "abs_diff_mean_route_kept": 1.0}
    assert set(profile.unjudged(kept, tokens=pool)) == {"abs_diff_mean_route_kept"}


def test_what_check_leaves_out_of_a_small_pool_is_named_with_why() -> None:
    """``unjudged`` names exactly the bounded metrics ``check`` skips — the pooled ones, and
    only below ``min_pooled_tokens`` — each with the pool's size and the profile's minimum."""
    fp32 = load_profile("fp32")
    lp = torch.tensor([[-2.0, -1.0, -3.0]], dtype=torch.float64)
    far = mismatch_metrics(lp, lp + 1.0, torch.ones_like(lp, dtype=torch.bool))
    every = {v.metric for v in fp32.check(far)}
    small = fp32.min_pooled_tokens - 1
    unjudged = fp32.unjudged(far, tokens=small)
    assert set(unjudged) == {m for m in fp32.thresholds if m in far} - EXAMPLE_METRICS
    assert {v.metric for v in fp32.check(far, tokens=small)} == every - set(unjudged)
    assert all(
        f"{small} tokens" in why and str(fp32.min_pooled_tokens) in why for why in unjudged.values()
    )
    assert fp32.unjudged(far, tokens=fp32.min_pooled_tokens) == {} == fp32.unjudged(far)


# --- the calibration on the real reference stack --------------------------------------------


def _engine_vs_trainer(model, engine_dtype: str, seed: int) -> dict[str, float]:
    from conformance.backends import BACKENDS, BackendConfig
    from conformance.engines import ENGINES, EngineConfig, SamplingSpec
    from conformance.models import inspect_model
    from conformance.suite_support import generated_rows

    info = inspect_model(model)
    ids = [i for i in range(info.vocab_size) if i not in set(info.special_token_ids)]
    rng = random.Random(100 + seed)  # prompts the calibration did not see
    prompts = [[rng.choice(ids) for _ in range(rng.randint(1, 24))] for _ in range(8)]
    engine = ENGINES.get("hf-generate")(EngineConfig(model=model, dtype=engine_dtype))
    completions = engine.generate(prompts, SamplingSpec(max_new_tokens=32, seed=100 + seed))
    backend = BACKENDS.get("hf")(BackendConfig(model=model))
    recomputed = backend.recompute([c.sequence for c in completions]).logprobs
    lp_train, lp_infer, _ = generated_rows(completions, recomputed)
    train, mask = stack_ragged(lp_train)
    infer, _ = stack_ragged(lp_infer)
    return mismatch_metrics(train, infer, mask)


def test_calibration_fp32_passes_fp32_and_bf16_fails_it(default_model) -> None:
    fp32, bf16 = load_profile("fp32"), load_profile("bf16")
    fp32_stack = _engine_vs_trainer(default_model, "float32", seed=0)
    bf16_stack = _engine_vs_trainer(default_model, "bfloat16", seed=0)
    assert fp32.check(fp32_stack) == []
    assert bf16.check(bf16_stack) == []
    failed = {v.metric for v in fp32.check(bf16_stack)}
    # clearly: bf16 breaks the fp32 bound on nearly every metric, by orders of magnitude
    assert len(failed) >= len(BOUNDED) - 5
    assert bf16_stack["abs_diff_mean"] > 100 * fp32.thresholds["abs_diff_mean"]


# --- calibrated profiles: provenance and where they apply ----------------------------------


def _calibrated(
    tmp_path,
    engine_dtype: str = "bfloat16",
    scored: dict[str, float] | None = None,
) -> tuple[Path, dict]:
    """A profile rendered from made-up measurements, as ``calibrate`` writes it: every kind
    within 1e-3 of every ideal, but the scored sequences 0.01 off on k1 (and at ``scored``'s
    values)."""
    from conformance.calibration.runner import KINDS, Measured, Plan, render_profile

    plan = Plan(models=(tmp_path,), engine_dtype=engine_dtype, backend_dtypes=("float32",))
    rng = random.Random(0)
    measured = {
        kind: {
            m.name: Measured([m.ideal + rng.uniform(-1e-3, 1e-3) for _ in range(4)])
            for m in METRICS
            if not m.grows_with_length and m.family == "mismatch"
        }
        for kind in KINDS
    }
    measured["scored"]["k1"] = Measured([0.01])
    measured["scored"].update({name: Measured([v]) for name, v in (scored or {}).items()})
    origin = {
        "command": 'tim-conformance calibrate --model "/my models/x" --out p.toml',
        "created": "2026-11-25T12:00:00",
        "depth": "quick",
        "batches": [[8, 64, 32], [32, 512, 128]],
        "device": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1},
        "versions": {"torch": "2.13.0", "vllm": None},
        "models": [{"path": "/my models/x", "sha256": "ab" * 32, "arch": "llama"}],
    }
    path = tmp_path / "mine.toml"
    path.write_text(render_profile(plan, measured, origin))
    return path, origin


def test_a_calibrated_profile_loads_with_its_provenance(tmp_path) -> None:
    path, origin = _calibrated(tmp_path)
    profile = load_profile(path)
    assert set(profile.thresholds) == BOUNDED
    assert profile.min_pooled_tokens == 8 * 32
    assert profile.max_pooled_tokens == 32 * (512 + 128 - 1)
    assert profile.provenance["models"] == origin["models"]
    assert profile.provenance["device"] == origin["device"]
    assert profile.provenance["versions"] == {"torch": "2.13.0"}  # TOML has no null
    assert profile.provenance["command"] == origin["command"]
    assert "calibrated on llama (x)" in profile.description
    # bf16: 3 x the worst measured distance from the ideal (at most 1e-3 here), rounded up
    assert 1e-3 < profile.thresholds["abs_diff_max"] <= 3e-3
    # the scored sequences set k1's base bound, the rollout suites keep the decoded ones'
    assert profile.thresholds["k1"] == pytest.approx(0.03)
    assert profile.bounds("rollout_parity")["k1"] <= 3e-3
    assert profile.bounds("weight_sync") == profile.bounds()
    assert "weight_sync" not in path.read_text()


def test_past_one_nat_the_exp_scale_metrics_are_not_bounded(tmp_path) -> None:
    """Past ``EXP_SCALE_RANGE`` a measured ρ-moment is one token's e^{nats}, which another
    kernel or a bigger pool outgrows (vLLM's bf16 kernels read max ρ 2.3e7 against 3e6 on
    models 23 nats apart): where a measured token's |log ρ| passed it, the ``exp_scale``
    metrics are left unbounded and the log-scale ones still bound the pool."""
    from conformance.calibration.runner import EXP_SCALE_RANGE

    path, _ = _calibrated(tmp_path)
    exp_scale = {m.name for m in METRICS if m.exp_scale}
    assert exp_scale <= set(load_profile(path).thresholds)
    big = {"abs_diff_max": 2 * EXP_SCALE_RANGE, "rho_max": 20.0, "k3": 5.0}
    path, _ = _calibrated(tmp_path, scored=big)
    profile = load_profile(path)
    assert not exp_scale & set(profile.thresholds) and "not bounded" in path.read_text()
    assert profile.thresholds["abs_diff_max"] == pytest.approx(6.0)
    assert not profile.check({"rho_max": 1e7, "rho_min": 1e-9, "k3": 1e6})
    assert profile.check({"abs_diff_max": 7.0})


@pytest.mark.parametrize("flipped", [0.0, 0.01])
def test_where_routes_flip_the_rollout_suites_keep_the_per_example_base_bounds(
    tmp_path, flipped: float
) -> None:
    """One flipped token sets a sequence's extremes, squared a pool's quadratic metrics and
    undiluted a pool-scaled sum, and the calibration's decoded rollouts may have held none of
    the flips a suite's rollouts will (a sound bf16 MoE stack's rollout max |Δlp| read 6.6
    against the 6.3 they had set): where routes flip, the rollout suites' per-example,
    quadratic and pool-scaled bounds stay the base ones, set by every sequence measured; the
    other pooled bounds still come from the decoded rollouts."""
    scored = {
        "abs_diff_max": 1.0,
        "k2": 0.1,
        "log_ratio_sum_per_sqrt_tokens": 0.1,
        "route_flip_tokens": flipped,
    }
    profile = load_profile(_calibrated(tmp_path, scored=scored)[0])
    rollout = profile.bounds("rollout_parity")
    assert profile.thresholds["abs_diff_max"] == pytest.approx(3.0)
    assert profile.thresholds["k2"] == pytest.approx(0.9)  # 3^2 x the worst
    assert profile.thresholds["log_ratio_sum_per_sqrt_tokens"] >= 0.3
    for name in ("abs_diff_max", "k2", "log_ratio_sum_per_sqrt_tokens"):
        if flipped:
            assert rollout[name] == profile.thresholds[name], name
        else:
            assert rollout[name] <= 9e-3, name
    assert profile.thresholds["k1"] == pytest.approx(0.03) and rollout["k1"] <= 3e-3
    # a one-token rollout's |Σ log ρ|/√T is its token's |Δlp|, which may be as far off as max
    # |Δlp|'s bound allows: in the base bounds, and where routes flip in the rollout suites'
    sequence = "seq_log_ratio_per_sqrt_len_max"
    assert profile.bounds()[sequence] == pytest.approx(3.0)
    if flipped:
        assert rollout[sequence] == pytest.approx(3.0)
    else:
        assert rollout["abs_diff_max"] <= rollout[sequence] <= 9e-3


def test_a_sequence_bound_is_at_least_the_token_bound_it_equals_on_one_token(tmp_path) -> None:
    """A one-token rollout's |Σ log ρ|/√T is its token's |Δlp|, and a pool of one-token
    sequences' mean of it is their mean |Δlp|; the suites draw rollouts from one token up while
    a calibration's are 32 or more. A sound fp32 SmolLM2-135M stack's 3-token rollout read
    4.6e-4 against a sequence bound of 1.7e-4, from one token 8.1e-4 off, inside max |Δlp|'s
    bound. So every profile holds a per-sequence metric to at least its per-token bound, the
    suite's own table included; a looser sequence bound stays."""
    path = tmp_path / "p.toml"
    path.write_text(
        "abs_diff_max = 0.3\nseq_log_ratio_per_sqrt_len_max = 0.1\n"
        "abs_diff_mean = 0.02\nlog_ppl_abs_diff_per_sqrt_len = 0.05\n"
        "[suites.rollout_parity]\nabs_diff_max = 0.01\n"
    )
    profile = load_profile(path)
    sequence, mean = "seq_log_ratio_per_sqrt_len_max", "log_ppl_abs_diff_per_sqrt_len"
    assert profile.bounds()[sequence] == 0.3 and profile.bounds()[mean] == 0.05
    assert not profile.check({sequence: 0.25, "abs_diff_max": 0.25})
    assert [b.metric for b in profile.check({sequence: 0.35})] == [sequence]
    # the suite's own per-token bound is below the base sequence bound: that one holds
    assert profile.bounds("rollout_parity")[sequence] == 0.1
    assert profile.thresholds[sequence] == 0.1  # the file's number, as the report lists it
    path.write_text("abs_diff_mean = 0.02\nlog_ppl_abs_diff_per_sqrt_len = 0.005\n")
    assert load_profile(path).bounds()[mean] == 0.02


def test_a_profile_from_another_model_or_device_says_so_in_one_line(tmp_path) -> None:
    profile = load_profile(_calibrated(tmp_path)[0])
    h100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 8}
    assert profile.foreign_to("ab" * 32, h100) is None  # its model, its device (count aside)
    other_model = profile.foreign_to("cd" * 32, h100)
    assert other_model is not None and "\n" not in other_model
    assert (
        "calibrated on other models" in other_model and "tim-conformance calibrate" in other_model
    )
    cpu = profile.foreign_to("ab" * 32, {"kind": "cpu", "name": "x86_64", "threads": 2})
    assert cpu is not None and "another device" in cpu and "cuda NVIDIA H100" in cpu
    # a hand-written profile claims no model and no device
    assert load_profile("exact").foreign_to("cd" * 32, h100) is None


def test_provenance_must_be_a_table(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('provenance = "my laptop"\nrho_std = 1e-5\n')
    with pytest.raises(ProfileError, match="provenance is not a table"):
        load_profile(path)


@pytest.mark.parametrize(
    ("draws", "bound"),
    [
        # eight similar draws: their worst × 3 (0.036) would sit 3.5σ out; 7 × rms 0.0103
        ([0.01] * 7 + [0.012], 0.072),
        # one draw far past the rest (a bias in one batch): worst × 3 stays the larger
        ([0.0] * 7 + [0.1], 0.3),
    ],
)
def test_a_pool_scaled_bound_is_at_least_seven_rms_of_its_draws(draws, bound) -> None:
    from conformance.calibration.runner import Measured, Plan, threshold
    from conformance.metric_table import metric

    plan = Plan(models=(), engine_dtype="bfloat16", backend_dtypes=("float32",))
    value, note = threshold(metric("log_ratio_sum_per_sqrt_tokens"), Measured(draws), plan)
    assert value == pytest.approx(bound)
    assert ("7 × rms" in note) == (bound == 0.072)


def test_calibration_measures_chat_text_where_the_model_has_a_chat_template() -> None:
    """As the suites draw them then: every other prompt that is not one id repeated ends with
    a rendered chat prompt; without a template the prompts are as before."""
    from conformance.calibration.runner import CONSTANT_EVERY, _prompt

    chat = [[7, 8, 9], [10, 11]]
    drawn = list(range(20, 26))
    markers = [1, 2]
    plain = [_prompt(i, drawn, markers) for i in range(10)]
    mixed = [_prompt(i, drawn, markers, chat) for i in range(10)]
    assert plain[CONSTANT_EVERY - 1] == mixed[CONSTANT_EVERY - 1] == [1] * 6
    # 7 8 9 | 10 11 | 7 8 9 (the first rendered prompt last), cut to 6; then the second last
    assert mixed[0] == [9, 10, 11, 7, 8, 9] and mixed[2] == [11, 7, 8, 9, 10, 11]
    assert mixed[6] == mixed[2] and mixed[8] == mixed[0] and mixed[1] == plain[1] != mixed[0]
    assert all(len(p) == 6 for p in mixed)


def test_calibration_measures_batches_of_random_ids_alone_too() -> None:
    """The suites' examples can be random ids alone, and on a trained model such a batch's pcc
    strays furthest: the first sampling seed's batches mix chat text and runs in, the others'
    rows are the random ids as drawn (but for the one-id rows both have)."""
    from conformance.calibration.runner import _batch_prompts, _prompt

    chat = [[7, 8, 9], [10, 11]]
    rows = [list(range(20 + i, 26 + i)) for i in range(6)]
    markers = [1, 2]
    first, second = (_batch_prompts(rows, markers, chat, round_) for round_ in (0, 1))
    full = [_prompt(i, row, markers, chat) for i, row in enumerate(rows)]
    assert first[:3] == full[:3] and first[4:] == full[4:] and first != second
    assert second[:3] == rows[:3] and second[4] == [1] * 6 and second[5] == rows[5]


def test_calibration_measures_rollouts_from_the_shortest_prompts_too() -> None:
    """The suites draw prompts from one token up (Hypothesis tries the shortest first), and
    the tokens decoded right after the first positions are the furthest off in low precision:
    every ``SHORT_EVERY``-th prompt of a batch is cut to 1, then 2 tokens."""
    from conformance.calibration.runner import SHORT_EVERY, SHORT_LENGTHS, _batch_prompts

    rows = [list(range(20 + i, 84 + i)) for i in range(4 * SHORT_EVERY)]
    for round_ in (0, 1):
        lengths = [len(p) for p in _batch_prompts(rows, [1, 2], [[7, 8, 9]], round_)]
        short = [n for i, n in enumerate(lengths) if i % SHORT_EVERY == SHORT_EVERY - 1]
        assert short == [*SHORT_LENGTHS, *SHORT_LENGTHS]
        assert {n for i, n in enumerate(lengths) if i % SHORT_EVERY != SHORT_EVERY - 1} == {64}


def test_a_run_within_a_token_budget_is_calibrated_on_the_batches_it_draws(tmp_path):
    """A batch above the run's token budget is measured as the two the suites draw at the top
    sizes in its place, and such a calibration is cached apart from the depth's own."""
    from conformance.calibration.own_profile import cached_profile_path
    from conformance.calibration.runner import Plan

    plan = Plan(models=(tmp_path,), engine_dtype="float32", backend_dtypes=("float32",))
    budgeted = Plan(
        models=(tmp_path,), engine_dtype="float32", backend_dtypes=("float32",), max_tokens=4128
    )
    assert plan.batches == DEPTH_BATCHES["quick"]
    assert budgeted.batches == ((8, 64, 32), (32, 1, 128), (6, 512, 128))
    assert all(p * (n + k) <= 4128 for p, n, k in budgeted.batches)
    capped = Plan(
        models=(tmp_path,),
        engine_dtype="float32",
        backend_dtypes=("float32",),
        cap=(4, 48, 24),
        max_tokens=4128,
    )
    assert capped.batches == ((4, 48, 24),)  # one batch left: the cap's, within the budget
    device = {"kind": "cpu", "name": "x86_64"}
    paths = {cached_profile_path("ab" * 32, device, p, "1.0") for p in (plan, budgeted)}
    assert len(paths) == 2
