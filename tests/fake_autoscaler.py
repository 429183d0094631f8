"""A Ray cluster with a real autoscaler on this machine: a CPU-only head and a GPU node type (logical GPUs)
that starts at zero nodes, as the clusters under clusters/ are. Ray's fake multi-node provider starts a
node (a raylet on this machine) when the autoscaler asks for one.

``ray.cluster_utils.AutoscalingCluster`` builds the same from ``ray start --head`` after ``ray stop
--force``, which stops every Ray on the machine (other users' too), and from an example config that the
Ray wheel no longer ships; this starts its head through ``ray.cluster_utils.Cluster`` instead and stops
only the processes it started.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow_server import free_port


def config(gcs_address: str, head: dict[str, float], node_types: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The autoscaler's cluster config for the fake multi-node provider."""
    types = {name: {"node_config": {}, **spec} for name, spec in node_types.items()}
    types["ray.head.default"] = {"resources": head, "node_config": {}, "max_workers": 0}
    return {"cluster_name": "fake-pvm", "max_workers": sum(t.get("max_workers", 0) for t in types.values()),
            "upscaling_speed": 10.0, "idle_timeout_minutes": 0.05, "head_node_type": "ray.head.default",
            "available_node_types": types, "docker": {}, "auth": {"ssh_user": "ray"},
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": gcs_address},
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
            "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
            "worker_start_ray_commands": []}


@contextlib.contextmanager
def autoscaling_cluster(folder: Path, head_cpus: int, node_types: dict[str, dict[str, Any]]) -> Iterator[str]:
    """Start the head (no GPU) with an autoscaler for ``node_types``; yield its address; stop all it started."""
    import psutil
    from ray._private import ray_constants
    from ray._private.services import get_node_ip_address
    from ray.cluster_utils import Cluster

    port = free_port()
    cfg = folder / "autoscaler.json"
    ip = get_node_ip_address()  # where Cluster's head listens, and the nodes the provider starts
    cfg.write_text(json.dumps(config(f"{ip}:{port}", {"CPU": head_cpus}, node_types)))
    os.environ["RAY_FAKE_CLUSTER"] = "1"  # the monitor (a child) inherits it; the provider requires it
    os.environ["AUTOSCALER_UPDATE_INTERVAL_S"] = "1"
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "num_gpus": 0, "gcs_server_port": port,
        "include_dashboard": False, "autoscaling_config": str(cfg)})
    monitor = cluster.head_node.all_processes[ray_constants.PROCESS_TYPE_MONITOR][0].process
    try:
        yield cluster.address
    finally:
        # The monitor started the worker nodes' processes: stop them, then the head.
        children = psutil.Process(monitor.pid).children(recursive=True) if psutil.pid_exists(monitor.pid) else []
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        psutil.wait_procs(children, timeout=10)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        cluster.shutdown()
        os.environ.pop("RAY_FAKE_CLUSTER", None)
