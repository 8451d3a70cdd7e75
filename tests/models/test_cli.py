"""``tim-conformance make-model`` through its own parser and run function."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from conformance.cli import make_parser
from conformance.cli.make_model import random_shape
from conformance.errors import UsageError
from conformance.models import inspect_model
from conformance.models.cache import DEFAULT_MODEL


def _parse(*argv: str) -> argparse.Namespace:
    return make_parser("make-model").parse_args(["make-model", *argv])


def test_writes_the_model_and_prints_its_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parse(str(tmp_path / "tiny"), "--arch", "llama", "--seed", "3", "--layers", "1")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    info = inspect_model(tmp_path / "tiny")
    assert (info.arch, info.num_layers, info.vocab_size) == ("llama", 1, 384)
    weights = load_file(tmp_path / "tiny" / "model.safetensors")
    assert f"{sum(w.size for w in weights.values()):,} parameters" in out
    assert str(tmp_path / "tiny") in out
    max_prob, entropy, uniform = map(float, re.findall(r"\d+\.\d+", out.splitlines()[1]))
    assert 0.3 <= max_prob <= 0.7
    assert uniform == pytest.approx(math.log(384), abs=1e-3)
    assert entropy < uniform / 2


def test_without_options_it_makes_the_default_model() -> None:
    shape = random_shape(_parse("DIR"))
    assert {name: shape[name] for name in DEFAULT_MODEL} == DEFAULT_MODEL


def test_an_option_given_replaces_its_default_only() -> None:
    shape = random_shape(_parse("DIR", "--layers", "3"))
    assert shape == {**DEFAULT_MODEL, "layers": 3}


def test_from_gguf_takes_no_random_model_option(tmp_path: Path) -> None:
    args = _parse(str(tmp_path / "m"), "--from-gguf", "x.gguf", "--seed", "1")
    with pytest.raises(UsageError, match=r"--seed shapes a random model.*fix: drop --seed"):
        args.func(args)


def test_from_gguf_names_a_missing_source(tmp_path: Path) -> None:
    args = _parse(str(tmp_path / "m"), "--from-gguf", str(tmp_path / "absent.gguf"))
    with pytest.raises(UsageError, match="neither a file nor an installed package"):
        args.func(args)


def test_rejects_an_unknown_arch() -> None:
    with pytest.raises(UsageError, match=r"invalid choice: 'gpt2'.*make-model --help"):
        _parse("DIR", "--arch", "gpt2")


def test_a_bad_hidden_size_is_a_usage_error(tmp_path: Path) -> None:
    args = _parse(str(tmp_path / "tiny"), "--hidden", "80")
    with pytest.raises(UsageError, match="multiple of the head size 32"):
        args.func(args)
