"""``tim-conformance rl-smoke``: a short GRPO run with mismatch and collapse verdicts."""

from __future__ import annotations

import argparse
from pathlib import Path

from conformance import env
from conformance.options import add_stack_options, check_output_folder
from conformance.profiles import load_profile
from conformance.rl import grpo
from conformance.rl.loop import RunConfig, run_smoke, started_stack
from conformance.rl.options import add_training_options, training_values
from conformance.rl.scenarios import DEFAULT_STRENGTH, SCENARIOS, Scenario
from conformance.stack import StackSpec

EPILOG = """examples:
  tim-conformance rl-smoke                                    # natural mismatch, embedded model
  tim-conformance rl-smoke --engine-dtype bfloat16 --steps 100 --long
  tim-conformance rl-smoke --scenario inject --at 20 --strength 0.05 --out /tmp/inject
  tim-conformance rl-smoke --scenario lr-jump --at 20 --remedy lr-decay
  tim-conformance rl-smoke --updates-per-step 4 --old-logprobs engine --engine-dtype bfloat16
  tim-conformance rl-smoke --updates-per-step 4 --clip-low 0.2 --clip-high 0.28  # DAPO clip
exit status: 0 neither verdict fired, 1 mismatch alarm or collapse, 2 usage/environment error
"""

_DEFAULTS = RunConfig()


HELP = "short RL run on the stack: mismatch alarm and collapse detection"
DESCRIPTION = (
    "GRPO on a synthetic counting task through the engine (rollouts, weights "
    "pushed every step) and the backend (recompute, update). Streams OUT/rl.jsonl and writes "
    "OUT/rl-summary.json."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG + env.help_text(env.STACK)
    add_stack_options(parser.add_argument, prefix="")
    strengths = ", ".join(f"{k} {v:g}" for k, v in DEFAULT_STRENGTH.items() if v)
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="natural",
        help="what happens to the stack mid-run (default: %(default)s)",
    )
    parser.add_argument(
        "--at",
        type=int,
        default=None,
        metavar="STEP",
        help="step the scenario starts (default: 0; inject and lr-jump: steps // 2)",
    )
    parser.add_argument(
        "--strength",
        type=float,
        default=None,
        metavar="X",
        help=f"scenario size (default: {strengths})",
    )
    parser.add_argument(
        "--ramp",
        type=int,
        default=1,
        metavar="N",
        help="steps over which the scenario ramps up to full strength (default: %(default)s)",
    )
    parser.add_argument(
        "--remedy",
        choices=grpo.REMEDIES,
        default=_DEFAULTS.remedy,
        help="the mismatch correction the objective applies (default: %(default)s)",
    )
    add_training_options(parser.add_argument, prefix="", remedy=True)

    def run_number(flag: str, kind: type, meaning: str) -> None:
        """An option whose default is ``RunConfig``'s field of the same name."""
        default = getattr(_DEFAULTS, flag.removeprefix("--").replace("-", "_"))
        parser.add_argument(
            flag, type=kind, default=default, help=f"{meaning} (default: %(default)s)"
        )

    run_number("--steps", int, "RL steps")
    run_number("--seed", int, "run seed")
    parser.add_argument(
        "--long", action="store_true", help="answers of 128–160 tokens (default: short ones)"
    )
    run_number("--lr", float, "learning rate")
    run_number("--prompts", int, "prompts per step")
    run_number("--group", int, "responses per prompt, at least 2")
    run_number("--warm-steps", int, "supervised warm-start steps before RL")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("rl-smoke"),
        metavar="DIR",
        help="folder for rl.jsonl and rl-summary.json (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    spec = StackSpec.from_options(vars(args))
    check_output_folder(args.out)
    mid_run = args.scenario in ("inject", "lr-jump")
    at = args.at if args.at is not None else (args.steps // 2 if mid_run else 0)
    config = RunConfig(
        scenario=Scenario(args.scenario, at=at, strength=args.strength, ramp=args.ramp),
        remedy=args.remedy,
        steps=args.steps,
        seed=args.seed,
        lr=args.lr,
        prompts=args.prompts,
        group=args.group,
        warm_steps=args.warm_steps,
        long=args.long,
        profile=load_profile(spec.profile),
        **training_values(vars(args)),
    )
    with started_stack(spec) as (engine, backend):
        summary = run_smoke(engine, backend, config, args.out)
    for name, verdict in (
        ("mismatch alarm", summary.mismatch_alarm),
        ("collapse", summary.collapse),
    ):
        state = f"FIRED at step {verdict.step} ({verdict.signal})" if verdict.fired else "quiet"
        print(f"{name}: {state}: {verdict.reason}")
    if summary.lead_steps is not None:
        print(f"lead: the alarm came {summary.lead_steps} steps before the collapse")
    print(f"wrote {args.out / 'rl.jsonl'} and {args.out / 'rl-summary.json'}")
    return summary.exit_code
