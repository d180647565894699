"""One local Ray cluster for every distributed test (starting one takes ~5 s)."""

import os
import secrets

import pytest

# Ray >= 2.59 turns token authentication on for local clusters and stores a generated token under ~/.ray;
# a token in the environment keeps CI from writing (or needing) a home folder. Ray reads these variables
# when it is first imported, so they are set before the import, and every process of the cluster inherits
# them.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

try:
    import ray
except ImportError:  # the ray extra is not installed: the tests that need a cluster skip
    ray = None


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    if ray is None:
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp_path_factory.mktemp("ray")), configure_logging=False)
    yield ray
    ray.shutdown()
