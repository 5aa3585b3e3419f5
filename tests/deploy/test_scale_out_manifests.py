"""The scale-out recipes (deploy/docker-compose.router.yml, deploy/k8s/) hold together: every
server setting is one of our flags and parses, every router argument parses with vllm-router's own
parser, and every reference (services, ports, labels, names, metrics) points at something that
exists. No cluster or Docker engine is needed: this reads the files."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from common.cli_args import env_name
from common.default_model import DEFAULT_MODEL_NAME
from common.engine_config import EngineConfig
from server.config import ServerConfig, parse_args
from server.metrics import ServerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OUR_ENV = {env_name(f) for c in (EngineConfig, ServerConfig) for f in c.__dataclass_fields__}
CONTAINER_ENV = {"OMP_NUM_THREADS", "POD_NAMESPACE"}  # not ours: torch's, and the downward API's
router_args = pytest.importorskip("vllm_router.launch_router", reason="vllm-router is not installed").parse_router_args


def load_all(path: Path) -> dict[tuple[str, str], dict]:
    """The documents of a file by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(path.read_text()) if d}


def server_config(env: dict[str, str], monkeypatch):
    """The settings a replica with this environment starts with (LLM_* must be our flags)."""
    unknown = {k for k in env if k.startswith("LLM_")} - OUR_ENV - {"LLM_MODEL"}
    assert not unknown, f"not flags of ours: {unknown}"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return parse_args([])


def exported_metrics() -> set[str]:
    return {line.split("{")[0] for line in ServerMetrics(DEFAULT_MODEL_NAME).render().decode().splitlines()
            if line and not line.startswith("#")}


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_compose_router_recipe(monkeypatch):
    compose = yaml.safe_load((DEPLOY / "docker-compose.router.yml").read_text())
    services = compose["services"]
    replicas = {name: s for name, s in services.items() if name.startswith("replica-")}
    assert len(replicas) >= 2
    for name, replica in replicas.items():
        _, engine = server_config(replica["environment"], monkeypatch)
        events = engine.kv_events_config
        assert events is not None and events.publishes, name
        exposed = {int(p) for p in replica["expose"]}
        assert {8000, port_of(events.endpoint), port_of(events.replay_endpoint)} <= exposed, name
    for name in ("router", "router-cache-aware"):
        router = services[name]
        assert router["entrypoint"] == ["vllm-router"]
        args = router_args(router["command"])
        assert set(router["depends_on"]) == set(replicas)
        assert {urlparse(u).hostname for u in args.worker_urls} == set(replicas)
        assert all(urlparse(u).port == 8000 for u in args.worker_urls)
        assert int(router["ports"][0].split(":")[1]) == args.port
    kv = router_args(services["router"]["command"])
    assert kv.policy == "kv_aware" and router_args(services["router-cache-aware"]["command"]).policy == "cache_aware"
    for flag, key in (("--kv-event-source", "endpoint"), ("--kv-event-replay-source", "replay_endpoint")):
        sources = dict(a.split("=", 2)[1:] for a in services["router"]["command"] if a.startswith(flag + "="))
        assert set(sources) == set(kv.worker_urls), flag  # one source per worker
        for url, endpoint in sources.items():
            host = urlparse(url).hostname
            _, engine = server_config(replicas[host]["environment"], monkeypatch)
            assert urlparse(endpoint).hostname == host
            assert port_of(endpoint) == port_of(getattr(engine.kv_events_config, key))
    assert kv.kv_event_model == DEFAULT_MODEL_NAME  # the replicas serve the default model under its name
    assert kv.kv_event_block_size == EngineConfig().block_size


def test_kubernetes_replicas_router_gateway_and_autoscaler(monkeypatch):
    base = load_all(DEPLOY / "k8s" / "deployment.yaml") | load_all(DEPLOY / "k8s" / "service.yaml")
    replicas = base[("Deployment", "llm-serve")]
    pod = replicas["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert replicas["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (server,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
    assert set(env) - OUR_ENV - CONTAINER_ENV == set()
    _, engine = server_config(env, monkeypatch)
    events = engine.kv_events_config
    assert events is not None and events.publishes
    assert ports["kv-events"] == port_of(events.endpoint) and ports["kv-replay"] == port_of(events.replay_endpoint)
    assert base[("Service", "llm-serve")]["spec"]["selector"].items() <= labels.items()

    router_docs = load_all(DEPLOY / "k8s" / "router" / "router.yaml")
    router = router_docs[("Deployment", "llm-router")]
    (container,) = router["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["vllm-router"]
    args = router_args(container["args"])
    assert args.policy == "kv_aware" and args.service_discovery
    assert args.selector == {k: v for k, v in labels.items()}  # it finds exactly the replicas' pods
    assert args.service_discovery_port == ports["http"]
    account = router["spec"]["template"]["spec"]["serviceAccountName"]
    assert ("ServiceAccount", account) in router_docs
    binding = router_docs[("RoleBinding", account)]
    assert ("Role", binding["roleRef"]["name"]) in router_docs and binding["subjects"][0]["name"] == account
    router_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert router_ports["http"] == args.port
    service = router_docs[("Service", "llm-router")]
    assert service["spec"]["selector"].items() <= router["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] in router_ports

    gateway = load_all(DEPLOY / "k8s" / "gateway" / "inferencepool.yaml")
    pool = gateway[("InferencePool", "llm-serve")]["spec"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert [p["number"] for p in pool["targetPorts"]] == [ports["http"]]
    epp_service = gateway[("Service", pool["endpointPickerRef"]["name"])]
    assert epp_service["spec"]["ports"][0]["port"] == pool["endpointPickerRef"]["port"]["number"]
    epp = gateway[("Deployment", "llm-serve-epp")]["spec"]["template"]
    (picker,) = epp["spec"]["containers"]
    assert epp_service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in picker["ports"]}
    flags = dict(a.removeprefix("--").split("=", 1) for a in picker["args"])
    assert flags["pool-name"] == "llm-serve"
    config_map = gateway[("ConfigMap", epp["spec"]["volumes"][0]["configMap"]["name"])]
    mount = picker["volumeMounts"][0]["mountPath"]
    assert flags["config-file"].startswith(mount + "/")
    assert flags["config-file"].removeprefix(mount + "/") in config_map["data"]
    picker_config = yaml.safe_load(config_map["data"][flags["config-file"].removeprefix(mount + "/")])
    defined = {p["type"] for p in picker_config["plugins"]}
    assert {r["pluginRef"] for prof in picker_config["schedulingProfiles"] for r in prof["plugins"]} <= defined
    metrics = exported_metrics()
    assert {flags["total-queued-requests-metric"], flags["kv-cache-usage-percentage-metric"]} <= metrics
    route = gateway[("HTTPRoute", "llm-serve")]
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == "llm-serve"

    keda = load_all(DEPLOY / "k8s" / "keda" / "scaledobject.yaml")[("ScaledObject", "llm-serve")]["spec"]
    assert keda["scaleTargetRef"]["name"] == replicas["metadata"]["name"]
    query = keda["triggers"][0]["metadata"]["query"]
    assert "vllm:num_requests_waiting" in query and "vllm:num_requests_waiting" in metrics
    assert f'model_name="{DEFAULT_MODEL_NAME}"' in query
    assert keda["minReplicaCount"] <= replicas["spec"]["replicas"] <= keda["maxReplicaCount"]


def test_the_metrics_routers_read_are_exported():
    metrics = exported_metrics()
    for name in ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
                 "vllm:num_requests_running", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
        assert name in metrics, name
