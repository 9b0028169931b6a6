"""Flow 10: `%gpu attach` in IPython inside a notebook pod, through the agents' Service.

The pod runs an image with Debian's IPython and the project (tests/k8s/notebook_image.py),
starts with `NVIDIA_VISIBLE_DEVICES=none` and no GPU, and is configured as
docs/notebooks.md says a platform configures it: its ServiceAccount bound to
hotmount-user in its namespace, the agent's CA from a ConfigMap at
/var/run/secrets/hotmount.io/. Nothing else: the magic finds the token, the namespace,
its own pod name and the Service by itself. There is no cluster DNS on this node: the
pod maps the Service's name to its ClusterIP with `hostAliases`, so TLS still checks
the name the certificate carries.
"""

from __future__ import annotations

import pytest

from tests.k8s import flows
from tests.k8s.flows import ABSENT, GRANTED, NAMESPACE, RELEASE
from tests.k8s.node.cluster import Node
from tests.k8s.notebook_image import REFERENCE, build_notebook_image


def ipython(node: Node, pod: str, *lines: str) -> str:
    """Run magics in IPython in the pod, as cells of a notebook; its output."""
    code = "\n".join(lines)
    result = node.kubectl(
        "exec", pod, "--", "python3", "-m", "IPython", "--quick", "--no-banner",
        "--colors=NoColor", "-c", code, timeout=180,
    )  # fmt: skip
    return result.stdout + result.stderr


def test_gpu_attach_in_a_notebook_pod_mounts_with_the_pods_own_token(
    node: Node, hotmount: flows.Release, tmp_path_factory: pytest.TempPathFactory
) -> None:
    image = node.image  # type: ignore[attr-defined]
    node.import_image(build_notebook_image(image.archive, tmp_path_factory.mktemp("notebook")))
    account, ca = flows.new_name("notebook"), flows.new_name("hotmount-ca")
    node.kubectl("create", "serviceaccount", account, "-n", "default")
    node.kubectl(
        "create", "rolebinding", account, "-n", "default", f"--clusterrole={flows.USER_ROLE}",
        f"--serviceaccount=default:{account}",
    )  # fmt: skip
    node.kubectl(
        "create", "configmap", ca, "-n", "default", f"--from-literal=ca.crt={hotmount.ca_bundle()}"
    )
    me = flows.new_name("jupyter")
    manifest = flows.pod_manifest(
        me, image=REFERENCE, serviceAccountName=account,
        hostAliases=[{"ip": hotmount.service_ip(), "hostnames": [f"{RELEASE}.{NAMESPACE}.svc"]}],
        volumes=[{"name": "hotmount-ca", "configMap": {"name": ca}}],
    )  # fmt: skip
    container = manifest["spec"]["containers"][0]
    container["command"] = ["sleep", "infinity"]
    container["volumeMounts"] = [
        {"name": "hotmount-ca", "mountPath": "/var/run/secrets/hotmount.io", "readOnly": True}
    ]
    try:
        with flows.running_pod(node, manifest):
            assert flows.device_state(node, me) == ABSENT

            said = ipython(node, me, "%load_ext cli.notebook", "%gpu attach 0 --idle 1h")

            assert f"attached GPU 0 ({flows.NVML_GPUS[0].uuid}) to default/{me} (main)" in said
            assert "given back after 1h unused" in said and "Traceback" not in said
            assert flows.device_state(node, me) == GRANTED

            said = ipython(node, me, "%load_ext cli.notebook", "%gpu status", "%gpu detach")

            assert f"GPU 0 ({flows.NVML_GPUS[0].uuid}) in main:" in said, said
            assert f"detached {flows.NVML_GPUS[0].uuid}" in said, said
            assert flows.device_state(node, me) == ABSENT
    finally:
        node.kubectl("delete", "configmap", ca, "-n", "default", check=False)
        node.kubectl("delete", "rolebinding,serviceaccount", account, "-n", "default", check=False)
