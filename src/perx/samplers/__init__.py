"""Replay strategies: which stored transitions a batch holds, and with what probability."""

from perx.samplers.base import Sampler
from perx.samplers.greedy import Greedy
from perx.samplers.hybrid import Hybrid
from perx.samplers.proportional import LAP, Proportional
from perx.samplers.rank import RankBased
from perx.samplers.uniform import Uniform

__all__ = ["LAP", "Greedy", "Hybrid", "Proportional", "RankBased", "Sampler", "Uniform"]
