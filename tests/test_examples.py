"""The examples run (a short run each: they are documentation that must not rot)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import dqn_cartpole


def test_dqn_cartpole_example_runs_a_few_hundred_steps():
    lines = []
    args = dqn_cartpole.parse(["--total-timesteps", "800", "--learning-starts", "200", "--seed", "3"])
    returns = dqn_cartpole.main(args, log=lines.append)
    assert len(returns) >= 20 and lines  # episodes ended and progress was reported
    assert all(r > 0 for r in returns)
