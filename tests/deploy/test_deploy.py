"""The deployment files, checked offline with the real tools (see scripts/check-deploy).

Three kinds of test:
- every check of scripts/check-deploy passes on this checkout;
- every check fails on a deliberately broken copy of one file (so a green check means something);
- the rendered manifests and compose models keep the properties the design relies on:
  secure pods, name + instance selectors, probes, drain-aware grace periods, GPU requests, the
  KEDA formula, Redis reachable only from the API and workers, required compose variables.
"""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-deploy"
DEPLOY_FILES = ("docker", ".dockerignore", "compose.yaml", "compose.cpu.yaml", "helm")
WORKLOADS = ("Deployment", "StatefulSet")


def _load_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("check_deploy", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up while building
    loader.exec_module(module)
    return module


cd = _load_script()


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Each scenario's manifests, rendered and strictly validated once per module."""
    return {
        scenario: cd.validate_manifests(cd.helm_template(ROOT, scenario), scenario)
        for scenario in cd.SCENARIOS
    }


def render(*flags: str, scenario: str = "default") -> list[dict[str, Any]]:
    return cd.validate_manifests(cd.helm_template(ROOT, scenario, flags), scenario)


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str) -> dict[str, Any]:
    found = [d for n, d in objects(docs, kind).items() if n.endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.fixture
def broken(tmp_path: Path) -> Callable[[str, str, str], Path]:
    """Copy the deployment files into tmp_path with one text replaced in one file.

    The replaced text must be present, so a test cannot quietly stop breaking anything when
    the file it breaks changes.
    """

    def make(relpath: str, old: str, new: str) -> Path:
        for name in DEPLOY_FILES:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, tmp_path / name)
            else:
                shutil.copy2(source, tmp_path / name)
        target = tmp_path / relpath
        text = target.read_text()
        assert old in text, f"{relpath} no longer contains {old!r}: update this test"
        target.write_text(text.replace(old, new, 1))
        return tmp_path

    return make


# --- the checks pass here ---------------------------------------------------------------


@pytest.mark.parametrize("check", cd.CHECKS, ids=lambda c: c.name)
def test_check_passes_on_this_checkout(check: Any) -> None:
    check.run(ROOT)


def test_helm_comes_from_the_pip_wheel() -> None:
    binary = cd.helm()
    assert binary.is_relative_to(cd.CACHE_DIR)
    out = cd.run([binary, "version", "--short"], cwd=ROOT, env=cd.helm_env())
    assert out.startswith("v4."), out


def test_cli_lists_runs_and_fails(broken: Callable[[str, str, str], Path]) -> None:
    listing = _cli("--list")
    assert listing.returncode == 0
    assert [line.split()[0] for line in listing.stdout.splitlines()] == [c.name for c in cd.CHECKS]
    assert _cli("hadolint").returncode == 0
    root = broken("docker/api.Dockerfile", "FROM ${PYTHON_IMAGE} AS runtime", "FROM python:latest")
    failed = _cli("--root", str(root), "hadolint")
    assert failed.returncode == 1
    assert "FAIL hadolint" in failed.stderr and "DL3007" in failed.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


# --- and fail on broken copies ----------------------------------------------------------

BROKEN_CASES = [
    pytest.param(
        "hadolint",
        "docker/api.Dockerfile",
        "FROM ${PYTHON_IMAGE} AS runtime",
        "FROM python:latest AS runtime",
        "DL3007",
        id="dockerfile-latest-base",
    ),
    pytest.param(
        "hadolint",
        "docker/worker.Dockerfile",
        'pip install --no-cache-dir "./[${ENGINE_EXTRA},client]"',
        "pip install torch",
        "DL3013",
        id="dockerfile-unpinned-pip",
    ),
    pytest.param(
        "compose",
        "compose.yaml",
        "condition: service_healthy",
        "condition: service_happy",
        "condition value must be one of",
        id="compose-bad-condition",
    ),
    pytest.param(
        "compose",
        "compose.cpu.yaml",
        'command: ["worker", "--demo"]',
        "command: {demo: 1}",
        "command",
        id="compose-cpu-bad-command",
    ),
    pytest.param(
        "compose-schema",
        "compose.yaml",
        "    healthcheck:\n",
        "    healthchek:\n",
        "healthchek",
        id="compose-schema-unknown-key",
    ),
    pytest.param(
        "helm-lint",
        "helm/templates/api-service.yaml",
        "{{ .Values.api.service.type }}",
        "{{ .Values.api.service.type }",
        "api-service.yaml",
        id="chart-template-syntax",
    ),
    pytest.param(
        "helm-lint",
        "helm/values.yaml",
        "  replicaCount: 2\n",
        "  replicaCount: -2\n",
        "replicaCount",
        id="chart-values-against-schema",
    ),
    pytest.param(
        "helm-template",
        "helm/templates/api-deployment.yaml",
        "revisionHistoryLimit: 5",
        "revisionHistoryLimits: 5",
        "revisionHistoryLimits",
        id="manifest-unknown-field",
    ),
    pytest.param(
        "helm-template",
        "helm/templates/api-service.yaml",
        "protocol: TCP",
        "protocol: 6",
        "did not validate",
        id="manifest-wrong-type",
    ),
    pytest.param(
        "helm-template",
        "helm/templates/worker-scaledobject.yaml",
        "  minReplicaCount:",
        "  minReplicas:",
        "spec.minReplicas",
        id="scaledobject-unknown-field",
    ),
    pytest.param(
        "helm-template",
        "helm/templates/worker-scaledobject.yaml",
        "pollingInterval: {{ .Values.worker.keda.pollingInterval }}",
        "pollingInterval: often",
        "pollingInterval",
        id="scaledobject-wrong-type",
    ),
    pytest.param(
        "helm-notes",
        "helm/templates/NOTES.txt",
        "port-forward service/",
        "get service/",
        "port-forward",
        id="notes-without-port-forward",
    ),
]


@pytest.mark.parametrize(("check", "relpath", "old", "new", "says"), BROKEN_CASES)
def test_check_fails_on_broken_copy(
    broken: Callable[[str, str, str], Path],
    check: str,
    relpath: str,
    old: str,
    new: str,
    says: str,
) -> None:
    root = broken(relpath, old, new)
    run = {c.name: c.run for c in cd.CHECKS}[check]
    with pytest.raises(cd.CheckFailed) as failure:
        run(root)
    assert says in str(failure.value)


def test_schema_errors_are_not_caught_by_helm_lint_alone(
    broken: Callable[[str, str, str], Path],
) -> None:
    """A manifest helm renders happily is still wrong: that is what kubernetes-validate adds."""
    root = broken(
        "helm/templates/api-deployment.yaml", "revisionHistoryLimit: 5", "revisionHistoryLimits: 5"
    )
    cd.check_helm_lint(root)
    with pytest.raises(cd.CheckFailed, match="revisionHistoryLimits"):
        cd.check_helm_template(root)


# --- Helm: what the manifests promise ---------------------------------------------------


def test_scenarios_render_the_expected_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {s: sorted({d["kind"] for d in docs}) for s, docs in rendered.items()}
    common = {"ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"}
    assert common | {"HorizontalPodAutoscaler", "NetworkPolicy", "Secret", "StatefulSet"} == set(
        kinds["default"]
    )
    assert {"ScaledObject", "TriggerAuthentication", "StatefulSet", "NetworkPolicy"} <= set(
        kinds["keda-bundled-redis"]
    )
    external = set(kinds["external-redis"])
    assert {"ScaledObject", "TriggerAuthentication"} <= external
    assert not external & {"StatefulSet", "NetworkPolicy", "HorizontalPodAutoscaler"}
    # Keys and Redis come from existing Secrets; the chart makes only the owner-id secret.
    assert set(objects(rendered["external-redis"], "Secret")) == {"tokenrelay-owner-id"}


@pytest.mark.parametrize("scenario", list(cd.SCENARIOS))
def test_pods_are_locked_down(rendered: dict[str, list[dict[str, Any]]], scenario: str) -> None:
    for workload in (d for d in rendered[scenario] if d["kind"] in WORKLOADS):
        spec = pod_spec(workload)
        name = workload["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            image = container["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
            assert container["imagePullPolicy"] == "IfNotPresent", name


@pytest.mark.parametrize("scenario", list(cd.SCENARIOS))
def test_selectors_are_name_and_instance_only(
    rendered: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    docs = rendered[scenario]
    selectors = []
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance"}
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        selectors.append(tuple(sorted(selector.items())))
    assert len(selectors) == len(set(selectors)), "two workloads share a selector"
    api = one(docs, "Deployment", "-api")
    assert (
        one(docs, "Service", "-api")["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    )
    for pdb in objects(docs, "PodDisruptionBudget").values():
        assert set(pdb["spec"]["selector"]["matchLabels"]) == {
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
        }


def test_api_probes_service_hpa_and_drain(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    api = one(docs, "Deployment", "-api")
    container = pod_spec(api)["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["args"][:5] == ["api", "--host", "0.0.0.0", "--port", "8000"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    # preStop pause + uvicorn's 30 s drain fit inside the grace period.
    assert pod_spec(api)["terminationGracePeriodSeconds"] >= 5 + 30
    assert "replicas" not in api["spec"], "the HPA owns the replica count"
    hpa = one(docs, "HorizontalPodAutoscaler", "-api")
    assert hpa["spec"]["scaleTargetRef"]["name"] == api["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "cpu" in container["resources"]["requests"], "CPU utilisation needs a CPU request"
    pdb = one(docs, "PodDisruptionBudget", "-api")
    assert pdb["spec"]["minAvailable"] == 1


def test_probes_can_be_switched_off_and_overridden() -> None:
    docs = render(
        "--set", "api.livenessProbe.enabled=false", "--set", "api.readinessProbe.periodSeconds=17"
    )
    container = pod_spec(one(docs, "Deployment", "-api"))["containers"][0]
    assert "livenessProbe" not in container
    assert container["readinessProbe"]["periodSeconds"] == 17


def test_worker_requests_a_gpu_and_drains(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    worker = one(docs, "Deployment", "-worker")
    spec = pod_spec(worker)
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["args"] == ["worker"]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # No HTTP port, so no probes: dead workers are found by lease expiry in Redis.
    assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(container)
    config = one(docs, "ConfigMap", "tokenrelay")["data"]
    assert config["TOKENRELAY_WORKER_DRAIN_S"] == "60"
    assert spec["terminationGracePeriodSeconds"] == 60 + 30
    assert worker["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", "/var/cache/tokenrelay", "/dev/shm"} <= mounts
    assert config["TOKENRELAY_CACHE_DIR"] == "/var/cache/tokenrelay"
    assert config["HF_HOME"].startswith("/var/cache/tokenrelay/")


def test_worker_grace_period_follows_the_drain_setting() -> None:
    docs = render(
        "--set",
        "worker.drainSeconds=300",
        "--set",
        "worker.nodeSelector.gpu=h100",
        "--set",
        "worker.gpu.count=2",
    )
    spec = pod_spec(one(docs, "Deployment", "-worker"))
    assert spec["terminationGracePeriodSeconds"] == 330
    assert one(docs, "ConfigMap", "tokenrelay")["data"]["TOKENRELAY_WORKER_DRAIN_S"] == "300"
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_secrets_stay_out_of_the_configmap(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for scenario, docs in rendered.items():
        data = one(docs, "ConfigMap", "tokenrelay")["data"]
        assert not {"TOKENRELAY_REDIS_URL", "TOKENRELAY_API_KEYS"} & set(data), scenario
        for name in ("-api", "-worker"):
            env = env_of(pod_spec(one(docs, "Deployment", name))["containers"][0])
            url = env["TOKENRELAY_REDIS_URL"]
            assert "secretKeyRef" in url.get("valueFrom", {}) or "$(REDIS_PASSWORD)" in url["value"]


def test_webhook_settings_and_secret_reach_the_api(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    default = rendered["default"]
    assert "TOKENRELAY_WEBHOOK_ALLOWED_HOSTS" not in one(default, "ConfigMap", "tokenrelay")["data"]
    api_env = env_of(pod_spec(one(default, "Deployment", "-api"))["containers"][0])
    assert "TOKENRELAY_WEBHOOK_SECRET" not in api_env  # webhooks off by default
    docs = rendered["keda-bundled-redis"]
    config = one(docs, "ConfigMap", "tokenrelay")["data"]
    assert config["TOKENRELAY_WEBHOOK_ALLOWED_HOSTS"] == "hooks.example.com,.svc.cluster.local"
    assert config["TOKENRELAY_WEBHOOK_ALLOW_PRIVATE"] == "true"
    assert "TOKENRELAY_WEBHOOK_SECRET" not in config
    env = env_of(pod_spec(one(docs, "Deployment", "-api"))["containers"][0])
    ref = env["TOKENRELAY_WEBHOOK_SECRET"]["valueFrom"]["secretKeyRef"]
    secret = objects(docs, "Secret")[ref["name"]]
    stored = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert stored == "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert "api-keys" in secret["data"], "API keys and the webhook secret share the Secret"
    external = rendered["external-redis"]
    env = env_of(pod_spec(one(external, "Deployment", "-api"))["containers"][0])
    assert env["TOKENRELAY_WEBHOOK_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "tokenrelay-webhooks",
        "key": "signing-secret",
    }
    worker_env = env_of(pod_spec(one(external, "Deployment", "-worker"))["containers"][0])
    assert "TOKENRELAY_WEBHOOK_SECRET" not in worker_env, "only API pods send webhooks"


def test_api_keys_come_from_a_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default_env = env_of(pod_spec(one(rendered["default"], "Deployment", "-api"))["containers"][0])
    assert "TOKENRELAY_API_KEYS" not in default_env  # no keys configured: no auth, NOTES warn
    docs = rendered["keda-bundled-redis"]
    env = env_of(pod_spec(one(docs, "Deployment", "-api"))["containers"][0])
    ref = env["TOKENRELAY_API_KEYS"]["valueFrom"]["secretKeyRef"]
    secret = objects(docs, "Secret")[ref["name"]]
    assert ref["key"] in secret["data"]
    external = env_of(
        pod_spec(one(rendered["external-redis"], "Deployment", "-api"))["containers"][0]
    )
    assert external["TOKENRELAY_API_KEYS"]["valueFrom"]["secretKeyRef"] == {
        "name": "tokenrelay-api-keys",
        "key": "keys",
    }


def test_owner_id_secret_is_generated_and_reaches_the_api_with_keys(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    default_env = env_of(pod_spec(one(rendered["default"], "Deployment", "-api"))["containers"][0])
    assert "TOKENRELAY_OWNER_ID_SECRET" not in default_env  # no keys, no owners
    for scenario in ("keda-bundled-redis", "external-redis"):
        docs = rendered[scenario]
        env = env_of(pod_spec(one(docs, "Deployment", "-api"))["containers"][0])
        ref = env["TOKENRELAY_OWNER_ID_SECRET"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "tokenrelay-owner-id", "key": "owner-id-secret"}, scenario
        secret = objects(docs, "Secret")[ref["name"]]
        assert len(base64.b64decode(secret["data"][ref["key"]])) == 48, scenario


def test_bundled_redis_is_pinned_private_and_authenticated(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["default"]
    redis = one(docs, "StatefulSet", "-redis")
    container = pod_spec(redis)["containers"][0]
    assert container["image"] == "docker.io/library/redis:7.4.2-alpine"
    assert container["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert "noeviction" in container["args"]
    policy = one(docs, "NetworkPolicy", "-redis")
    assert policy["spec"]["podSelector"]["matchLabels"] == redis["spec"]["selector"]["matchLabels"]
    [rule] = policy["spec"]["ingress"]
    [peer] = rule["from"]
    names = peer["podSelector"]["matchExpressions"][0]["values"]
    assert names == ["tokenrelay-api", "tokenrelay-worker"]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": cd.RELEASE}
    for component in ("-api", "-worker"):
        labels = one(docs, "Deployment", component)["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] in names


def test_keda_scales_on_queued_plus_running_jobs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["keda-bundled-redis"]
    scaled = one(docs, "ScaledObject", "-worker")
    worker = one(docs, "Deployment", "-worker")
    assert "replicas" not in worker["spec"], "KEDA owns the worker count"
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (0, 8)
    triggers = {t["name"]: t for t in scaled["spec"]["triggers"]}
    for priority in ("high", "normal", "low"):
        queue = triggers[f"queued-{priority}"]["metadata"]["listName"]
        assert queue == f"rq:queue:tokenrelay:Qwen/Qwen2-0.5B-Instruct:{priority}"
    assert triggers["inflight"]["metadata"]["listName"] == "tokenrelay:leases"
    for trigger in triggers.values():
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listLength"] == "4"  # = config.workerConcurrency
        assert trigger["metadata"]["address"] == f"tokenrelay-redis.{cd.NAMESPACE}.svc:6379"
    auth = one(docs, "TriggerAuthentication", "-worker-redis")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "tokenrelay-redis", "key": "redis-password"}
    ]
    # The KEDA operator must reach Redis through the NetworkPolicy.
    peers = one(docs, "NetworkPolicy", "-redis")["spec"]["ingress"][0]["from"]
    assert any("namespaceSelector" in peer for peer in peers)


def test_external_redis_comes_from_an_existing_secret(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["external-redis"]
    for name in ("-api", "-worker"):
        env = env_of(pod_spec(one(docs, "Deployment", name))["containers"][0])
        assert env["TOKENRELAY_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "my-redis",
            "key": "url",
        }
    trigger = one(docs, "ScaledObject", "-worker")["spec"]["triggers"][0]["metadata"]
    assert trigger["address"] == "redis.example.internal:6380"
    assert (trigger["databaseIndex"], trigger["enableTLS"]) == ("2", "true")
    worker = pod_spec(one(docs, "Deployment", "-worker"))["containers"][0]
    assert worker["args"] == ["worker", "--demo"]
    assert "nvidia.com/gpu" not in worker["resources"].get("limits", {})
    data = one(docs, "ConfigMap", "tokenrelay")["data"]
    assert data["TOKENRELAY_SERVED_MODEL_NAME"] == "tokenrelay-demo"


def test_sentinel_redis_reaches_every_process(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["sentinel-redis"]
    data = one(docs, "ConfigMap", "tokenrelay")["data"]
    assert data["TOKENRELAY_REDIS_SENTINELS"] == "tokenrelay-redis-headless:26379"
    assert data["TOKENRELAY_REDIS_SENTINEL_MASTER"] == "mymaster"
    assert data["TOKENRELAY_REDIS_MIN_REPLICAS"] == "1"
    for name in ("-api", "-worker"):
        env = env_of(pod_spec(one(docs, "Deployment", name))["containers"][0])
        assert env["TOKENRELAY_REDIS_SENTINEL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "tokenrelay-redis",
            "key": "sentinel-password",
        }
        assert env["TOKENRELAY_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    # No Redis of the chart's own: Redis and its passwords come from the existing Secret; the
    # chart makes only the owner-id secret.
    assert "StatefulSet" not in {d["kind"] for d in docs}
    assert set(objects(docs, "Secret")) == {"tokenrelay-owner-id"}
    assert "TOKENRELAY_REDIS_SENTINELS" not in one(rendered["default"], "ConfigMap", "")["data"]


def test_names_fit_kubernetes_limits_for_the_longest_release_name() -> None:
    release = "r" * 53  # Helm's own limit on release names
    docs = cd.validate_manifests(
        cd.helm_template(ROOT, "keda-bundled-redis", release=release), "long-release"
    )
    for doc in docs:
        limit = 52 if doc["kind"] == "StatefulSet" else 63  # + the pods' revision-hash label
        assert len(doc["metadata"]["name"]) <= limit, doc["metadata"]["name"]
    assert len({(d["kind"], d["metadata"]["name"]) for d in docs}) == len(docs)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--set", "redis.bundled.enabled=false"), "existingSecret"),
        (("--set", "api.image.tag=latest"), "/api/image/tag"),
        (("--set", "api.replicas=3"), "replicas"),
        (("--set", "config.defaultMaxTokens=9000"), "must be <= config.maxTokensLimit"),
        (
            (
                "--set",
                "worker.keda.enabled=true,redis.bundled.enabled=false",
                "--set",
                "redis.external.existingSecret=r",
            ),
            "redis.external.address",
        ),
    ],
    ids=[
        "external-without-secret",
        "latest-tag",
        "typo-in-values",
        "bad-token-bounds",
        "keda-external-without-address",
    ],
)
def test_chart_refuses_bad_values(flags: tuple[str, ...], says: str) -> None:
    with pytest.raises(cd.CheckFailed) as failure:
        cd.helm_template(ROOT, "default", flags)
    assert says in str(failure.value)


@pytest.mark.parametrize("scenario", list(cd.SCENARIOS))
def test_notes_show_port_forward_and_curl(scenario: str) -> None:
    notes = cd.helm_notes(ROOT, scenario)
    assert "kubectl --namespace tokenrelay port-forward service/tokenrelay-api 8000:8000" in notes
    assert "-H 'content-type: application/json'" in notes
    demo = scenario in ("external-redis", "sentinel-redis")
    model = "tokenrelay-demo" if demo else "Qwen/Qwen2-0.5B-Instruct"
    assert f'"model":"{model}","messages":[{{"role":"user","content":"hi"}}]' in notes
    assert ("authorization: Bearer" in notes) == (scenario != "default")


# --- compose --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, dict[str, Any]]:
    return {
        variant: json.loads(cd.compose_config(ROOT, variant, quiet=False, fmt="json"))
        for variant in cd.COMPOSE_VARIANTS
    }


def test_compose_gpu_stack(compose: dict[str, dict[str, Any]]) -> None:
    services = compose["gpu"]["services"]
    redis = services["redis"]
    assert redis["image"] == "redis:7.4.2-alpine"
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    # Starting with redis-server lets the image's entrypoint drop root for its `redis` user.
    assert redis["command"][:2] == ["redis-server", "--requirepass"]
    assert "noeviction" in redis["command"]
    api, worker = services["api"], services["worker"]
    assert api["deploy"]["replicas"] == 2
    [device] = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    for service in (api, worker):
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
        assert service["environment"]["TOKENRELAY_REDIS_URL"].startswith("redis://:")
    assert api["build"]["dockerfile"] == "docker/api.Dockerfile"
    assert worker["build"]["dockerfile"] == "docker/worker.Dockerfile"
    assert worker["command"] == ["worker"]
    # Compose's stop grace period covers the worker's 60 s drain.
    assert worker["environment"]["TOKENRELAY_WORKER_DRAIN_S"] == "60"
    assert worker["stop_grace_period"] == "1m15s"


def test_compose_cpu_override_runs_the_demo_without_a_gpu(
    compose: dict[str, dict[str, Any]],
) -> None:
    services = compose["cpu"]["services"]
    worker = services["worker"]
    assert worker["command"] == ["worker", "--demo"]
    assert "devices" not in worker.get("deploy", {}).get("resources", {}).get("reservations", {})
    assert worker["environment"]["TOKENRELAY_DEVICE"] == "cpu"
    assert worker["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")
    for name in ("api", "worker"):
        assert services[name]["environment"]["TOKENRELAY_SERVED_MODEL_NAME"] == "tokenrelay-demo"


@pytest.mark.parametrize("missing", sorted(cd.COMPOSE_ENV))
def test_compose_requires_its_secrets(missing: str) -> None:
    env = {k: v for k, v in cd.compose_env().items() if k != missing}
    args = [cd.tool("docker-compose"), *cd._files_args(ROOT, ("compose.yaml",)), "config", "-q"]
    proc = subprocess.run(
        [str(a) for a in args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode != 0
    assert f"required variable {missing} is missing a value: set {missing}" in proc.stderr


def test_dockerignore_keeps_the_context_to_the_sources() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: ignore everything, then re-include the sources"
    assert {"!pyproject.toml", "!README.md", "!api/", "!worker/", "!shared/", "!cli/"} <= set(lines)


@pytest.mark.parametrize("name", ["api", "worker"])
def test_images_run_unprivileged_and_multi_stage(name: str) -> None:
    text = (ROOT / "docker" / f"{name}.Dockerfile").read_text()
    assert text.count("\nFROM ") >= 2
    assert "ARG PYTHON_IMAGE=python:3.11." in text
    assert "\nUSER ${UID}:${UID}\n" in text and "ARG UID=10001" in text
    assert 'ENTRYPOINT ["tokenrelay"]' in text
    assert f'CMD ["{name}"' in text
    # Its own side and the client commands (`tokenrelay top` inside a pod), never the other;
    # the worker's side is its engine's extra (`worker` by default, `vllm`, `vllm-cpu`).
    extra = "${ENGINE_EXTRA}" if name == "worker" else name
    assert f'"./[{extra},client]"' in text, "installs its own extra and the client's"
    if name == "worker":
        assert "ARG ENGINE_EXTRA=worker" in text
    other = "worker" if name == "api" else "api"
    assert f"[{other}" not in text and f",{other}" not in text
