"""Flow 6: the direct bearer path from inside a pod, through the agents' Service.

A pod's ServiceAccount (bound to hotmount-user in its namespace) presents its own
token to `https://gpu-hotmount.gpu-hotmount.svc` and mounts a GPU into its own
pod; the same token is refused (403) for a pod in a namespace it has no rights in.
There is no cluster DNS on this node: the pod maps the Service's name to its
ClusterIP with `hostAliases`, so TLS still checks the name the certificate carries.
"""

from __future__ import annotations

import json

from tests.k8s import flows
from tests.k8s.flows import GRANTED, NAMESPACE, RELEASE
from tests.k8s.node.cluster import Node

CLIENT = """\
import json, ssl, sys, urllib.error, urllib.request
namespace, pod, ca = sys.argv[1], sys.argv[2], sys.argv[3]
token = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read().strip()
context = ssl.create_default_context(cadata=ca)
request = urllib.request.Request(
    f"https://{SERVICE}/v1/namespaces/{namespace}/pods/{pod}/devices",
    data=json.dumps({"devices": ["0"]}).encode(), method="POST",
    headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
)
try:
    with urllib.request.urlopen(request, context=context, timeout=60) as reply:
        print(json.dumps({"code": reply.status, "body": json.load(reply)}))
except urllib.error.HTTPError as error:
    print(json.dumps({"code": error.code, "body": json.load(error)}))
""".replace("{SERVICE}", f"{RELEASE}.{NAMESPACE}.svc")


def test_a_pod_mounts_into_itself_with_its_token_and_is_refused_elsewhere(
    node: Node, hotmount: flows.Release
) -> None:
    account = flows.new_name("gpu-client")
    node.kubectl("create", "serviceaccount", account, "-n", "default")
    node.kubectl(
        "create", "rolebinding", account, "-n", "default", f"--clusterrole={flows.USER_ROLE}",
        f"--serviceaccount=default:{account}",
    )  # fmt: skip
    node.kubectl("create", "namespace", "elsewhere", check=False)
    image = node.image  # type: ignore[attr-defined]
    me, victim = flows.new_name("client"), flows.new_name("victim")
    manifest = flows.pod_manifest(
        me, image=f"{image.repository}:{image.tag}", serviceAccountName=account,
        hostAliases=[{"ip": hotmount.service_ip(), "hostnames": [f"{RELEASE}.{NAMESPACE}.svc"]}],
    )  # fmt: skip
    manifest["spec"]["containers"][0]["command"] = ["sleep", "infinity"]
    try:
        with (
            flows.running_pod(node, manifest),
            flows.running_pod(node, flows.pod_manifest(victim, "elsewhere")),
        ):

            def call(namespace: str, pod: str) -> dict:
                result = node.kubectl(
                    "exec", me, "--", "python3", "-c", CLIENT, namespace, pod,
                    hotmount.ca_bundle(),
                )  # fmt: skip
                return json.loads(result.stdout)

            refused = call("elsewhere", victim)
            assert refused["code"] == 403, refused
            assert refused["body"]["reason"] == "Forbidden", refused
            assert flows.device_state(node, victim, namespace="elsewhere") == flows.ABSENT

            mounted = call("default", me)
            assert mounted["code"] == 200, mounted
            assert flows.device_state(node, me) == GRANTED
            flows.nvcli_ok(node, "alice", "unmount", "--name", me, "--all")
    finally:
        node.kubectl("delete", "namespace", "elsewhere", "--wait=false", check=False)
        node.kubectl("delete", "rolebinding,serviceaccount", account, "-n", "default", check=False)
