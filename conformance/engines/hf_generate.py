"""The ``hf-generate`` engine: transformers ``generate`` with a KV cache and left padding.

Incremental decode over a cache is a genuinely different numerical path from the backend's
full-sequence forward, which is what makes it a useful reference engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from conformance.engines.base import (
    Completion,
    Engine,
    EngineCapabilities,
    EngineConfig,
    LogprobKind,
    SamplingSpec,
    TokenBatch,
)
from conformance.errors import UsageError
from conformance.hf_model import (
    AUTO_ATTN,
    TRANSFORMERS_RELEASES,
    attention_in_use,
    device,
    gather_logprobs,
    load_causal_lm,
)
from conformance.routing import tapped
from conformance.sampling import SamplerOrder


class HFGenerateEngine(Engine):
    name = "hf-generate"
    capabilities = EngineCapabilities(
        releases=TRANSFORMERS_RELEASES,
        no_routes=None,
        parallel_sampling=True,
        min_p=True,
        # generate's warpers put ``MinPLogitsWarper`` after top-k and top-p
        sampler_order=SamplerOrder.MIN_P_LAST,
    )
    #: option → default (strings, as ``--engine-option`` gives them); subclasses add theirs
    OPTIONS: ClassVar[Mapping[str, str]] = {"attn_implementation": AUTO_ATTN}

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.check_options(config.options)
        self.options = {**self.OPTIONS, **config.options}
        self._model = load_causal_lm(
            config.model, config.dtype, self.options["attn_implementation"]
        )
        self._pad_id = self._model.config.pad_token_id or 0
        self._eos_id = self._model.config.eos_token_id
        # generate fills fields it is given unset from the model's generation config, so an
        # EOS left there ended rollouts that ignore EOS (77 of 128 tokens, default model)
        self._model.generation_config.eos_token_id = None

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        unknown = sorted(set(options) - set(cls.OPTIONS))
        if unknown:
            raise UsageError(
                f"unknown {cls.name} option(s) {unknown}",
                f"valid options: {', '.join(cls.OPTIONS)}",
            )

    def generate(
        self, prompts: TokenBatch, spec: SamplingSpec, *, top_logprobs: int = 0
    ) -> list[Completion]:
        import torch
        from transformers import GenerationConfig

        if spec.stop:
            raise NotImplementedError(
                f"engine {self.name!r} does not match stop strings (it runs on token ids "
                "alone; matching text needs the tokenizer)"
            )
        stops = spec.stops_at(self._eos_id)
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(list(prompt))
            mask[row, width - len(prompt) :] = 1
        generation = GenerationConfig(
            do_sample=True,
            max_new_tokens=spec.max_new_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            # 0 disables top-k; None would fall back to generate's default of 50
            top_k=spec.top_k,
            min_p=spec.min_p or None,
            # the stop ids end a row; generate keeps the token that ended it, then pads the
            # row. Never None: generate fills None from the model's generation_config.json
            # and stopped rows at EOS under ignore_eos, reporting the pads as sampled tokens
            # (the sampler-fidelity suite found it: 17% of the tokens of 32 × 64 rollouts)
            eos_token_id=sorted(stops),
            pad_token_id=self._pad_id,
            return_dict_in_generate=True,
            output_logits=True,
            output_scores=True,
            # n samples per prompt from one request: generate repeats each prompt's row n
            # times (prompt-major) and draws every row from the one seeded stream
            num_return_sequences=spec.n,
        )
        with torch.random.fork_rng(devices=[]), torch.no_grad(), tapped(self._model) as tap:
            torch.manual_seed(spec.seed)
            out = self._model.generate(
                input_ids=ids.to(device()),
                attention_mask=mask.to(device()),
                generation_config=generation,
            )
        new_tokens = out.sequences[:, width:].cpu()
        # raw logits are the model's distribution; scores are after temperature/top-k/top-p
        steps = out.logits if self.config.logprobs is LogprobKind.RAW else out.scores
        stacked = torch.stack([s.float().cpu() for s in steps], dim=1)
        token_lp, _ = gather_logprobs(stacked, new_tokens)
        top = torch.log_softmax(stacked, -1).topk(top_logprobs, dim=-1) if top_logprobs else None
        # row r of the output is child r % n of prompt r // n
        rows = [prompt for prompt in prompts for _ in range(spec.n)]
        completions = [
            self._completion(list(prompt), new_tokens[row], token_lp[row], top, row, stops)
            for row, prompt in enumerate(rows)
        ]
        if tap.active:
            prompt_rows = [
                torch.arange(row * width + width - len(p), (row + 1) * width)
                for row, p in enumerate(rows)
            ]
            lengths = [len(c.tokens) for c in completions]
            for completion, routes in zip(
                completions, tap.decoded_routes(prompt_rows, lengths), strict=True
            ):
                completion.routes = routes
        return completions

    def _completion(
        self,
        prompt: list[int],
        tokens: Any,
        logprobs: Any,
        top: Any,
        row: int,
        stops: frozenset[int],
    ) -> Completion:
        import torch

        length = len(tokens)
        finish = "length"
        if stops:
            # the padding after a stop may be a stop id itself: the first hit is the stop
            hits = torch.isin(tokens, torch.tensor(sorted(stops))).nonzero()
            if len(hits):
                length, finish = int(hits[0]) + 1, "stop"
        top_lps = None
        if top is not None:
            top_lps = [
                dict(zip(top.indices[row, t].tolist(), top.values[row, t].tolist(), strict=True))
                for t in range(length)
            ]
        return Completion(
            prompt=prompt,
            tokens=tokens[:length].tolist(),
            logprobs=logprobs[:length].tolist(),
            top_logprobs=top_lps,
            finish_reason=finish,
        )

    def score(self, sequences: TokenBatch) -> list[list[float]]:
        import torch

        width = max(map(len, sequences))
        ids = torch.full((len(sequences), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(list(seq))
            mask[row, : len(seq)] = 1
        with torch.no_grad():
            logits = self._model(
                input_ids=ids.to(device()), attention_mask=mask.to(device())
            ).logits
        lp, _ = gather_logprobs(logits[:, :-1], ids[:, 1:].to(device()))
        return [lp[row, : len(seq) - 1].tolist() for row, seq in enumerate(sequences)]

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        import torch

        with torch.no_grad():
            # load_state_dict copies into the engine's own tensors, casting to its dtype
            self._model.load_state_dict(dict(state_dict), strict=True)

    def info(self) -> dict[str, Any]:
        import transformers

        # the implementation in use, not the one asked for: "auto" names none
        attention = {"attn_implementation": attention_in_use(self._model)}
        return {
            **super().info(),
            "transformers": transformers.__version__,
            **self.options,
            **attention,
        }
