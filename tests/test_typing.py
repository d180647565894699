"""The typed user of the public API (tests/typing/public_api.py) runs: its calls are real ones. The type check of
that file (mypy, configured in pyproject.toml) runs in .ci/run."""

import importlib.util
from pathlib import Path

import pytest

import perx

SPEC = importlib.util.spec_from_file_location("public_api", Path(__file__).parent / "typing" / "public_api.py")


@pytest.mark.parametrize("sampler", [perx.Uniform, perx.Proportional, perx.RankBased, perx.LAP, perx.Greedy])
def test_the_typed_public_api_example_runs(sampler):
    module = importlib.util.module_from_spec(SPEC)
    SPEC.loader.exec_module(module)
    assert module.use_the_buffer(sampler()) > 0
    assert len(module.use_the_episodes()) == 4


def test_the_package_ships_its_type_marker():
    assert (Path(perx.__file__).parent / "py.typed").is_file()  # PEP 561: users' checkers read perx's annotations
