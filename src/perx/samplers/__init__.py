"""Replay strategies: which stored transitions a batch holds, and with what probability."""

from perx.samplers.base import Sampler
from perx.samplers.proportional import Proportional
from perx.samplers.uniform import Uniform

__all__ = ["Proportional", "Sampler", "Uniform"]
