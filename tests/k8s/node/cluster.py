"""A real single-node Kubernetes on this machine, started and torn down by the tests.

Two stacks, chosen by HOTMOUNT_K8S_VERSION (`stack_version()`): 1.37 (the default) is
Kubernetes v1.37.2, etcd 3.6 and containerd 2 with its own runc, all built from the Go
modules under this directory by `build-go.sh`; 1.20 is Kubernetes 1.20.2 built from
Debian's source with Debian's etcd 3.4, containerd 1.6 and runc.

etcd, kube-apiserver (RBAC, the Node authorizer, aggregation with a front proxy,
ServiceAccount tokens that TokenReview accepts, static tokens for people),
kube-controller-manager, kube-scheduler, kube-proxy (iptables), and a kubelet
(cgroupfs driver) on its own containerd with the CRI plugin, runc behind a
wrapper that clamps oom_score_adj (this VM refuses negative values), and a CNI
bridge. The node IP is one end of a veth pair (the kubelet refuses loopback).
Images come from OCI archives written here (`images.py`); nothing is pulled.

What is shared with the machine, and so claimed and given back whole:
`/var/lib/kubelet` (the agent's chart mounts its pod-resources directory from
there, as on any node), the kubelet's cgroups under `/hotmount-k8s` (kept apart
from the `/kubepods` paths the kernel tests' containerd makes), the veth pair
and the bridge, kube-proxy's and the bridge plugin's iptables rules, and the
network namespaces containerd makes for pods. `Node.stop()` removes all of it,
also after a failed start.

    node = Node(workdir, users={"alice": ()}).start()
    node.kubectl("get", "nodes")
    node.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes.pki import CertificateAuthority
from tests.k8s.node import images

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-kubernetes.sh"
GO_BUILD_SCRIPT = HERE / "build-go.sh"
DRA_DRIVER_BUILD_SCRIPT = HERE / "build-dra-driver.sh"
VERSION_ENV = "HOTMOUNT_K8S_VERSION"
VERSIONS = ("1.37", "1.20")  # the first is the default
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
NODE_NAME = "hotmount-node"
NODE_IP = "10.251.0.1"
PEER_IP = "10.251.0.2"
VETH = ("hmk8s0", "hmk8s1")
BRIDGE = "hmk8sbr0"
POD_CIDR = "10.252.0.0/24"
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CGROUP_ROOT = "hotmount-k8s"
CGROUPS = Path("/sys/fs/cgroup")
KUBELET_DIR = Path("/var/lib/kubelet")
APISERVER_PORT = 6443
ETCD_PORTS = (22379, 22380)
PAUSE_IMAGE = "hotmount.test/pause:1"
BUSYBOX_IMAGE = "hotmount.test/busybox:1"
SYSTEM_TOOLS = ("kubectl", "iptables", "ip", "busybox")
# 1.20 runs Debian's etcd, containerd and runc; 1.37 builds its own (go, cgo for runc's seccomp)
STACK_TOOLS = {"1.20": ("etcd", "containerd", "ctr", "runc"), "1.37": ("go", "gcc", "pkg-config")}
CNI_BIN = Path("/usr/lib/cni")

# oom_score_adj below 0 is refused here; the kubelet asks -998 for every sandbox.
RUNC_WRAPPER = """\
#!/usr/bin/python3
# runc, with process.oomScoreAdj clamped to 0 in the bundle (this VM refuses negatives).
import json, os, sys
args = sys.argv[1:]
if "create" in args or "run" in args:
    bundle = args[args.index("--bundle") + 1] if "--bundle" in args else "."
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    process = spec.get("process") or {}
    if process.get("oomScoreAdj", 0) < 0:
        process["oomScoreAdj"] = 0
        with open(path, "w") as f:
            json.dump(spec, f)
os.execv(%(runc)r, [%(runc)r, *args])
"""


def missing_requirements() -> str | None:
    """Why the node cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (a kubelet, containerd, cgroups, veth, iptables)"
    tools = (*SYSTEM_TOOLS, *STACK_TOOLS[stack_version()])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if not (CNI_BIN / "bridge").exists():
        missing.append("containernetworking-plugins")
    if missing:
        return f"needs {', '.join(missing)} (bash scripts/setup.sh installs them as root)"
    return None


@dataclass(frozen=True)
class Stack:
    """Which binaries the node runs: the Kubernetes minor version says which flags they take."""

    minor: int
    kubernetes: Path  # .../kubernetes-<release>/bin
    etcd: str
    containerd: str
    ctr: str
    runc: str
    kubectl: str = "kubectl"  # the host's for 1.20; the stack's own, same release, for 1.37
    # prepended to containerd's PATH: it starts the containerd-shim-runc-v2 it finds there
    shim_dir: Path | None = None

    @property
    def release(self) -> str:
        """The Kubernetes release the binaries report, as `kubectl version` shows it."""
        return "v" + self.kubernetes.parent.name.removeprefix("kubernetes-")

    @property
    def containerd_release(self) -> str | None:
        """containerd's version where this tier built it, else None (Debian's)."""
        name = Path(self.containerd).parent.parent.name
        return name.removeprefix("containerd-") if name.startswith("containerd-") else None

    @property
    def own_dirs(self) -> tuple[Path, ...]:
        """Directories only this tier runs binaries from (leftover processes are found by
        them): never Debian's etcd or containerd, which other tests may be running."""
        if self.shim_dir is None:
            return (self.kubernetes,)
        return (self.kubernetes, Path(self.etcd).parent, self.shim_dir)


def stack_version() -> str:
    """The Kubernetes minor version the tier runs: HOTMOUNT_K8S_VERSION, 1.37 by default."""
    version = os.environ.get(VERSION_ENV, "").strip() or VERSIONS[0]
    if version not in VERSIONS:
        raise ValueError(f"{VERSION_ENV}={version!r}: one of {', '.join(VERSIONS)}")
    return version


def _build(script: Path) -> str:
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=False, timeout=3600
    )
    if result.returncode != 0:
        raise RuntimeError(f"{script.name} failed:\n{result.stderr[-6000:]}")
    return result.stdout


def build_kubernetes() -> Path:
    """The cached Kubernetes 1.20.2 binaries (built from Debian's source once, ~6-10 min)."""
    return Path(_build(BUILD_SCRIPT).strip().splitlines()[-1])


def build_stack(version: str | None = None) -> Stack:
    """The binaries of the chosen stack, built once and cached (see build-go.sh for 1.37)."""
    version = version or stack_version()
    if version == "1.20":
        return Stack(
            minor=20, kubernetes=build_kubernetes(), etcd="etcd", containerd="containerd",
            ctr="ctr", runc=shutil.which("runc") or "runc",
        )  # fmt: skip
    dirs = dict(line.split("=", 1) for line in _build(GO_BUILD_SCRIPT).splitlines() if "=" in line)
    kubernetes, containerd = Path(dirs["kubernetes"]), Path(dirs["containerd"])
    return Stack(
        minor=int(version.split(".")[1]), kubernetes=kubernetes,
        etcd=str(Path(dirs["etcd"]) / "etcd"), containerd=str(containerd / "containerd"),
        ctr=str(containerd / "ctr"), runc=str(containerd / "runc"),
        kubectl=str(kubernetes / "kubectl"), shim_dir=containerd,
    )  # fmt: skip


def build_dra_driver() -> Path:
    """The DRA example driver's kubelet plugin, built once and cached (build-dra-driver.sh)."""
    output = _build(DRA_DRIVER_BUILD_SCRIPT)
    dirs = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    return Path(dirs["dra-driver"]) / "dra-example-kubeletplugin"


def run(*command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)}: {result.stderr.strip() or result.stdout}")
    return result


def kubeconfig(
    path: Path, server: str, ca: Path, user: str, token: str, namespace: str = "default"
) -> Path:
    """A kubeconfig with one context: `user` by bearer token, as a person would have it."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "hotmount", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": user, "context": {"cluster": "hotmount", "user": user, "namespace": namespace}}
        ],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class Node:
    """The cluster's processes and what they claimed on the machine; `stop()` undoes all."""

    def __init__(
        self,
        workdir: Path,
        stack: Stack,
        users: Mapping[str, Sequence[str]] = {},
    ) -> None:
        self.workdir = workdir
        self.stack = stack
        self.bin_dir = stack.kubernetes
        self.people = dict(users)
        self.server = f"https://{NODE_IP}:{APISERVER_PORT}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._undo: list[Callable[[], object]] = []
        self.tokens: dict[str, str] = {}
        self.kubeconfigs: dict[str, Path] = {}
        self.containerd_socket = workdir / "containerd" / "containerd.sock"

    # ---- public ------------------------------------------------------------------

    def start(self) -> Node:
        try:
            self._claim_machine()
            self._write_pki()
            self._start_etcd()
            self._start_apiserver()
            self._start_containerd()
            self._start_kubelet()
            self._start_control_loops()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Everything, in reverse, each step on its own so one failure does not stop the rest."""
        with contextlib.suppress(Exception):
            self._delete_pods()
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as error:  # teardown goes on; say what was left
                print(f"k8s node teardown: {error}", file=sys.stderr)

    def kubectl(
        self, *args: str, user: str = "admin", check: bool = True, timeout: float = 120,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        command = [self.stack.kubectl, "--kubeconfig", str(self.kubeconfigs[user]), *args]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)}: {result.stderr.strip()}")
        return result

    def service_account_ready(self, namespace: str) -> bool:
        """Whether pods can be made in `namespace`: before 1.24 the tokens controller has to
        mint the default ServiceAccount's token Secret; since, tokens are projected per pod
        and the ServiceAccount itself is enough."""
        if self.stack.minor < 24:
            found = self.kubectl("get", "secrets", "-n", namespace, "-o", "name", check=False)
            return "default-token" in found.stdout
        found = self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False)
        return found.returncode == 0

    def apply(self, manifest: object, user: str = "admin") -> None:
        documents = manifest if isinstance(manifest, list) else [manifest]
        self.kubectl("apply", "-f", "-", user=user, stdin=yaml.safe_dump_all(documents))

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run(
            self.stack.ctr, "--address", str(self.containerd_socket), "-n", "k8s.io", *args,
            timeout=timeout,
        )  # fmt: skip

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive), timeout=600)

    def start_process(self, name: str, command: Sequence[str]) -> None:
        """A node-level process of a test's (a DRA driver's kubelet plugin), logged beside
        the node's own, watched by every wait, and ended by `stop()` if not before."""
        self._spawn(name, command)

    def stop_process(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            _end(process)

    def log_tail(self, name: str, size: int = 4000) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    # ---- start -------------------------------------------------------------------

    def _on_stop(self, undo: Callable[[], object]) -> None:
        self._undo.append(undo)

    def _claim_machine(self) -> None:
        if run("ss", "-Hltn", "sport = :10250", check=False).stdout.strip():
            raise RuntimeError("port 10250 is taken: another kubelet runs on this machine")
        _clear_leftovers(self.stack.own_dirs)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        # The veth pair: the node IP on one end, since the kubelet refuses loopback.
        run("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
        self._on_stop(lambda: run("ip", "link", "del", VETH[0], check=False))
        run("ip", "addr", "add", f"{NODE_IP}/30", "dev", VETH[0])
        run("ip", "addr", "add", f"{PEER_IP}/30", "dev", VETH[1])
        for link in VETH:
            run("ip", "link", "set", link, "up")
        self._on_stop(lambda: run("ip", "link", "del", BRIDGE, check=False))
        # The kubelet's chains (KUBE-FIREWALL, KUBE-MARK-DROP, ...) outlive it; kube-proxy's
        # --cleanup (below) leaves them, and the bridge plugin's CNI-* are left by a crash.
        self._on_stop(_remove_iptables_chains)
        forward = Path("/proc/sys/net/ipv4/ip_forward")
        before = forward.read_text()
        forward.write_text("1")
        self._on_stop(lambda: forward.write_text(before))
        # Pods get network namespaces under /run/netns; only the new ones are ours.
        netns_before = set(_listdir(Path("/run/netns")))
        self._on_stop(lambda: _remove_netns(set(_listdir(Path("/run/netns"))) - netns_before))
        # The kubelet's own directory, as on every node (the chart mounts from it).
        if KUBELET_DIR.exists() and any(KUBELET_DIR.iterdir()):
            raise RuntimeError(f"{KUBELET_DIR} is in use: is a kubelet running here?")
        KUBELET_DIR.mkdir(parents=True, exist_ok=True)
        self._on_stop(lambda: _unmount_under(KUBELET_DIR, remove=True))
        for hierarchy in _cgroup_hierarchies():
            (hierarchy / CGROUP_ROOT).mkdir(exist_ok=True)
        self._on_stop(_remove_cgroups)
        created_run_dir = not Path("/run/gpu-hotmount").exists()
        if created_run_dir:  # the chart's hostPath for the agent's socket and ledger
            self._on_stop(lambda: shutil.rmtree("/run/gpu-hotmount", ignore_errors=True))

    def _write_pki(self) -> None:
        pki = self.workdir / "pki"
        self.ca = CertificateAuthority(pki, "kubernetes-ca")
        self.front_proxy_ca = CertificateAuthority(pki, "front-proxy-ca")
        self.apiserver_cert = self.ca.issue_server(
            "kube-apiserver",
            hosts=[
                NODE_IP, KUBERNETES_SERVICE_IP, "127.0.0.1", "localhost", "kubernetes",
                "kubernetes.default", "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )  # fmt: skip
        self.kubelet_cert = self.ca.issue_server(NODE_NAME, hosts=[NODE_IP, NODE_NAME])
        self.kubelet_client = self.ca.issue_client(
            "kube-apiserver-kubelet-client", groups=["system:masters"]
        )
        self.front_proxy_client = self.front_proxy_ca.issue_client("front-proxy-client")
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = pki / "sa.key"
        self.sa_pub = pki / "sa.pub"
        self.sa_key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        self.sa_pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        identities: dict[str, tuple[str, Sequence[str]]] = {
            "admin": ("admin", ["system:masters"]),
            "node": (f"system:node:{NODE_NAME}", ["system:nodes"]),
            "controller-manager": ("system:kube-controller-manager", []),
            "scheduler": ("system:kube-scheduler", []),
            "proxy": ("system:kube-proxy", []),
            **{name: (name, groups) for name, groups in self.people.items()},
        }
        lines = []
        for index, (short, (user, groups)) in enumerate(identities.items()):
            token = os.urandom(16).hex()
            self.tokens[short] = token
            lines.append(f'{token},{user},uid-{index},"{",".join(groups)}"\n')
            self.kubeconfigs[short] = kubeconfig(
                pki / f"{short}.kubeconfig", self.server, self.ca.cert_path, user, token
            )
        self.token_file = pki / "tokens.csv"
        self.token_file.write_text("".join(lines))
        self.token_file.chmod(0o600)

    def _spawn(
        self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None
    ) -> None:
        log = (self.workdir / "logs" / f"{name}.log").open("wb")
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.processes[name] = process
        self._on_stop(lambda: _end(process))

    def _binary(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _start_etcd(self) -> None:
        # On tmpfs: etcd's fsyncs then cost nothing, and nothing must outlive the node.
        data = Path(f"/dev/shm/hotmount-k8s-etcd-{os.getpid()}")
        shutil.rmtree(data, ignore_errors=True)
        self._on_stop(lambda: shutil.rmtree(data, ignore_errors=True))
        client, peer = (f"http://127.0.0.1:{port}" for port in ETCD_PORTS)
        self._spawn("etcd", [
            self.stack.etcd, "--name", "node", "--data-dir", str(data),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"node={peer}",
        ])  # fmt: skip
        self.etcd_url = client

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        self._spawn("kube-apiserver", [
            self._binary("kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--advertise-address={NODE_IP}", f"--secure-port={APISERVER_PORT}",
            *(["--insecure-port=0"] if self.stack.minor < 24 else []),
            "--allow-privileged=true",
            f"--tls-cert-file={self.apiserver_cert.cert}",
            f"--tls-private-key-file={self.apiserver_cert.key}",
            f"--client-ca-file={self.ca.cert_path}",
            f"--token-auth-file={self.token_file}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca.cert_path}",
            "--kubelet-preferred-address-types=InternalIP",
            # aggregation: the front proxy presents this client certificate to the agents
            f"--requestheader-client-ca-file={self.front_proxy_ca.cert_path}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client.cert}",
            f"--proxy-client-key-file={self.front_proxy_client.key}",
            "--enable-aggregator-routing=true",
            f"--cert-dir={pki}",
        ])  # fmt: skip
        self._wait("kube-apiserver", lambda: self.kubectl(
            "get", "--raw", "/readyz", check=False, timeout=10).returncode == 0, 120)  # fmt: skip

    def _start_containerd(self) -> None:
        root = self.workdir / "containerd"
        root.mkdir(parents=True, exist_ok=True)
        wrapper = root / "runc-wrapper"
        wrapper.write_text(RUNC_WRAPPER % {"runc": self.stack.runc})
        wrapper.chmod(0o755)
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-hotmount.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "hotmount-k8s",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": True,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "subnet": POD_CIDR,
                                "dataDir": str(self.workdir / "cni" / "ipam"),
                                "routes": [{"dst": "0.0.0.0/0"}],
                            },
                        },
                    ],
                }
            )
        )
        config = root / "config.toml"
        config.write_text(
            self._containerd_v3_config(root, wrapper, cni_conf)
            if self.stack.minor >= 36 else f"""\
version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]
[grpc]
  address = "{self.containerd_socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{wrapper}"
        Root = "{root / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""
        )  # fmt: skip
        # Last of all (after containerd has ended): its snapshots are the images, ~200 MB.
        self._on_stop(lambda: _unmount_under(root, remove=True))
        shim_path = {"PATH": f"{self.stack.shim_dir}:{os.environ.get('PATH', '')}"}
        self._spawn(
            "containerd", [self.stack.containerd, "--config", str(config)],
            env=shim_path if self.stack.shim_dir else None,
        )  # fmt: skip
        self._on_stop(lambda: _unmount_under(root, remove=False))
        self._on_stop(self._remove_containers)
        self._wait("containerd", lambda: self.containerd_socket.exists() and run(
            self.stack.ctr, "--address", str(self.containerd_socket), "version", check=False
        ).returncode == 0, 60)  # fmt: skip
        archives = self.workdir / "images"
        archives.mkdir(exist_ok=True)
        # The pause container only has to outlive its pod; busybox sleep does.
        for ref, command in ((PAUSE_IMAGE, ["sleep", "2147483647"]), (BUSYBOX_IMAGE, ["sh"])):
            name = ref.replace("/", "_").replace(":", "_")
            self.import_image(images.write_busybox_image(archives / f"{name}.tar", ref, command))

    def _containerd_v3_config(self, root: Path, wrapper: Path, cni_conf: Path) -> str:
        """containerd 2's config (version 3): the CRI plugin split into images and runtime,
        CDI on with the usual spec directories, NRI off (its socket is machine-wide)."""
        runtime = 'plugins."io.containerd.cri.v1.runtime"'
        return f"""\
version = 3
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = {json.dumps(list(CDI_DIRS))}
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{wrapper}"
  Root = "{root / "runc"}"
  SystemdCgroup = false
[{runtime}.cni]
  bin_dirs = ["{CNI_BIN}"]
  conf_dir = "{cni_conf}"
"""

    def _remove_containers(self) -> None:
        """Whatever the kubelet left: tasks killed and deleted, then the containers."""
        address = [self.stack.ctr, "--address", str(self.containerd_socket), "-n", "k8s.io"]
        listing = run(*address, "task", "ls", check=False, timeout=30).stdout.splitlines()[1:]
        for line in listing:
            task = line.split()[0]
            run(*address, "task", "kill", "-s", "SIGKILL", task, check=False, timeout=30)
        for line in listing:
            run(*address, "task", "delete", "--force", line.split()[0], check=False, timeout=30)
        for container in run(*address, "containers", "ls", "-q", check=False).stdout.split():
            run(*address, "containers", "delete", container, check=False, timeout=30)

    def _start_kubelet(self) -> None:
        config = self.workdir / "kubelet.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "cgroupDriver": "cgroupfs",
                    "cgroupRoot": f"/{CGROUP_ROOT}",
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": True},
                        "x509": {"clientCAFile": str(self.ca.cert_path)},
                    },
                    "authorization": {"mode": "Webhook"},
                    "tlsCertFile": str(self.kubelet_cert.cert),
                    "tlsPrivateKeyFile": str(self.kubelet_cert.key),
                    "readOnlyPort": 0,
                    "healthzPort": 0,
                    "clusterDomain": "cluster.local",
                    "failSwapOn": False,
                    "resolvConf": "",
                    # The disk is shared with everything else here: never evict, never GC images.
                    "evictionHard": {
                        "memory.available": "1Mi",
                        "nodefs.available": "0%",
                        "imagefs.available": "0%",
                    },
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "serializeImagePulls": False,
                    **self._kubelet_config_since_1_20(),
                }
            )
        )
        endpoint = f"unix://{self.containerd_socket}"
        self._spawn("kubelet", [
            self._binary("kubelet"), f"--config={config}",
            f"--kubeconfig={self.kubeconfigs['node']}",
            *(["--container-runtime=remote", f"--container-runtime-endpoint={endpoint}"]
              if self.stack.minor < 27 else []),
            f"--node-ip={NODE_IP}", f"--hostname-override={NODE_NAME}",
            "--node-labels=nvidia.com/gpu.present=true",
            "--v=1",
        ])  # fmt: skip

    def _kubelet_config_since_1_20(self) -> dict[str, object]:
        """What a current kubelet wants in its config file rather than in flags."""
        if self.stack.minor < 27:
            return {}
        return {
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            # This host is hybrid (v1 controllers): 1.35+ refuses cgroup v1 without this.
            "failCgroupV1": False,
        }

    def _start_control_loops(self) -> None:
        self._spawn("kube-controller-manager", [
            self._binary("kube-controller-manager"),
            f"--kubeconfig={self.kubeconfigs['controller-manager']}",
            f"--service-account-private-key-file={self.sa_key}",
            f"--root-ca-file={self.ca.cert_path}",
            "--use-service-account-credentials=true",
            "--leader-elect=false", *self._no_serving_ports(),
            # cloud-node-lifecycle lives in the cloud-controller-manager now; naming it fails
            "--controllers=*,-csrsigning,-csrapproving,-nodeipam"
            + (",-cloud-node-lifecycle" if self.stack.minor < 24 else ""),
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            self._binary("kube-scheduler"),
            f"--kubeconfig={self.kubeconfigs['scheduler']}",
            "--leader-elect=false", *self._no_serving_ports(),
        ])  # fmt: skip
        self._spawn("kube-proxy", [
            self._binary("kube-proxy"),
            f"--kubeconfig={self.kubeconfigs['proxy']}",
            f"--hostname-override={NODE_NAME}", "--proxy-mode=iptables",
            # pod -> Service -> pod on one bridge: masquerade so replies come back via the host
            "--masquerade-all=true", f"--cluster-cidr={POD_CIDR}",
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
        ])  # fmt: skip
        self._on_stop(lambda: run(self._binary("kube-proxy"), "--cleanup", check=False))

    def _no_serving_ports(self) -> list[str]:
        """No health/metrics ports (--port went in 1.24; --secure-port=0 still turns HTTPS off)."""
        return ["--port=0", "--secure-port=0"] if self.stack.minor < 24 else ["--secure-port=0"]

    def _wait_ready(self) -> None:
        self._wait("node Ready", lambda: self.kubectl(
            "wait", "--for=condition=Ready", f"node/{NODE_NAME}", "--timeout=5s",
            check=False, timeout=30,
        ).returncode == 0, 180)  # fmt: skip
        self._wait("default ServiceAccount", lambda: self.service_account_ready("default"), 120)

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited ({process.returncode}) while waiting for {what}:\n"
                        f"{self.log_tail(name)}"
                    )
            with contextlib.suppress(subprocess.TimeoutExpired):
                if ready():
                    return
            time.sleep(0.5)
        logs = "\n".join(f"--- {name}\n{self.log_tail(name, 2000)}" for name in self.processes)
        raise RuntimeError(f"{what}: not ready in {timeout}s\n{logs}")

    # ---- stop --------------------------------------------------------------------

    def _delete_pods(self) -> None:
        """Pods deleted through the kubelet, so the CNI plugin takes their addresses back."""
        if "kubelet" not in self.processes or self.processes["kubelet"].poll() is not None:
            return
        self.kubectl("delete", "daemonsets,deployments,pods", "--all", "--all-namespaces",
                     "--wait=true", "--timeout=60s", check=False, timeout=90)  # fmt: skip


def _clear_leftovers(own_dirs: Iterable[Path]) -> None:
    """What an earlier run killed before its teardown left behind (CI runs again on the
    same machine): its processes, the kubelet's directory, cgroups, links and rules.
    Called only when no kubelet listens, so nothing here belongs to a live node."""
    markers = (*(f"{d}/" for d in own_dirs), "/dev/shm/hotmount-k8s-etcd-", "/k8s-node")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if any(marker in command for marker in markers):
                os.kill(int(entry.name), signal.SIGKILL)
    _remove_cgroups()
    _unmount_under(KUBELET_DIR, remove=True)
    for link in (VETH[0], BRIDGE):
        run("ip", "link", "del", link, check=False)
    _remove_iptables_chains()
    for etcd_dir in Path("/dev/shm").glob("hotmount-k8s-etcd-*"):
        shutil.rmtree(etcd_dir, ignore_errors=True)


def _listdir(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.is_dir() else []


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, SIGKILL after 15 s."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(root):
            points.append(point)
    return points


def _unmount_under(root: Path, *, remove: bool) -> None:
    for point in sorted(_mounts_under(root), key=len, reverse=True):
        run("umount", "-l", point, check=False)
    if remove:
        shutil.rmtree(root, ignore_errors=True)


def _remove_netns(names: Iterable[str]) -> None:
    for name in names:
        path = Path("/run/netns") / name
        run("umount", "-l", str(path), check=False)
        path.unlink(missing_ok=True)


def _remove_iptables_chains(prefixes: tuple[str, ...] = ("KUBE-", "CNI-")) -> None:
    """Every rule that jumps to a KUBE-*/CNI-* chain, then the chains themselves."""
    for table in ("filter", "nat", "mangle"):
        rules = run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
        chains = [
            r.split()[1] for r in rules if r.startswith("-N ") and r.split()[1].startswith(prefixes)
        ]
        for rule in rules:
            words = shlex.split(rule)
            if (
                words[0] == "-A"
                and "-j" in words
                and words[words.index("-j") + 1].startswith(prefixes)
            ):
                run("iptables", "-t", table, "-D", *words[1:], check=False)
        for chain in chains:
            run("iptables", "-t", table, "-F", chain, check=False)
        for chain in chains:
            run("iptables", "-t", table, "-X", chain, check=False)


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted hierarchy the kubelet makes cgroups in (v1 controllers and cgroup2)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype in ("cgroup", "cgroup2") and fields[4].startswith(str(CGROUPS)):
            found.append(Path(fields[4]))
    return found


def _remove_cgroups() -> None:
    """The kubelet's tree under /hotmount-k8s, deepest first, after killing what is left in it."""
    for hierarchy in _cgroup_hierarchies():
        top = hierarchy / CGROUP_ROOT
        if not top.is_dir():
            continue
        for directory, _, _ in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
            procs = Path(directory) / "cgroup.procs"
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            for _ in range(50):
                try:
                    os.rmdir(directory)
                    break
                except OSError:
                    time.sleep(0.1)
