"""perx: prioritized experience replay for reinforcement learning.

Core (numpy + numba only): storage, priority trees, samplers, the buffer, IS weights and schedules.
``import perx`` never imports torch, gymnasium or matplotlib.
"""

from perx import losses, priorities
from perx.buffer import Batch, ReplayBuffer
from perx.episodes import Episodes
from perx.priorities import Prioritizer
from perx.samplers import LAP, Greedy, Hybrid, Proportional, RankBased, Sampler, Uniform
from perx.schedules import LinearSchedule
from perx.storage import FieldSpec, Storage
from perx.trees import MaxTree, MinTree, SumTree
from perx.weights import WeightScaleWarning, check_weight_scale, importance_weights

__version__ = "0.1.0"

__all__ = [
    "LAP",
    "Batch",
    "Episodes",
    "FieldSpec",
    "Greedy",
    "Hybrid",
    "LinearSchedule",
    "MaxTree",
    "MinTree",
    "Prioritizer",
    "Proportional",
    "RankBased",
    "ReplayBuffer",
    "Sampler",
    "Storage",
    "SumTree",
    "Uniform",
    "WeightScaleWarning",
    "__version__",
    "check_weight_scale",
    "importance_weights",
    "losses",
    "priorities",
]
