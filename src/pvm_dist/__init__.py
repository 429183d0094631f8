"""pvm-dist: train Predictive Vision Models (PVM) fast on GPUs, from one GPU to a Ray cluster.

The public entry points are re-exported here; each lives in the module that owns its idea.
"""

from __future__ import annotations

from pvm_dist._version import __version__  # noqa: E402

from pvm_dist.model.spec import Spec, SpecError, load_spec  # noqa: E402
from pvm_dist.model.topology import Topology, build_topology  # noqa: E402
from pvm_dist.engine import build_engine  # noqa: E402

__all__ = ["Spec", "SpecError", "load_spec", "Topology", "build_topology", "build_engine", "__version__"]
