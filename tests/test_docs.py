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


def test_the_docs_say_the_bogus_reset_step_is_refused_only_with_frame_stacks():
    """What tests/test_episodes.py shows of the next-step autoreset's reset-only step added by hand: refused with
    stacks of two frames or more, stored as a first step without (perx.gym.VectorRecorder drops it). Each place
    that mentions the step says so, in the paragraph that mentions it."""
    import perx.episodes

    training_loops = (DESIGN.parent / "training_loops.md").read_text()
    for where, text in (("perx.episodes", perx.episodes.__doc__), ("docs/training_loops.md", training_loops)):
        paragraphs = [p for p in text.split("\n\n") if "bogus reset step" in p]
        assert paragraphs, where
        for paragraph in paragraphs:
            flat = " ".join(paragraph.split())
            assert "refused only with stacks of two frames or more" in flat, where
            assert "Without stacks it is stored as the first step of a new episode" in flat, where
            assert "VectorRecorder" in flat, where
