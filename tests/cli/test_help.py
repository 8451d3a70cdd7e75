"""``--help``: every option of every subcommand says what it does and its default, the choices
come from the registries (a new engine is listed by itself), and every subcommand shows an
example (issue 55)."""

from __future__ import annotations

import argparse

import pytest

from conformance.backends import BACKENDS
from conformance.cli import SUBCOMMANDS, main, make_parser
from conformance.depth import DEPTHS
from conformance.dtypes import dtype_spellings
from conformance.engines import ENGINES, LogprobKind
from conformance.options import ATTN_CHOICES, ATTN_IMPLEMENTATIONS
from conformance.profiles import available_profiles


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = make_parser(name)
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def flag(action: argparse.Action) -> str:
    return (action.option_strings or [action.dest])[-1]


def option_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's help as ``--help`` prints it (``%(default)s`` filled in), by its flag."""
    formatter = parser._get_formatter()
    return {
        flag(action): formatter._expand_help(action) if action.help else ""
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
    }


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_option_has_help_that_states_its_default(name):
    parser = subcommand(name)
    helps = option_help(parser)
    assert helps, name
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = helps[flag(action)]
        assert text and action.help != argparse.SUPPRESS, f"{name} {flag(action)} has no help"
        if action.option_strings and not (action.nargs == 0 or action.required):
            assert "default" in text, f"{name} {flag(action)}: no default in {text!r}"


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_shows_an_example(name):
    epilog = subcommand(name).epilog or ""
    assert "examples:" in epilog and f"tim-conformance {name}" in epilog, epilog


def test_certify_lists_the_choices_of_its_options_from_the_registries():
    helps = option_help(subcommand("certify"))
    listed = {
        "--engine": ENGINES.names(),
        "--backend": BACKENDS.names(),
        "--profile": available_profiles(),
        "--engine-dtype": dtype_spellings(),
        "--backend-dtype": dtype_spellings(),
        "--depth": list(DEPTHS),
        "--logprobs": [kind.value for kind in LogprobKind],
        "--backend-attn": list(ATTN_CHOICES),
    }
    for flag, choices in listed.items():
        assert choices
        for choice in choices:
            assert choice in helps[flag], f"{flag} does not list {choice!r}: {helps[flag]!r}"


def test_a_newly_registered_engine_is_listed_by_itself():
    ENGINES.register("listed-by-itself", "conformance.engines.hf_generate:HFGenerateEngine")
    try:
        assert "listed-by-itself" in option_help(subcommand("certify"))["--engine"]
    finally:
        ENGINES._entries.pop("listed-by-itself")


def test_the_clip_defaults_under_gspo_are_named_only_where_remedy_is_taken():
    certify, rl_smoke = option_help(subcommand("certify")), option_help(subcommand("rl-smoke"))
    assert "--remedy" not in certify
    for flag in ("--clip-low", "--clip-high"):
        assert "--remedy" not in certify[flag] and "--remedy gspo" in rl_smoke[flag]


def test_the_backend_attention_choices_are_ones_transformers_takes():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert set(ATTN_IMPLEMENTATIONS) <= {"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}


def test_an_unknown_dtype_is_refused_listing_the_short_spellings(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["certify", "--engine-dtype", "float8", "--out", "run"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "'float8'" in line and all(s in line for s in ("bf16", "fp16", "fp32"))
    assert not (tmp_path / "run").exists()
