"""Precision floor.

A low-precision stack cannot agree with an fp32 one better than rounding alone allows: the
simulated floor of objective-level-hacking App. C.1 (softmax of Gaussian logits in fp32 vs in
bf16/fp16, Table 2) bounds the std of ρ from below. A measured mismatch far *below* the floor for
the model's vocabulary and logit spread means the measurement is broken — e.g. the engine does
not really run at the precision it claims, or both sides read the same cached numbers.

The floor bounds a low-precision side against an fp32 one. Where both sides run in low
precision, they may agree below it soundly: two runs of the same low-precision kernels round
alike (a tiny Gemma-2 with eager attention, bf16 decode against a bf16 full forward, measured
std ρ exactly 0). So an agreement below the floor there is judged against an fp32 recompute of
the same tokens: the engine must still stand at least the floor away from fp32.
"""

import pytest
import torch

from conformance.engines import SamplingSpec
from conformance.floor import logit_std_for_entropy, simulate_floor
from conformance.metric_table import breach
from conformance.metrics import mismatch_metrics, stack_ragged
from conformance.suite_support import generated_rows

#: measured std ρ below this fraction of the simulated floor is flagged; rounding of the whole
#: forward pass only adds to the softmax's, so a sound measurement sits at or above the floor
FLOOR_FRACTION = 0.5
PROMPTS, PROMPT_LEN, NEW_TOKENS = 16, 8, 32


def _low_precision(tim):
    dtypes = {tim.spec.engine_dtype, tim.spec.backend_dtype}
    if dtypes == {"float32"}:
        pytest.skip("both sides run in float32: there is no rounding floor to compare with")
    return "bf16" if "bfloat16" in dtypes else "fp16"


def test_mismatch_is_not_below_the_rounding_floor(engine, backend, model, recorder, tim):
    dtype = _low_precision(tim)
    generator = torch.Generator().manual_seed(tim.seed)
    prompts = torch.randint(0, model.vocab_size, (PROMPTS, PROMPT_LEN), generator=generator)
    spec = SamplingSpec(max_new_tokens=NEW_TOKENS, seed=tim.seed % 2**31)
    recorder.case(prompts.tolist(), sampling=spec)

    completions = engine.generate(prompts.tolist(), spec)
    recomputed = backend.recompute([c.sequence for c in completions])
    lp_train, lp_infer, positions = generated_rows(completions, recomputed.logprobs)
    metrics = recorder.measure(lp_train, lp_infer, positions=positions)

    entropy = float(torch.cat(recomputed.entropy).mean())
    logit_std = logit_std_for_entropy(model.vocab_size, entropy, seed=tim.seed)
    floor = simulate_floor(dtype, model.vocab_size, logit_std, tokens=20_000, seed=tim.seed)
    recorder.note(floor_ratio_std=floor.ratio_std, floor_logit_std=logit_std)
    measured, against = metrics["rho_std"], ""
    if measured < FLOOR_FRACTION * floor.ratio_std and tim.spec.backend_dtype != "float32":
        fp32 = tim.backend_variant(dtype="float32").recompute([c.sequence for c in completions])
        reference, reported, _ = generated_rows(completions, fp32.logprobs)
        (train, mask), (infer, _) = stack_ragged(reference), stack_ragged(reported)
        measured = mismatch_metrics(train, infer, mask)["rho_std"]
        recorder.note(rho_std_against_fp32=measured)
        against = " (the engine against an fp32 recompute)"
    if measured < FLOOR_FRACTION * floor.ratio_std:
        recorder.fail(
            f"measured std ρ {measured:.3g}{against} is below the {dtype} rounding floor "
            f"{floor.ratio_std:.3g} (vocab {model.vocab_size}, logit std {logit_std:.2f}): the "
            "measurement is broken — check that the engine really runs in "
            f"{tim.spec.engine_dtype} and the backend in {tim.spec.backend_dtype}",
            metrics,
            breach=breach("rho_std_over_floor", measured / floor.ratio_std, FLOOR_FRACTION),
        )
