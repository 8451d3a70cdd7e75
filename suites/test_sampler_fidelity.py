"""Sampler fidelity.

The engine's sampled tokens follow the distribution the sampling spec names — the backend's
logits (the trainer's view of the policy) at the spec's temperature, cut to its top-k and top-p
— and not merely report the right log-probabilities. An engine that samples at another
temperature than asked (vLLM applied a model's ``generation_config.json`` defaults to unset
parameters: NeMo-RL #3497, vLLM #15241), ignores top-p, or keeps one token too many under top-k
trains on rollouts from a policy nobody recomputes, while every log-prob comparison passes.
RL samples with temperature, top-k and top-p *together*, where the order they compose in
matters (``conformance.sampling``: the stated sampler, or the order the engine declares), so
the suite draws them together too, at temperatures below and above 1, and with min-p where the
engine takes it (``capabilities.min_p``: vLLM applies min-p first, transformers last, and the
nucleus differs); every spec's tokens are also held to the support property with zero tolerance
(``conformance.support_audit``).

Each spec samples 32 rollouts of 64 tokens, after prompts of random ids and, where the model
has a chat template, chat text as RL feeds it (a trained model answers that from peaked
distributions); at each sampled token the backend's whole processed distribution gives the
randomized probability integral transform ``u`` (:func:`conformance.sampler_stats.randomized_pit`),
i.i.d. uniform for a faithful sampler, which KS and χ² test, and the most probable token's
share of the draws is tested against what the distributions predict (where one token holds
nearly all the mass, only that count moves): :func:`~conformance.sampler_stats.fidelity_pvalue`.
The sampled tokens' summed log-probabilities are held to the mean and spread the distributions
predict (:func:`~conformance.sampler_stats.logp_score`): a sampler sharper or flatter than stated
inside the support, such as a speculative sampler whose acceptance favours the draft's likely
tokens (transformers#47932, total variation 0.05), moves that sum before the PIT's shape.
Each of the four tests is held to its share of ``SAMPLER_FALSE_ALARMS_PER_RUN``
(``conformance.metric_table``), Bonferroni over the specs and the tests.
"""

import pytest
import torch

from conformance.engines import SamplingSpec
from conformance.metric_table import SAMPLER_BINS, SAMPLER_FALSE_ALARMS_PER_RUN, breach
from conformance.sampler_stats import fidelity_pvalue, logp_score, randomized_pit
from conformance.sampling import truncate
from conformance.suite_support import chat_prompts

#: the sampler's dimensions, one at a time (a wrong one shows on its own), the default, and
#: all of them together as RL samples, colder and hotter than 1: with k = 20 the renormalised
#: top k holds a top-p nucleus well inside it, so an order that takes the nucleus of the whole
#: distribution keeps tokens the stated sampler cuts. With min-p 0.05 on top, a sampler applying
#: min-p last draws 5 % of its tokens outside the stated (min-p first) support on the default
#: model and 3 % on SmolLM2-135M (measured on hf-generate's rollouts, 16 × 32 tokens)
SPECS = {
    "default": {},
    "temperature": {"temperature": 0.7},
    "top_k": {"top_k": 5},
    "top_p": {"top_p": 0.7},
    "cold_top_k_top_p": {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
    "hot_top_k_top_p": {"temperature": 1.3, "top_k": 20, "top_p": 0.9},
    "min_p_top_k_top_p": {"top_k": 20, "top_p": 0.9, "min_p": 0.05},
}
PROMPTS, PROMPT_LEN, NEW_TOKENS = 32, 8, 64
#: each spec's share of the run's false alarms, split between its four tests: the PIT's KS and
#: χ² and the top token's share (``fidelity_pvalue``, tripled inside) and the log-prob sum
P_BOUND = SAMPLER_FALSE_ALARMS_PER_RUN / len(SPECS)
FIDELITY_BOUND, LOGP_BOUND = 3 * P_BOUND / 4, P_BOUND / 4


@pytest.mark.parametrize("sampling", SPECS.values(), ids=SPECS.keys())
def test_sampled_tokens_follow_the_stated_distribution(
    sampling, engine, backend, model, recorder, tim
):
    generator = torch.Generator().manual_seed(tim.seed)
    drawn = torch.randint(0, model.vocab_size, (PROMPTS, PROMPT_LEN), generator=generator)
    chat = chat_prompts(model)
    prompts = [
        list(chat[i // 2 % len(chat)]) if chat and i % 2 == 0 else row
        for i, row in enumerate(drawn.tolist())
    ]
    if sampling.get("min_p") and not engine.capabilities.min_p:
        pytest.skip(f"engine {engine.name!r} does not take min-p (capabilities.min_p)")
    spec = SamplingSpec(max_new_tokens=NEW_TOKENS, seed=tim.seed % 2**31, **sampling)
    recorder.case(prompts, sampling=spec)

    completions = engine.generate(prompts, spec)
    try:
        distributions = backend.next_token_logprobs(
            [c.sequence for c in completions], temperature=spec.temperature
        )
    except NotImplementedError as exc:
        pytest.skip(str(exc).splitlines()[0])
    # position len(prompt) − 1 onwards predicts the sampled tokens; cut as the engine's sampler
    # composes min-p, top-k and top-p (the stated order unless it declares another)
    logp = truncate(
        torch.cat(
            [d[len(c.prompt) - 1 :] for c, d in zip(completions, distributions, strict=True)]
        ),
        spec.top_k,
        spec.top_p,
        engine.capabilities.sampler_order,
        min_p=spec.min_p,
    )
    tokens = torch.tensor([t for c in completions for t in c.tokens])
    u = randomized_pit(logp, tokens, torch.rand(tokens.numel(), generator=generator))
    p_value = fidelity_pvalue(logp, tokens, u, SAMPLER_BINS)
    score = logp_score(logp, tokens)
    outside = int(torch.isinf(logp.gather(-1, tokens[:, None])).sum())
    # the bound noted beside each statistic: the report shows what it was held to
    recorder.note(
        sampler_p_value=p_value,
        sampler_p_value_bound=FIDELITY_BOUND,
        sampler_logp_p_value=score.p_value,
        sampler_logp_p_value_bound=LOGP_BOUND,
        sampler_logp_z=score.z,
        sampler_tokens=float(tokens.numel()),
    )
    if p_value < FIDELITY_BOUND:
        recorder.fail(
            f"sampled tokens do not follow the distribution the spec names: fidelity p-value "
            f"{p_value:.3g} < {FIDELITY_BOUND:.3g} over {tokens.numel()} tokens (mean PIT "
            f"{float(u.mean()):.3f}, ideal 0.5, above it sampled too hot; {outside} tokens "
            "outside the spec's min-p/top-k/top-p) — check the temperature, min-p, top-k and "
            "top-p the engine really applies, and their order",
            breach=breach("sampler_p_value", p_value, FIDELITY_BOUND),
        )
    if score.p_value < LOGP_BOUND:
        recorder.fail(
            f"sampled tokens are {'sharper' if score.z > 0 else 'flatter'} than the distribution "
            f"the spec names: their summed log-probs stand z = {score.z:+.2f} from its mean "
            f"(p-value {score.p_value:.3g} < {LOGP_BOUND:.3g} over {tokens.numel()} tokens; "
            f"drawn as if from p^{score.power:.3g}, {outside} tokens outside the spec's "
            "min-p/top-k/top-p) — check that the engine samples the distribution it reports at "
            "T > 0: its temperature, and any speculative acceptance or fused sampler",
            breach=breach("sampler_logp_p_value", score.p_value, LOGP_BOUND),
        )
