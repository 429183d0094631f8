"""The cluster files in clusters/: they parse, say what a GPU sweep needs, and pass Ray's own checks."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml

CLUSTERS = Path(__file__).resolve().parent.parent / "clusters"
RAY_UP = ["aws-gpu.yaml", "local.yaml"]
KUBERAY = "kuberay-raycluster.yaml"
MLFLOW_K8S = "kuberay-mlflow.yaml"
ALL_YAML = [*RAY_UP, KUBERAY, MLFLOW_K8S]


def load_docs(name: str) -> list[dict]:
    with open(CLUSTERS / name) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def load_one(name: str) -> dict:
    docs = load_docs(name)
    assert len(docs) == 1, f"{name}: expected one YAML document, found {len(docs)}"
    return docs[0]


def all_setup_commands(cfg: dict) -> list[str]:
    cmds = [*cfg.get("setup_commands", []), *cfg.get("head_setup_commands", []),
            *cfg.get("worker_setup_commands", [])]
    for node_type in cfg.get("available_node_types", {}).values():
        cmds += node_type.get("worker_setup_commands", [])
    return cmds


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


# --- every file ---------------------------------------------------------------------------------


def test_clusters_folder_has_the_expected_files():
    present = {p.name for p in CLUSTERS.iterdir()}
    assert set(ALL_YAML) | {"README.md"} <= present


@pytest.mark.parametrize("name", ALL_YAML)
def test_yaml_parses_to_mappings(name):
    docs = load_docs(name)
    assert docs, f"{name} is empty"
    assert all(isinstance(d, dict) for d in docs)


# --- ray up configs -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_config_basics(name):
    cfg = load_one(name)
    assert cfg["cluster_name"].startswith("pvm-dist")
    assert cfg["provider"]["type"] in {"aws", "local"}
    assert isinstance(cfg["max_workers"], int) and cfg["max_workers"] >= 1
    assert cfg["auth"]["ssh_user"]


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_installs_pvm_dist(name):
    cmds = all_setup_commands(load_one(name))
    installs = [c for c in cmds if "pip install" in c and "pvm-dist" in c]
    assert installs, f"{name}: no setup command installs pvm-dist"
    # GPU workers must get the CUDA build, not a silent CPU-only fallback.
    worker = load_one(name).get("worker_setup_commands", [])
    assert any("PVM_DIST_CUDA=ON" in c and "pvm-dist[gpu]" in c for c in worker), name


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_start_commands(name):
    cfg = load_one(name)
    head = " ; ".join(cfg["head_start_ray_commands"])
    worker = " ; ".join(cfg["worker_start_ray_commands"])
    assert "ray stop" in head and "ray stop" in worker
    assert "ray start --head" in head
    assert "--port=6379" in head
    assert "--num-gpus=0" in head, "trials must not land on the head"
    assert "--dashboard-host=127.0.0.1" in head
    # Without this the head runs no autoscaler and `ray up` never adds workers.
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "ray start --address=$RAY_HEAD_IP:6379" in worker


def test_aws_node_types():
    cfg = load_one("aws-gpu.yaml")
    assert cfg["provider"]["region"] == "us-west-2"
    types = cfg["available_node_types"]
    head_type = cfg["head_node_type"]
    assert head_type in types
    assert types[head_type]["resources"].get("GPU") == 0
    assert "InstanceType" in types[head_type]["node_config"]
    gpu_types = {k: v for k, v in types.items() if k != head_type and v["resources"].get("GPU", 0) > 0}
    assert gpu_types, "no worker node type with a GPU resource"
    for node_type in gpu_types.values():
        assert node_type["min_workers"] == 0
        assert 1 <= node_type["max_workers"] <= cfg["max_workers"]
        assert node_type["node_config"]["InstanceType"]


def test_local_provider_addresses():
    provider = load_one("local.yaml")["provider"]
    assert provider["type"] == "local"
    assert isinstance(provider["head_ip"], str) and provider["head_ip"]
    assert provider["worker_ips"] and all(isinstance(ip, str) for ip in provider["worker_ips"])
    assert provider["head_ip"] not in provider["worker_ips"]


# --- Ray's own checks (the schema and config preparation `ray up` runs before touching a cloud) --


def _ray_schema() -> dict:
    ray = pytest.importorskip("ray")
    path = os.path.join(os.path.dirname(ray.__file__), "autoscaler", "ray-schema.json")
    if not os.path.exists(path):
        pytest.skip(f"{path} not in this Ray install")
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_config_matches_ray_schema(name):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(load_one(name), _ray_schema())


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_config_survives_ray_prepare_and_validate(name):
    """What `ray up` does before it contacts a provider: fill defaults, merge, validate."""
    pytest.importorskip("jsonschema")
    _ray_schema()
    try:
        from ray.autoscaler._private.util import prepare_config, validate_config
    except ImportError as exc:  # a private module; it may move between Ray versions
        pytest.skip(f"Ray's config preparation is not importable: {exc}")
    raw = load_one(name)
    cfg = prepare_config(copy.deepcopy(raw))
    validate_config(cfg)
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    # Our setup and start commands were kept, not replaced by the provider's defaults.
    assert cfg["head_start_ray_commands"] == raw["head_start_ray_commands"]
    assert cfg["worker_start_ray_commands"] == raw["worker_start_ray_commands"]
    assert all(c in cfg["worker_setup_commands"] for c in raw["worker_setup_commands"])
    if raw["provider"]["type"] == "local":
        # One node type, as many workers as listed machines.
        (node_type,) = types.values()
        assert node_type["max_workers"] == len(raw["provider"]["worker_ips"])


# --- KubeRay ------------------------------------------------------------------------------------


def _raycluster() -> dict:
    (rc,) = by_kind(load_docs(KUBERAY), "RayCluster")
    return rc


def test_kuberay_raycluster_head():
    rc = _raycluster()
    assert rc["apiVersion"] == "ray.io/v1"
    assert rc["metadata"]["name"]
    head = rc["spec"]["headGroupSpec"]
    params = head["rayStartParams"]
    assert params["num-gpus"] == "0"
    assert "dashboard-host" in params
    assert all(isinstance(v, str) for v in params.values()), "rayStartParams values must be strings"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    (container,) = [c for c in head["template"]["spec"]["containers"] if c["name"] == "ray-head"]
    assert container["image"].startswith("rayproject/ray:")
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert {p["containerPort"] for p in container["ports"]} >= {6379, 8265, 10001}


def test_kuberay_gpu_worker_group():
    rc = _raycluster()
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    gpu = groups["gpu"]
    assert 0 <= gpu["minReplicas"] <= gpu["replicas"] <= gpu["maxReplicas"]
    params = gpu["rayStartParams"]
    assert all(isinstance(v, str) for v in params.values()), "rayStartParams values must be strings"
    (container,) = gpu["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= 1
    assert int(params["num-gpus"]) == int(limits["nvidia.com/gpu"])
    assert rc["spec"]["rayVersion"] in container["image"]


def test_kuberay_head_sweep_volume_is_declared():
    docs = load_docs(KUBERAY)
    claims = {d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")}
    head_spec = _raycluster()["spec"]["headGroupSpec"]["template"]["spec"]
    used = {v["persistentVolumeClaim"]["claimName"] for v in head_spec.get("volumes", [])
            if "persistentVolumeClaim" in v}
    assert used and used <= claims


def test_kuberay_mlflow_server():
    docs = load_docs(MLFLOW_K8S)
    (deploy,) = by_kind(docs, "Deployment")
    (svc,) = by_kind(docs, "Service")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[:2] == ["mlflow", "server"]
    assert "--serve-artifacts" in argv
    assert any(a.startswith("--artifacts-destination") for a in argv)
    assert deploy["spec"]["replicas"] == 1
    # The Service is internal only and selects the Deployment's pods on the server's port.
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert deploy["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    port_arg = next(a for a in argv if a.startswith("--port"))
    assert port_arg.split("=")[-1] == "5000"
    assert svc["spec"]["ports"][0]["port"] == 5000
    # Claims the Deployment mounts are declared in the same file.
    claims = {d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")}
    used = {v["persistentVolumeClaim"]["claimName"]
            for v in deploy["spec"]["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
    assert used <= claims


def test_kuberay_mlflow_allowed_hosts_admit_the_service_name():
    """MLflow rejects unknown Host headers; the Service's DNS names and localhost must pass."""
    pytest.importorskip("mlflow")
    try:
        from mlflow.server.security_utils import is_allowed_host_header
    except ImportError as exc:
        pytest.skip(f"MLflow's host check is not importable: {exc}")
    (deploy,) = by_kind(load_docs(MLFLOW_K8S), "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    arg = next(a for a in container["args"] if a.startswith("--allowed-hosts="))
    allowed = arg.split("=", 1)[1].split(",")
    for host in ["mlflow:5000", "mlflow.pvm-dist.svc.cluster.local:5000", "localhost:5000", "127.0.0.1:5000"]:
        assert is_allowed_host_header(allowed, host), host
    assert not is_allowed_host_header(allowed, "attacker.example:5000")


# --- README -------------------------------------------------------------------------------------


def test_readme_covers_the_workflow():
    text = (CLUSTERS / "README.md").read_text()
    for needle in ["pvm-dist sweep run", "--address", "ray start --head", "ray start --address",
                   "mlflow server", "sweep resume", "sweep status", "pvm-dist compare", "ray up",
                   "ray attach", "ray down", "kubectl apply", "port-forward", "pvm-sweeps/",
                   "pvm-dist sweep submit", "pvm-dist sweep list", "pvm-dist sweep logs", "pvm-dist sweep stop"]:
        assert needle in text, needle
    assert len(text.splitlines()) <= 200  # one page per way of running: local, Ray Jobs, Ray Client, clouds
    # Every cluster file it points to exists.
    for name in ALL_YAML:
        assert f"clusters/{name}" in text, name


# --- versions -----------------------------------------------------------------------------------


def project_requirement(name: str) -> str:
    """The version range pyproject.toml gives ``name`` (e.g. ``>=2.40,<2.61``)."""
    import re

    text = (CLUSTERS.parent / "pyproject.toml").read_text()  # tomllib is 3.11+; the project supports 3.10
    (req,) = re.findall(rf'^\s*"{re.escape(name)}(?:\[[^\]]*\])?([<>=~!][^"]*)",', text, flags=re.M)
    return req


def test_every_ray_and_mlflow_version_in_clusters_lies_in_pyprojects_range():
    import re

    from packaging.specifiers import SpecifierSet

    ray_range, mlflow_range = SpecifierSet(project_requirement("ray")), SpecifierSet(project_requirement("mlflow"))
    text = {p.name: p.read_text() for p in CLUSTERS.glob("*.yaml")}
    ray_pins = [(n, v) for n, t in text.items() for v in re.findall(r"ray(?:\[default\])?==([0-9.]+)", t)]
    images = [(n, v) for n, t in text.items() for v in re.findall(r"rayproject/ray:([0-9.]+)-", t)]
    ray_versions = [(n, v) for n, t in text.items() for v in re.findall(r'rayVersion: "([0-9.]+)"', t)]
    mlflow_images = [(n, v) for n, t in text.items() for v in re.findall(r"mlflow/mlflow:v([0-9.]+)", t)]
    assert ray_pins and images and ray_versions and mlflow_images
    for name, version in ray_pins + images + ray_versions:
        assert version in ray_range, f"{name}: Ray {version} outside pyproject's ray{ray_range}"
    assert len({v for _, v in ray_pins + images + ray_versions}) == 1  # one Ray on every node
    for name, version in mlflow_images:
        assert version in mlflow_range, f"{name}: MLflow {version} outside pyproject's mlflow{mlflow_range}"
