"""Agent configuration: the environment (HOTMOUNT_*) and flags (agent/flags.py).

    hotmount-agent --listen 0.0.0.0:8443 --listen unix:/run/gpu-hotmount/agent.sock \
        --tls-cert /tls/tls.crt --tls-key /tls/tls.key --state-dir /run/gpu-hotmount/state

Every flag has an environment twin: `--reconcile-interval 5` is
`HOTMOUNT_RECONCILE_INTERVAL=5`; `NODE_NAME` (downward API) also sets the node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, IPvAnyNetwork, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent import flags, rdma_resources
from hotmount.api import DEFAULT_CDI_DIRS, DEFAULT_STATE_DIR
from hotmount.wire.durations import format_duration, parse_duration

DEFAULT_PODRESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
_SUBDOMAIN = r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"  # a DRA driver's or DeviceClass's name


class AgentSettings(BaseSettings):
    """Hot-mount GPUs into running containers: the per-node agent."""

    model_config = SettingsConfigDict(env_prefix="HOTMOUNT_", populate_by_name=True)

    listen: list[str] = Field(
        default=["127.0.0.1:8080"],
        description="HOST:PORT or unix:PATH to serve on",
        json_schema_extra={"metavar": "ADDRESS"},
    )
    kubernetes: bool = Field(
        default=True, description="serve pods of a cluster; --no-kubernetes: containers by ID"
    )
    token_file: Path | None = Field(
        default=None, description="standalone: file holding the bearer token callers present"
    )
    tls_cert: Path | None = Field(default=None, description="serve TLS with this certificate")
    tls_key: Path | None = Field(default=None, description="... and this key")
    anonymous: bool = Field(
        default=False, description="DEVELOPMENT ONLY: let unauthenticated callers do anything"
    )

    host_root: Path = Field(default=Path("/"), description="where the host's / is mounted")
    cdi_dir: list[str] = Field(default=list(DEFAULT_CDI_DIRS), description="CDI spec directory")
    sys_root: Path | None = Field(
        default=None,
        description="where /sys is read for RDMA devices and PCIe places (default: the host root)",
    )
    netdev_allow: list[str] = Field(
        default=[],
        description=(
            "network interfaces (names or globs, e.g. ens1f0v*) a mount may move into a pod; "
            "never the node's primary ones (default: none, the feature is off)"
        ),
        json_schema_extra={"metavar": "NAME"},
    )
    netdev_address_cidr: list[IPvAnyNetwork] = Field(
        default=[],
        description=(
            "where addresses a mount asks for on a moved interface may lie (a CIDR, e.g. "
            "10.10.0.0/24); never one the node holds (default: none, no addresses are set)"
        ),
        json_schema_extra={"metavar": "CIDR"},
    )
    driver_root: Path | None = Field(
        default=None,
        description=(
            "where the driver's files are when no CDI spec mounts them: the host's / or the "
            "GPU Operator's /run/nvidia/driver, as the host sees it (default: CDI specs only)"
        ),
        json_schema_extra={"metavar": "DIR"},
    )
    driver_host_root: Path | None = Field(
        default=None,
        description=(
            "where the host's / is mounted for the driver's files (the driver root and CDI "
            "hostPaths are resolved inside it); the chart mounts it at /host (default: "
            "--host-root)"
        ),
        json_schema_extra={"metavar": "DIR"},
    )
    inject_driver: Literal["auto", "always", "never"] = Field(
        default="auto",
        description=(
            "a mount that leaves withDriver out brings the driver's files: auto (when the "
            "container's linker finds no libcuda.so.1 and a CDI spec or --driver-root has "
            "them), always, or never (an off switch: a request's withDriver cannot turn it "
            "on; docs/driver.md)"
        ),
        json_schema_extra={"metavar": "MODE"},
    )
    state_dir: Path = Field(default=DEFAULT_STATE_DIR, description="the ledger's directory")
    use_nvml: bool = Field(default=True, description="enumerate GPUs with NVML when it loads")
    stop_grace: float = Field(default=10.0, ge=0, description="seconds between SIGTERM and SIGKILL")
    reconcile_interval: float = Field(default=5.0, gt=0, description="seconds between reconciles")
    reconcile_stall_intervals: float = Field(
        default=12.0,
        ge=2,
        description=(
            "/healthz fails once the reconcile loop has shown no progress (a finished "
            "pass, or a bounded child within one) for this many reconcile intervals, and "
            "at least three --fs-deadline (counted from the start until the first pass)"
        ),
    )
    fs_deadline: float = Field(
        default=20.0,
        gt=0,
        description=(
            "seconds a forked child doing work in a container's filesystem or mount "
            "namespace may run before it is killed and its call fails"
        ),
    )
    idle_timeout: str | None = Field(
        default=None,
        description=(
            "take a hot-mounted GPU back once no process has held it this long (30m, 1h30m) "
            "when neither the mount nor the pod's hotmount.io/idle-timeout names a timeout "
            "(default: off)"
        ),
        json_schema_extra={"metavar": "DURATION"},
    )
    # Issue 42: pods that ask for hotmount.io/gpu-on-demand (agent/ondemand/).
    on_demand_idle: float = Field(
        default=20.0,
        gt=0,
        le=3600,
        description=(
            "seconds an on-demand pod's GPU stays attached after its last cell ends before "
            "it is suspended, unless the pod's hotmount.io/gpu-on-demand-idle says"
        ),
    )
    on_demand_min_hold: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description=(
            "seconds an on-demand pod keeps a GPU at least before it is suspended for a "
            "waiting pod (its cells idle); a busy GPU is never taken"
        ),
    )
    on_demand_per_caller: int = Field(
        default=2, ge=1, le=64, description="places one caller may hold in the on-demand queue"
    )
    on_demand_queue_limit: int = Field(
        default=256, ge=1, le=4096, description="places the node's on-demand queue holds"
    )
    # Issue 20: what idle means, when neither the mount nor hotmount.io/idle-policy says.
    idle_policy: Literal["unheld", "unused", "suspend"] = Field(
        default="unheld",
        description=(
            "unheld: idle while no process holds the GPU open; unused: idle while NVML "
            "shows no SM or memory activity, even if held (its holders are stopped); "
            "suspend: idle as unused, but the GPUs are suspended (processes kept, their GPU "
            "memory in host memory) instead"
        ),
        json_schema_extra={"metavar": "POLICY"},
    )

    node_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("node_name", "node-name", "HOTMOUNT_NODE_NAME", "NODE_NAME"),
        description="this node (downward API: spec.nodeName)",
    )
    kubeconfig: Path | None = Field(default=None, description="default: in-cluster config")
    token_audiences: list[str] = Field(
        default=[],
        description="audiences a caller's token must carry (TokenReview); set, a caller's "
        "token is forwarded to other agents, else the agents assert the caller",
    )
    podresources_socket: Path = Field(
        default=DEFAULT_PODRESOURCES_SOCKET, description="the kubelet's PodResources socket"
    )
    gpu_resource: str = Field(default="nvidia.com/gpu", description="extended resource name")
    dra_driver: str = Field(
        default="gpu.nvidia.com",
        description="the DRA driver that publishes this node's GPUs (ResourceSlices' driver)",
        pattern=_SUBDOMAIN,
    )
    dra_gpu_class: str = Field(
        default="gpu.nvidia.com",
        description="the DeviceClass a pin's claim on a GPU asks for",
        pattern=_SUBDOMAIN,
    )
    dra_mig_class: str = Field(
        default="mig.nvidia.com",
        description="the DeviceClass a pin's claim on a MIG asks for",
        pattern=_SUBDOMAIN,
    )
    dra_uuid_attribute: str = Field(
        default="uuid",
        description="the DRA driver's device attribute holding the GPU's UUID",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,31}$",
    )
    rdma_resource: list[str] = Field(
        default=[],
        description=(
            "a device plugin resource whose IDs are RDMA NICs' PCI addresses (an SR-IOV "
            "network device plugin pool): an ID that names no RDMA device refuses every "
            "RDMA mount until it does (PCI addresses of any resource map without this)"
        ),
        json_schema_extra={"metavar": "RESOURCE"},
    )
    rdma_shared_resource: list[str] = Field(
        default=[],
        description=(
            "a k8s-rdma-shared-dev-plugin resource, RESOURCE or RESOURCE=DEV,... (DEV: "
            "rdma/mlx5_0, a PCI address or an interface): its HCAs (default: every RDMA "
            "device) are mounted only into pods the kubelet gave that resource"
        ),
        json_schema_extra={"metavar": "RESOURCE"},
    )
    holder_image: str = Field(
        default="registry.k8s.io/pause:3.9", description="image of the holder and pin pods"
    )
    holder_priority_class: str | None = Field(
        default=None,
        description="priority class of the holder and pin pods whose target's class is not "
        "one of --holder-priority-classes (default: none)",
    )
    holder_priority_classes: list[str] = Field(
        default=[],
        description="priority classes a holder or pin may take from its target pod, as the "
        "admission policy allows (default: none)",
        json_schema_extra={"metavar": "CLASS"},
    )
    blocker_priority_class: str | None = Field(
        default=None,
        description="priority class of the blockers, one of preemptionPolicy Never: a blocker "
        "then preempts no pod (the chart makes it; default: none, a blocker takes a class as "
        "a holder does)",
    )
    holder_runtime_class: str | None = Field(
        default=None, description="runtime class of the holder and pin pods (default: none)"
    )
    on_double_booking: Literal["take-back", "warn"] = Field(
        default="take-back",
        description=(
            "when the kubelet gives a hot-mounted GPU to another pod: take-back (a forced "
            "unmount, --stop-grace) or warn (Events and the metric only)"
        ),
    )
    holder_timeout: float = Field(default=60.0, gt=0, description="seconds to wait for a holder")
    holder_orphan_grace: float = Field(
        default=120.0,
        ge=0,
        description="seconds a holder pod must look orphaned before reconcile deletes it",
    )
    pod_tokens_own_pod_only: bool = Field(
        default=False,
        description="a token bound to a pod (a ServiceAccount token mounted in it) acts on "
        "that pod only, whatever the account's RBAC (notebooks sharing one account)",
    )
    refuse_unbound_service_account_tokens: bool = Field(
        default=False,
        description="refuse API calls from ServiceAccount tokens bound to no pod (legacy "
        "Secret tokens, TokenRequests without a pod): with --pod-tokens-own-pod-only, every "
        "account's call is then held to its own pod",
    )
    allow_asserted_force: bool = Field(
        default=False,
        description="let a user another agent asserts (a front-proxy caller forwarded from "
        "the node the API server reached) force and move network interfaces; off: only "
        "callers this agent authenticates itself may (root on one node holds the agents' "
        "token, and could assert anyone)",
    )
    max_token_reviews: int = Field(
        default=16,
        ge=1,
        description="TokenReviews in flight at once for tokens the agent does not know yet, "
        "on threads of their own; more such calls get 429 at once",
    )
    metrics_anonymous: bool = Field(
        default=False,
        description="serve /metrics to anyone who reaches the port (scrapers without "
        "tokens); off: a bearer token allowed `get` on the non-resource URL /metrics",
    )
    authz_cache_ttl: float = Field(default=10.0, ge=0, description="seconds a decision is cached")
    token_failure_ttl: float = Field(
        default=5.0,
        ge=0,
        description="seconds a refused bearer token stays refused without another TokenReview",
    )
    kube_timeout: float = Field(
        default=10.0, gt=0, description="seconds to wait for any one Kubernetes API call"
    )
    agent_timeout: float | None = Field(
        default=None,
        gt=0,
        description="seconds to wait for another agent's answer (default: holder timeout + 30)",
    )
    fanout_concurrency: int = Field(
        default=64, ge=1, le=1024, description="other agents asked at once for a list"
    )
    list_timeout: float = Field(
        default=2.0,
        gt=0,
        description="seconds to wait for another agent's part of a list (connect, TLS, "
        "answer; apart from --agent-timeout, which forwarded mounts wait)",
    )
    list_deadline: float = Field(
        default=10.0,
        gt=0,
        le=50,
        description="seconds a whole list may take; agents that have not answered by then "
        "are named as missing (well inside the API server's 60 s for an aggregated call)",
    )
    list_max_bytes: int = Field(
        default=1048576,
        ge=1024,
        description="largest answer read from another agent for a list (undecoded); a "
        "larger one is cut off and its node named as missing (BadAnswer)",
    )
    max_lists_per_caller: int = Field(
        default=4,
        ge=1,
        description="lists across the cluster one user may have fanning out from this "
        "agent at once; more get 429",
    )
    max_body_bytes: int = Field(
        default=65536, ge=1024, description="largest request body; larger ones get 413"
    )
    max_mutating: int = Field(
        default=8,
        ge=1,
        description="mounts, unmounts and moves at work at once; more wait in line",
    )
    mutating_wait: float = Field(
        default=10.0,
        ge=0,
        description="seconds a mount, unmount or move waits in line for a slot; then 429",
    )
    max_mutating_per_caller: int = Field(
        default=4,
        ge=1,
        description="mounts, unmounts and moves one user may have waiting or at work at "
        "once; more get 429 at once (one caller cannot fill the line)",
    )
    max_requests: int = Field(
        default=64,
        ge=1,
        description="API calls in the agent at once, waiting or at work (health and "
        "metrics apart); more get 429",
    )

    agent_namespace: str = Field(
        default="gpu-hotmount",
        validation_alias=AliasChoices(
            "agent_namespace", "agent-namespace", "HOTMOUNT_AGENT_NAMESPACE", "POD_NAMESPACE"
        ),
        description="the agents' namespace (downward API: metadata.namespace)",
    )
    agent_service_account: str = Field(
        default="gpu-hotmount", description="the agents' ServiceAccount (forwarded calls)"
    )
    agent_selector: str = Field(
        default="app.kubernetes.io/name=gpu-hotmount", description="label selector of the agents"
    )
    agent_port: int = Field(
        default=8443,
        description="the port other agents serve on",
        json_schema_extra={"metavar": "PORT"},
    )
    agent_service: str = Field(
        default="gpu-hotmount",
        description="the agents' Service: its DNS name is what their certificates carry",
    )
    agent_scheme: str = Field(default="https", description="how agents reach each other")
    agent_ca: Path | None = Field(
        default=None, description="CA that signs the other agents' serving certificates"
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")

    @field_validator("listen")
    @classmethod
    def _listen(cls, values: list[str]) -> list[str]:
        for value in values:
            if value.startswith("unix:"):
                if not value[5:].startswith("/"):
                    raise ValueError(f"{value}: unix: takes an absolute path")
                continue
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{value}: expected HOST:PORT or unix:PATH")
        return values

    @field_validator("rdma_resource")
    @classmethod
    def _rdma_resource(cls, values: list[str]) -> list[str]:
        return [rdma_resources.check_resource(v.strip()) for v in values]

    @field_validator("rdma_shared_resource")
    @classmethod
    def _rdma_shared_resource(cls, values: list[str]) -> list[str]:
        for value in values:
            rdma_resources.parse_shared(value)
        return values

    @field_validator("idle_timeout")
    @classmethod
    def _idle_timeout(cls, value: str | None) -> str | None:
        """Checked at start: a typo must stop the agent, not turn reclaim off silently."""
        if value is None or value.strip().lower() in ("", "off"):
            return None
        return format_duration(parse_duration(value))

    @field_validator("token_file")
    @classmethod
    def _token_file(cls, value: Path | None) -> Path | None:
        """An empty token file would make the empty token the password: refuse it."""
        if value is None:
            return value
        try:
            token = value.read_text().strip()
        except OSError as exc:
            raise ValueError(f"{value}: {exc.strerror}") from exc
        if not token:
            raise ValueError(f"{value} is empty: it must hold the bearer token callers present")
        return value

    @property
    def agent_server_name(self) -> str:
        """The name other agents' serving certificates are checked against (not the pod IP)."""
        return f"{self.agent_service}.{self.agent_namespace}.svc"

    @property
    def agent_user(self) -> str:
        """The identity other agents present when they forward a request."""
        return f"system:serviceaccount:{self.agent_namespace}:{self.agent_service_account}"


def load_settings(argv: list[str] | None = None) -> AgentSettings:
    """Settings from flags (when argv is given) over environment over defaults."""
    if argv is None:
        return AgentSettings()
    return AgentSettings(**flags.given(AgentSettings, argv, "hotmount-agent"))
