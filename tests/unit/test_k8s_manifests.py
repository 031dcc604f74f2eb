"""deploy/k8s: the Kubernetes manifests render with ``kubectl kustomize``, are valid
against the Kubernetes API's schemas (kubernetes-validate's, offline, strict: an unknown
field is an error), and agree with what brokerd needs: each pod's stable name under the
headless service is a known host, the data directory is the pod's own volume, the probes
and the preStop hook run real ``brokerd ctl`` commands, the cluster file and brokerd.toml
parse with brokerd's own parsers, and every container is bounded and runs as non-root.

Only kubectl is started (about 0.1 s); without it the module is skipped (.ci/run
installs Debian's kubernetes-client)."""

from __future__ import annotations

import base64
import shutil
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from brokerd.cluster.config import parse_cluster_config
from brokerd.config import parse_config

K8S_DIR = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
#: the Kubernetes release whose API the manifests are checked against: the oldest the
#: runbook supports (deploy/runbooks/kubernetes.md). kubernetes-validate ships its schemas.
KUBERNETES_VERSION = "1.29.0"
NAMESPACE = "rookery"
CLUSTER_DOMAIN = "svc.cluster.local"
#: the broker pods' stable names the cluster file lists (the initial primaries)
INITIAL_PRIMARIES = 3

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: apt-get install kubernetes-client (.ci/run does)")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S_DIR)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(docs: list[Doc]) -> dict[str, Doc]:
    """Every workload's pod spec, by ``Kind/name``."""
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "Job")
    }


def containers(spec: Doc) -> list[Doc]:
    return spec.get("initContainers", []) + spec["containers"]


def option(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def secret_value(secret: Doc, key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def mounted_file(docs: list[Doc], spec: Doc, container: Doc, path: str) -> str:
    """The text of the ConfigMap or Secret item ``container`` sees at ``path``."""
    target = PurePosixPath(path)
    mounts = [
        m
        for m in container.get("volumeMounts", [])
        if PurePosixPath(m["mountPath"]) in target.parents
    ]
    assert mounts, f"{path}: not under any volume mount of {container['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    relative = str(target.relative_to(mount["mountPath"]))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    sources = volume["projected"]["sources"] if "projected" in volume else [volume]
    for source in sources:
        for kind, ref in (("ConfigMap", "configMap"), ("Secret", "secret")):
            if ref not in source:
                continue
            name = source[ref].get("name") or source[ref].get("secretName")
            items = source[ref].get("items")
            keys = {i["path"]: i["key"] for i in items} if items else None
            key = keys.get(relative) if keys is not None else relative
            if key is None:
                continue
            doc = one(docs, kind, name)
            return doc["data"][key] if kind == "ConfigMap" else secret_value(doc, key)
    raise AssertionError(f"{path}: no ConfigMap or Secret item in volume {volume['name']}")


def env_source(container: Doc, variable: str) -> Doc:
    entry = next((e for e in container.get("env", []) if e["name"] == variable), None)
    assert entry is not None, f"{container['name']}: no {variable} in its env"
    return entry["valueFrom"]["secretKeyRef"]


@pytest.fixture(scope="module")
def brokers(docs: list[Doc]) -> Doc:
    return one(docs, "StatefulSet", "rookery")


@pytest.fixture(scope="module")
def brokerd(brokers: Doc) -> Doc:
    (container,) = brokers["spec"]["template"]["spec"]["containers"]
    return container


def test_every_document_is_valid_for_the_kubernetes_api(docs: list[Doc]) -> None:
    kinds = sorted(d["kind"] for d in docs)
    assert {"Namespace", "StatefulSet", "PodDisruptionBudget", "Service", "Deployment"} <= set(
        kinds
    ), kinds
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]


def test_the_statefulset_gets_stable_names_from_the_headless_service(
    docs: list[Doc], brokers: Doc, brokerd: Doc
) -> None:
    service = one(docs, "Service", brokers["spec"]["serviceName"])
    assert service["metadata"]["name"] == "rookery-headless"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    labels = brokers["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert brokers["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert brokers["spec"]["replicas"] == INITIAL_PRIMARIES
    # OrderedReady would wait for rookery-0 to be ready, which needs a quorum of pods
    assert brokers["spec"]["podManagementPolicy"] == "Parallel"
    port = int(option(brokerd["command"], "--port"))
    assert [p["port"] for p in service["spec"]["ports"]] == [port]


def test_each_pod_keeps_its_data_dir_on_its_own_volume(brokers: Doc, brokerd: Doc) -> None:
    data_dir = option(brokerd["command"], "--data-dir")
    claims = {t["metadata"]["name"] for t in brokers["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in brokerd["volumeMounts"]}
    assert mounts.get(data_dir) in claims, (data_dir, mounts, claims)
    volumes = {v["name"] for v in brokers["spec"]["template"]["spec"].get("volumes", [])}
    assert not claims & volumes  # not shadowed by a pod volume of the same name


def test_probes_and_the_stop_run_brokerd_ctl(brokers: Doc, brokerd: Doc) -> None:
    ctl = ["brokerd", "ctl", "--data-dir", option(brokerd["command"], "--data-dir")]
    assert brokerd["readinessProbe"]["exec"]["command"] == [*ctl, "ready"]
    assert brokerd["lifecycle"]["preStop"]["exec"]["command"] == [*ctl, "root", "disable"]
    port = int(option(brokerd["command"], "--port"))
    named = {p["name"]: p["containerPort"] for p in brokerd["ports"]}
    for probe in ("livenessProbe", "startupProbe"):
        target = brokerd[probe]["tcpSocket"]["port"]
        assert named.get(target, target) == port, probe
    liveness = brokerd["livenessProbe"]
    # a broker stalled for less than half a minute is never killed
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 30
    # the planned stop (queues moved, about 6 s; root handed over) fits in the grace
    assert brokers["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30


def test_the_cluster_file_parses_and_names_the_pods(
    docs: list[Doc], brokers: Doc, brokerd: Doc, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = brokers["spec"]["template"]["spec"]
    text = mounted_file(docs, spec, brokerd, option(brokerd["command"], "--cluster"))
    raw = tomllib.loads(text)
    # the secret comes from the environment, set from the Secret
    ref = env_source(brokerd, raw["secret_env"])
    monkeypatch.setenv(
        raw["secret_env"], secret_value(one(docs, "Secret", ref["name"]), ref["key"])
    )
    config = parse_cluster_config(raw, "cluster.toml")
    port = int(option(brokerd["command"], "--port"))
    service = brokers["spec"]["serviceName"]
    domain = f"{service}.{NAMESPACE}.{CLUSTER_DOMAIN}"
    name = brokers["metadata"]["name"]
    assert [str(h) for h in config.known_hosts] == [
        f"{name}-{i}.{domain}:{port}" for i in range(INITIAL_PRIMARIES)
    ]
    # pods beyond the initial ones find the cluster by the headless service's name
    assert config.discovery is not None
    assert (config.discovery.name, config.discovery.port) == (domain, port)
    assert config.heartbeat_timeout > config.heartbeat_interval


def test_brokerd_toml_parses(docs: list[Doc], brokers: Doc, brokerd: Doc) -> None:
    spec = brokers["spec"]["template"]["spec"]
    text = mounted_file(docs, spec, brokerd, option(brokerd["command"], "--config"))
    config = parse_config(tomllib.loads(text), "brokerd.toml")
    assert config.users, "no users: the broker would fall back to guest from loopback only"


def test_the_brokers_link_to_the_console_with_its_token(docs: list[Doc], brokerd: Doc) -> None:
    url = urlsplit(option(brokerd["command"], "--console"))
    assert url.scheme == "ws" and url.path == "/ws/brokers/"
    name, _, namespace = url.hostname.partition(".")
    assert namespace == f"{NAMESPACE}.{CLUSTER_DOMAIN}"
    service = one(docs, "Service", name)
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    console = next(
        c for c in pod_specs(docs)["Deployment/console"]["containers"] if c["name"] == "console"
    )
    assert env_source(brokerd, "ROOKERY_CONSOLE_TOKEN") == env_source(
        console, "CONSOLE_BROKER_TOKEN"
    )


def test_the_disruption_budget_covers_the_brokers_only(docs: list[Doc], brokers: Doc) -> None:
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["maxUnavailable"] == 1
    selector = budget["spec"]["selector"]["matchLabels"].items()
    for workload in (d for d in docs if d["kind"] in ("StatefulSet", "Deployment")):
        selected = selector <= workload["spec"]["template"]["metadata"]["labels"].items()
        assert selected == (workload is brokers), workload["metadata"]["name"]


def test_services_select_pods_on_named_ports(docs: list[Doc]) -> None:
    templates = [
        (d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("StatefulSet", "Deployment")
    ]
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"].items()
        matched = [spec for labels, spec in templates if selector <= labels.items()]
        assert matched, service["metadata"]["name"]
        ports = {
            p["name"] for spec in matched for c in spec["containers"] for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, (service["metadata"]["name"], port)
    metrics = one(docs, "Service", "rookery")["spec"]["ports"]
    assert {"name": "prometheus", "port": 15692, "targetPort": "prometheus"} in metrics


def test_secret_references_exist(docs: list[Doc]) -> None:
    for key, spec in pod_specs(docs).items():
        for container in containers(spec):
            for entry in container.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref is None:
                    continue
                data = one(docs, "Secret", ref["name"])["data"]
                assert ref["key"] in data or ref.get("optional"), (key, entry["name"])


def test_every_container_is_bounded_and_unprivileged(docs: list[Doc]) -> None:
    for key, spec in pod_specs(docs).items():
        pod = spec.get("securityContext", {})
        for container in containers(spec):
            where = f"{key} {container['name']}"
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), where
            own = container.get("securityContext", {})
            merged = {**pod, **own}
            assert merged.get("runAsNonRoot") is True, where
            # a numeric user: the kubelet cannot check runAsNonRoot on a named USER
            assert merged.get("runAsUser", 0) > 0, where
            assert own.get("allowPrivilegeEscalation") is False, where
            assert own.get("capabilities", {}).get("drop") == ["ALL"], where
            assert own.get("readOnlyRootFilesystem") is True, where
        assert spec.get("enableServiceLinks") is False, key


def test_one_image_for_brokers_and_console(docs: list[Doc]) -> None:
    images = {
        c["image"]
        for key, spec in pod_specs(docs).items()
        if key != "Deployment/redis"
        for c in containers(spec)
    }
    assert images == {"rookery:latest"}
