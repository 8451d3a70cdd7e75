"""Multi-turn rollouts, token in / token out.

Agentic RL continues a conversation over turns: the engine generates (up to a stop token or
the length), the environment appends its reply's tokens (a tool's output, a user's message),
and the engine continues from the whole id sequence, its own earlier tokens included. The
trainer recomputes the whole conversation in one forward pass. Every token the engine generated,
in every turn, gets the log-probability the backend recomputes, within the active profile; a
failure names the turn. Frameworks that pass text between turns instead of ids detokenize and
retokenize the conversation, and the ids the engine continues from are then not the ids the
trainer scores (huggingface/trl#5224, volcengine/verl#6501): the second check measures how
often that round trip changes a conversation's ids with the model's tokenizer. It reports, and
never fails: passing ids is the framework's choice, but its users must see the number.
"""

import dataclasses

import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.engines import SamplingSpec
from conformance.strategies import log_sizes, token_sequences
from conformance.suite_support import model_tokenizer, prompt_batches, rollout_specs

#: turns per conversation (shrinking reaches 2; the top-size example holds 4)
TURNS = log_sizes(2, 4)
#: longest environment reply, in tokens
MAX_REPLY = 8
#: a turn's rollout is at most this fraction of the depth's rollout length, and a batch at
#: most MAX_BATCH sequences, so a conversation costs about one single-turn rollout example
TURN_SHARE = 8
MAX_BATCH = 4
#: the drift measurement's conversations: prompts, prompt length, turns, tokens per turn
DRIFT_PROMPTS, DRIFT_PROMPT_LEN, DRIFT_TURNS, DRIFT_TOKENS = 16, 8, 3, 16


def converse(
    engine, prompts: list[list[int]], spec: SamplingSpec, replies: list[list[list[int]]]
) -> tuple[list[list[int]], list[list[tuple[int, list[int], list[float]]]]]:
    """Run ``len(replies) + 1`` turns: generate, append each sequence's reply, generate on.

    Returns the whole conversations and, per sequence, each turn's generated tokens as
    ``(start, tokens, engine logprobs)``, ``start`` their offset in the conversation. Each turn
    samples with its own seed, as a new request does.
    """
    conversations = [list(p) for p in prompts]
    turns: list[list[tuple[int, list[int], list[float]]]] = [[] for _ in prompts]
    for turn in range(len(replies) + 1):
        seeded = dataclasses.replace(spec, seed=(spec.seed + turn) % 2**31)
        for row, completion in enumerate(engine.generate(conversations, seeded)):
            turns[row].append((len(conversations[row]), completion.tokens, completion.logprobs))
            conversations[row] += completion.tokens
            if turn < len(replies):
                conversations[row] += replies[turn][row]
    return conversations, turns


@given(data=st.data())
def test_multi_turn_rollout_parity(data, engine, backend, model, depth, recorder):
    turns = data.draw(TURNS, label="turns")
    per_turn = max(1, depth.max_new_tokens // TURN_SHARE)
    spec = data.draw(
        rollout_specs(model, depth, max_new_tokens=log_sizes(1, per_turn)), label="sampling"
    )
    budget = turns * spec.max_new_tokens + (turns - 1) * MAX_REPLY
    shape, prompts = data.draw(
        prompt_batches(model, depth, max_new_tokens=budget, max_batch=MAX_BATCH), label="batch"
    )
    reply = token_sequences(
        model.vocab_size, max_len=MAX_REPLY, special_ids=model.special_token_ids
    )
    replies = [
        [data.draw(reply, label=f"reply{turn}_{row}") for row in range(len(prompts))]
        for turn in range(turns - 1)
    ]
    case = {"turns": turns, "environment_ids": replies}
    recorder.case(prompts, shape, spec, **case)

    conversations, generated = converse(engine, prompts, spec, replies)
    recomputed = backend.recompute(conversations).logprobs

    per_turn = [_turn_rows(recomputed, generated, turn) for turn in range(turns)]
    # the first turn the profile rejects on its own is the one the case names
    failing = next((t for t, rows in enumerate(per_turn) if recorder.violations(*rows[:2])), None)
    if failing is not None:
        recorder.case(prompts, shape, spec, **case, turn=failing)
    # one row per conversation: its every generated token, turn after turn
    lp_train, lp_infer, positions = (
        [[v for rows in per_turn for v in rows[part][seq]] for seq in range(len(prompts))]
        for part in range(3)
    )
    scored_at = [
        [start + j for start, tokens, _ in turns for j in range(len(tokens))] for turns in generated
    ]
    recorder.check_profile(
        recorder.measure(
            lp_train, lp_infer, positions=positions, contexts=conversations, scored_at=scored_at
        )
    )


def _turn_rows(recomputed, generated, turn: int) -> tuple[list, list, list]:
    """(lp_train, lp_infer, positions) of one turn's generated tokens, one row per sequence;
    positions count from the conversation's first generated token."""
    lp_train, lp_infer, positions = [], [], []
    for row, turns in zip(recomputed, generated, strict=True):
        first = turns[0][0]
        start, tokens, logprobs = turns[turn]
        # entry t of a recompute is the log-prob of token t + 1
        lp_train.append(list(row[start - 1 : start - 1 + len(tokens)]))
        lp_infer.append(logprobs)
        positions.append(list(range(start - first, start - first + len(tokens))))
    return lp_train, lp_infer, positions


def test_retokenization_drift(engine, model, recorder, tim):
    """The fraction of conversations whose detokenize → retokenize round trip changes ids."""
    tokenizer = model_tokenizer(model)
    generator = torch.Generator().manual_seed(tim.seed)
    prompts = torch.randint(
        0, model.vocab_size, (DRIFT_PROMPTS, DRIFT_PROMPT_LEN), generator=generator
    ).tolist()
    replies = torch.randint(
        0, model.vocab_size, (DRIFT_TURNS - 1, DRIFT_PROMPTS, DRIFT_PROMPT_LEN), generator=generator
    ).tolist()
    spec = SamplingSpec(max_new_tokens=DRIFT_TOKENS, seed=tim.seed % 2**31)
    recorder.case(prompts, sampling=spec, turns=DRIFT_TURNS, environment_ids=replies)

    conversations, _ = converse(engine, prompts, spec, replies)
    changed = sum(
        tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) != ids
        for ids in conversations
    )
    recorder.note(retokenization_drift=changed / len(conversations))
    recorder.remark(
        f"retokenization drift: {changed} of {len(conversations)} {DRIFT_TURNS}-turn "
        "conversations change ids on detokenize → retokenize with the model's tokenizer "
        "(reported, not judged: a framework that passes text between turns trains on other ids "
        "than the engine sampled from)"
    )
