"""deploy/kubernetes/: the objects are valid Kubernetes objects and fit the agent.

The DaemonSet is checked against the agent's real settings class (agent.config): every
flag and HOTMOUNT_* variable it passes exists, the agent parses them, and the host paths
the engine reads are mounted where --host-root says they are.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path, PurePosixPath

import pytest
import yaml
from kubernetes import client

from agent.config import AgentSettings, load_settings
from hotmount.hostfs import HostRoot
from tests.deploy.support import (
    CA_PLACEHOLDER,
    CERT_MANAGER,
    DEPLOY,
    HARDENED,
    KUBE,
    Obj,
    agent_argv,
    agent_container,
    by_key,
    find,
    load_dir,
    load_file,
    model_name,
    round_trip,
)

ALL_FILES = sorted(KUBE.rglob("*.yaml"))
MAIN = load_dir(KUBE)
DAEMONSETS = {
    "privileged": find(MAIN, "DaemonSet"),
    "hardened": find(load_dir(HARDENED), "DaemonSet"),
}
NAMESPACE = find(MAIN, "Namespace")["metadata"]["name"]
SERVICE_ACCOUNT = find(MAIN, "ServiceAccount")
SERVICE = find(MAIN, "Service", "gpu-hotmount")
HARDENED_CAPABILITIES = {
    "SYS_ADMIN", "BPF", "NET_ADMIN", "MKNOD", "SYS_PTRACE", "SYS_CHROOT", "KILL", "DAC_OVERRIDE",
}  # fmt: skip


@pytest.fixture(scope="module")
def api():
    with client.ApiClient() as api:
        yield api


def all_objects() -> list[tuple[str, Obj]]:
    return [
        (f"{path.relative_to(KUBE)}:{obj['kind']}/{obj['metadata']['name']}", obj)
        for path in ALL_FILES
        for obj in load_file(path)
    ]


def test_there_are_manifests():
    names = {p.relative_to(KUBE).as_posix() for p in ALL_FILES}
    assert {"05-daemonset.yaml", "hardened/daemonset.yaml", "07-apiservice.yaml"} <= names


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(KUBE)))
def test_every_manifest_parses(path: Path):
    documents = load_file(path)
    assert documents, f"{path} holds no object"
    for doc in documents:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert doc["metadata"].get("name")
        assert doc["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "gpu-hotmount"


@pytest.mark.parametrize(("where", "obj"), all_objects(), ids=[w for w, _ in all_objects()])
def test_objects_deserialize_into_client_models_without_loss(api, where: str, obj: Obj):
    """The client's models accept each object, and serialize it back unchanged.

    Deserializing alone ignores unknown keys; the round trip catches them (a misspelled
    `hostPid` would vanish), and the models' validation catches wrong types and missing
    required fields. cert-manager's kinds have no model in the client: only their group
    is checked.
    """
    if obj["apiVersion"].startswith("cert-manager.io/"):
        assert model_name(obj) is None
        return
    assert round_trip(api, obj) == obj, f"{where}: a field was lost or changed"


def test_main_directory_has_no_duplicates_and_every_kind():
    table = by_key(MAIN)
    kinds = sorted({k[1] for k in table})
    expected = "APIService ClusterRole ClusterRoleBinding DaemonSet Namespace Role RoleBinding"
    policy = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert kinds == sorted(
        [*expected.split(), "NetworkPolicy", "PriorityClass", "Service", "ServiceAccount", *policy]
    )
    for obj in MAIN:
        if obj["kind"] in ("DaemonSet", "Service", "ServiceAccount"):
            assert obj["metadata"]["namespace"] == NAMESPACE


def test_ca_bundle_placeholder_fails_loudly_until_filled():
    text = (KUBE / "07-apiservice.yaml").read_text()
    unfilled = find(load_file(KUBE / "07-apiservice.yaml", ca_bundle=None), "APIService")
    assert unfilled["spec"]["caBundle"] == CA_PLACEHOLDER
    assert text.count(CA_PLACEHOLDER) == 2  # the value and the documented sed command
    with pytest.raises(binascii.Error):  # the API server rejects it: not base64
        base64.b64decode(CA_PLACEHOLDER, validate=True)


# --- the DaemonSet against the agent's settings -------------------------------------------


def flag_names(argv: list[str]) -> list[str]:
    return [word[2:].partition("=")[0] for word in argv if word.startswith("--")]


def settings_for(daemonset: Obj, monkeypatch: pytest.MonkeyPatch) -> AgentSettings:
    """What the agent makes of the DaemonSet: its args, and its env as the kubelet sets it."""
    import os

    for name in list(os.environ):
        if name.startswith("HOTMOUNT_") or name in ("NODE_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(name)
    downward = {"spec.nodeName": "gpu-node-1", "metadata.namespace": NAMESPACE}
    for entry in agent_container(daemonset).get("env", []):
        if "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
        else:
            monkeypatch.setenv(entry["name"], downward[entry["valueFrom"]["fieldRef"]["fieldPath"]])
    return load_settings(agent_argv(daemonset))


@pytest.mark.parametrize("variant", DAEMONSETS)
def test_every_flag_is_a_setting(variant: str):
    fields = AgentSettings.model_fields
    for flag in flag_names(agent_argv(DAEMONSETS[variant])):
        name = flag.replace("-", "_")
        if name.startswith("no_") and fields.get(name[3:]) and fields[name[3:]].annotation is bool:
            continue
        assert name in fields, f"--{flag} is not an agent setting (agent/config.py)"


@pytest.mark.parametrize("variant", DAEMONSETS)
def test_every_environment_variable_is_read_by_the_agent(variant: str):
    env = {e["name"]: e for e in agent_container(DAEMONSETS[variant])["env"]}
    for name in env:
        if name.startswith("HOTMOUNT_"):
            assert name[len("HOTMOUNT_") :].lower() in AgentSettings.model_fields, name
        else:
            assert name in ("NODE_NAME", "POD_NAMESPACE"), f"the agent does not read {name}"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


@pytest.mark.parametrize("variant", DAEMONSETS)
def test_the_agent_parses_the_daemonset(variant: str, monkeypatch: pytest.MonkeyPatch):
    daemonset = DAEMONSETS[variant]
    settings = settings_for(daemonset, monkeypatch)
    pod = daemonset["spec"]["template"]
    container = agent_container(daemonset)

    assert settings.kubernetes and not settings.anonymous
    assert settings.node_name == "gpu-node-1"
    assert settings.log_level == "INFO"
    # Peers: the agents' identity and how they find each other.
    assert settings.agent_namespace == NAMESPACE
    assert settings.agent_service_account == pod["spec"]["serviceAccountName"]
    assert settings.agent_service_account == SERVICE_ACCOUNT["metadata"]["name"]
    selector = dict(term.split("=", 1) for term in settings.agent_selector.split(","))
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert selector == SERVICE["spec"]["selector"]
    assert selector == daemonset["spec"]["selector"]["matchLabels"]
    # Serving: TLS on the port the peers, probes and the Service use; the unix socket.
    https = next(p for p in container["ports"] if p["name"] == "https")
    assert https["containerPort"] == settings.agent_port == 8443
    assert settings.agent_scheme == "https"
    assert f"0.0.0.0:{settings.agent_port}" in settings.listen
    assert "unix:/run/gpu-hotmount/agent.sock" in settings.listen
    assert SERVICE["spec"]["ports"][0]["targetPort"] == "https"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "https", "HTTPS")
    # TLS files come from the Secret volume.
    tls_mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    tls_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")
    assert tls_volume["secret"]["secretName"] == "gpu-hotmount-tls"
    for path in (settings.tls_cert, settings.tls_key, settings.agent_ca):
        assert path is not None and path.parent == Path(tls_mount["mountPath"])
    assert {settings.tls_cert.name, settings.tls_key.name, settings.agent_ca.name} == {
        "tls.crt", "tls.key", "ca.crt",
    }  # fmt: skip
    assert settings.gpu_resource == "nvidia.com/gpu"
    assert settings.reconcile_interval == 5


@pytest.mark.parametrize("variant", DAEMONSETS)
def test_mounts_cover_what_the_engine_reads(variant: str, monkeypatch: pytest.MonkeyPatch):
    daemonset = DAEMONSETS[variant]
    settings = settings_for(daemonset, monkeypatch)
    pod_spec = daemonset["spec"]["template"]["spec"]
    mounts = agent_container(daemonset)["volumeMounts"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    host = HostRoot(settings.host_root)

    # host root "/": the host's paths at the same paths, and /proc is the host's (hostPID).
    assert settings.host_root == Path("/")
    assert pod_spec["hostPID"] is True
    assert host.proc == Path("/proc")

    def mount_for(path: Path) -> tuple[dict, dict]:
        candidates = [
            m for m in mounts if PurePosixPath(path).is_relative_to(PurePosixPath(m["mountPath"]))
        ]
        assert candidates, f"{path} is not mounted"
        mount = max(candidates, key=lambda m: len(m["mountPath"]))
        return mount, volumes[mount["name"]]

    sockets = [Path(s[5:]).parent for s in settings.listen if s.startswith("unix:")]
    writable = [host.cgroup_mount, settings.state_dir, settings.podresources_socket.parent]
    readable = [host.path("/dev"), host.path("/sys/fs/bpf")]
    readable += [host.path(d) for d in settings.cdi_dir]
    for path in writable + readable + sockets:
        mount, volume = mount_for(path)
        assert "hostPath" in volume, f"{path} must come from the host"
        assert volume["hostPath"]["path"] == mount["mountPath"], "host root / maps paths 1:1"
        if path in writable or path in sockets:
            assert not mount.get("readOnly"), f"{path} must be writable"
    assert volumes[mount_for(settings.podresources_socket)[0]["name"]]["hostPath"]["type"] == (
        "Directory"
    )


@pytest.mark.parametrize("variant", DAEMONSETS)
def test_scheduling_and_host_access(variant: str):
    daemonset = DAEMONSETS[variant]
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t.get("key") == "nvidia.com/gpu" for t in spec["tolerations"])
    container = agent_container(daemonset)
    # Entering PID 1's cgroup namespace is what makes /proc/<pid>/cgroup host paths.
    assert container["command"][:2] == ["sh", "-c"]
    assert container["command"][3] == "hotmount-agent"  # $0: the args follow as "$@"
    assert "exec nsenter --cgroup=/proc/1/ns/cgroup -- hotmount-agent" in container["command"][2]
    assert container["securityContext"]["privileged"] is (variant == "privileged")


def test_hardened_differs_only_in_its_security_context():
    plain, hardened = (yaml.safe_load(yaml.safe_dump(DAEMONSETS[v])) for v in DAEMONSETS)
    context = agent_container(hardened).pop("securityContext")
    agent_container(plain).pop("securityContext")
    assert plain == hardened
    assert context["capabilities"]["drop"] == ["ALL"]
    assert set(context["capabilities"]["add"]) == HARDENED_CAPABILITIES
    assert context["privileged"] is False
    assert context["runAsUser"] == 0
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert context["seccompProfile"]["type"] in ("RuntimeDefault", "Unconfined", "Localhost")


def test_readme_explains_every_hardened_capability():
    readme = (DEPLOY / "README.md").read_text()
    section = readme[readme.index("## Hardened variant") :]
    for capability in HARDENED_CAPABILITIES:
        assert re.search(rf"`CAP_{capability}`", section), f"CAP_{capability} is not explained"


# --- RBAC ------------------------------------------------------------------------------------


def rules_allow(rules: list[dict], group: str, resource: str, verbs: set[str]) -> bool:
    granted: set[str] = set()
    for rule in rules:
        if group in rule.get("apiGroups", []) and resource in rule.get("resources", []):
            granted |= set(rule["verbs"])
    return verbs <= granted


def test_the_metrics_reader_may_get_metrics_and_nothing_else():
    """The agent asks a SAR for `get` on the non-resource URL /metrics: this role grants
    exactly that, and no resource."""
    reader = find(MAIN, "ClusterRole", "hotmount-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not any(k.startswith("rbac.authorization.k8s.io/aggregate-to")
                   for k in reader["metadata"]["labels"])  # fmt: skip


def test_the_local_service_keeps_pods_on_their_node_and_the_apiservice_off_it():
    """Pods' calls through gpu-hotmount-local reach their own node's agent; the APIService
    stays on the cluster-wide Service (the API server's node may run no agent)."""
    local = find(MAIN, "Service", "gpu-hotmount-local")
    assert local["spec"]["internalTrafficPolicy"] == "Local"
    assert local["spec"]["selector"] == SERVICE["spec"]["selector"]
    assert local["spec"]["ports"] == SERVICE["spec"]["ports"]
    assert "internalTrafficPolicy" not in SERVICE["spec"]
    assert find(MAIN, "APIService")["spec"]["service"]["name"] == SERVICE["metadata"]["name"]


def bound_to_agent(binding: Obj) -> bool:
    sa = SERVICE_ACCOUNT["metadata"]
    return {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]} in binding[
        "subjects"
    ]


def test_agent_cluster_role_and_bindings():
    role = find(MAIN, "ClusterRole", "gpu-hotmount-agent")
    assert rules_allow(role["rules"], "", "pods", {"get", "list", "watch", "create", "delete"})
    assert rules_allow(role["rules"], "", "events", {"create", "patch"})
    bindings = [o for o in MAIN if o["kind"] == "ClusterRoleBinding"]
    roles = {b["roleRef"]["name"] for b in bindings if bound_to_agent(b)}
    assert roles == {"gpu-hotmount-agent", "system:auth-delegator"}


def test_agent_reads_only_the_authentication_config_map():
    role = find(MAIN, "Role", "gpu-hotmount-authentication-reader")
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["extension-apiserver-authentication"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = find(MAIN, "RoleBinding", "gpu-hotmount-authentication-reader")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"],
    }  # fmt: skip
    assert bound_to_agent(binding)


def test_user_role_is_aggregated_to_edit():
    role = find(MAIN, "ClusterRole", "hotmount-user")
    assert role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    rules = role["rules"]
    assert rules_allow(
        rules, "hotmount.io", "gpumounts", {"create", "delete", "get", "list", "patch"}
    )
    assert rules_allow(rules, "hotmount.io", "nodedevices", {"get", "list"})
    assert rules_allow(rules, "hotmount.io", "reassignments", {"create"})
    for sub in ("suspend", "resume"):  # the API server's check of the subresource path
        assert rules_allow(rules, "hotmount.io", f"gpumounts/{sub}", {"create", "get"})
    assert not rules_allow(rules, "hotmount.io", "gpumounts", {"update"})
    assert not rules_allow(rules, "hotmount.io", "gpumounts", {"force"})


def test_force_is_granted_by_hotmount_admin_alone():
    """`force` overrides another tenant's claim: only hotmount-admin carries it, and it is
    aggregated into no built-in role (a namespace admin must not get it by default)."""
    admin = find(MAIN, "ClusterRole", "hotmount-admin")
    assert rules_allow(admin["rules"], "hotmount.io", "gpumounts", {"force", "create", "delete"})
    assert rules_allow(admin["rules"], "hotmount.io", "reassignments", {"create"})
    assert rules_allow(admin["rules"], "hotmount.io", "gpumounts/suspend", {"create"})
    assert not any(label.startswith("rbac.authorization.k8s.io/aggregate-to") for label in
                   admin["metadata"]["labels"])  # fmt: skip
    roles = [o for o in MAIN if o["kind"] in ("ClusterRole", "Role")]
    forcing = [r["metadata"]["name"] for r in roles if rules_allow(r.get("rules", []),
               "hotmount.io", "gpumounts", {"force"})]  # fmt: skip
    assert forcing == ["hotmount-admin"]


def test_viewer_lists_node_devices_only():
    viewer = find(MAIN, "ClusterRole", "hotmount-viewer")
    assert viewer["rules"] == [
        {"apiGroups": ["hotmount.io"], "resources": ["nodedevices"], "verbs": ["get", "list"]}
    ]


# --- the gateway: Service and APIService -------------------------------------------------------


@pytest.mark.parametrize("path", [KUBE / "07-apiservice.yaml", CERT_MANAGER / "apiservice.yaml"])
def test_api_service_points_at_the_gateway(path: Path):
    api_service = find(load_file(path), "APIService")
    spec = api_service["spec"]
    assert api_service["metadata"]["name"] == f"{spec['version']}.{spec['group']}"
    assert (spec["group"], spec["version"]) == ("hotmount.io", "v1alpha1")
    assert spec["service"] == {
        "name": SERVICE["metadata"]["name"],
        "namespace": SERVICE["metadata"]["namespace"],
        "port": SERVICE["spec"]["ports"][0]["port"],
    }
    assert not spec.get("insecureSkipTLSVerify")


def test_cert_manager_wiring():
    objects = load_file(CERT_MANAGER / "certificate.yaml")
    serving = find(objects, "Certificate", "gpu-hotmount")
    assert serving["spec"]["secretName"] == "gpu-hotmount-tls"
    service = f"{SERVICE['metadata']['name']}.{SERVICE['metadata']['namespace']}.svc"
    assert service in serving["spec"]["dnsNames"]
    issuer = find(objects, "Issuer", serving["spec"]["issuerRef"]["name"])
    ca = find(objects, "Certificate", issuer["spec"]["ca"]["secretName"])
    assert ca["spec"]["isCA"] is True
    api_service = find(load_file(CERT_MANAGER / "apiservice.yaml"), "APIService")
    injected = api_service["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert injected == f"{serving['metadata']['namespace']}/{serving['metadata']['name']}"
    assert "caBundle" not in api_service["spec"]
