"""Numbers stated in docs/ are the numbers the code gives (documentation that is checked cannot drift)."""

import re
from pathlib import Path

import pytest

import perx

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"

SAMPLERS = {
    "`Uniform`": perx.Uniform,
    "`Proportional`, `LAP`": perx.Proportional,
    '`Proportional(max_priority="buffer")`': lambda: perx.Proportional(max_priority="buffer"),
    "`RankBased` (heap)": perx.RankBased,
    "`Greedy`": perx.Greedy,
    "`RankBased(exact=True)`": lambda: perx.RankBased(exact=True),
}


def memory_table():
    text = DESIGN.read_text()
    section = text[text.index("## Memory per transition"):]
    return dict(re.findall(r"^\| (`[^|]*?) \| ([\d.]+) \|$", section, re.M))


@pytest.mark.parametrize("row", sorted(SAMPLERS))
def test_bytes_per_transition_in_the_design_doc(row):
    stated = float(memory_table()[row])
    sampler = SAMPLERS[row]()
    perx.ReplayBuffer(10**6, sampler)
    assert round(sampler.nbytes / 10**6, 1) == stated


def test_lap_costs_what_its_row_says():
    for sampler, twin in ((perx.LAP(), perx.Proportional()),):
        perx.ReplayBuffer(1000, sampler)
        perx.ReplayBuffer(1000, twin)
        assert sampler.nbytes == twin.nbytes
