"""Distributed prioritized replay on Ray (optional extra ``perx[ray]``): a sharded replay sampled as one
buffer, and the Ape-X pieces (actors with local priorities, a pipelined learner).

``import perx`` never imports this package (nor ray); ``import perx.distributed`` needs ray.
"""

from perx.distributed.rate import RateLimiter
from perx.distributed.replay import PendingBatch, Shard, ShardedReplay, decode_ids, encode_ids

__all__ = ["PendingBatch", "RateLimiter", "Shard", "ShardedReplay", "decode_ids", "encode_ids"]
