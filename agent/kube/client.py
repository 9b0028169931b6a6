"""A narrow wrapper over the official client: exactly the calls the agent makes.

Raw payloads are read into small typed records here, so the rest of the agent
never touches `V1Pod` and friends, and tests can run the agent against a fake
API server speaking the real wire format.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agent.errors import ApiError, Forbidden, PodNotFound, QuotaExceeded, UpstreamError

log = logging.getLogger(__name__)

_RUNTIME_PREFIXES = ("containerd://", "cri-o://", "docker://")


@dataclass(frozen=True)
class ContainerInfo:
    name: str
    container_id: str | None  # without the runtime prefix
    running: bool


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node_name: str | None
    phase: str
    containers: list[ContainerInfo]
    labels: dict[str, str] = field(default_factory=dict)
    pod_ip: str | None = None
    unschedulable_message: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    priority_class_name: str | None = None

    def container(self, name: str | None) -> ContainerInfo | None:
        if name is None:
            return self.containers[0] if self.containers else None
        return next((c for c in self.containers if c.name == name), None)


@dataclass(frozen=True)
class HolderPod:
    """A holder pod as reconcile sees it: where it is, whom it holds for, where it runs."""

    namespace: str
    name: str
    labels: dict[str, str]
    node: str | None  # spec.nodeName, or the node it is pinned to while Pending


@dataclass(frozen=True)
class UserInfo:
    username: str
    groups: list[str]
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)


def _pod_info(pod: client.V1Pod) -> PodInfo:
    # The API server fills these in every pod it returns; the client's models type all optional.
    meta, pod_spec, pod_status = pod.metadata, pod.spec, pod.status
    assert meta is not None and pod_spec is not None and pod_status is not None
    assert meta.namespace is not None and meta.name is not None and meta.uid is not None
    statuses = {s.name: s for s in (pod_status.container_statuses or [])}
    containers = []
    for spec in pod_spec.containers:
        status = statuses.get(spec.name)
        raw_id = status.container_id if status else None
        for prefix in _RUNTIME_PREFIXES:
            if raw_id and raw_id.startswith(prefix):
                raw_id = raw_id[len(prefix) :]
        running = bool(status and status.state and status.state.running)
        containers.append(ContainerInfo(spec.name, raw_id, running))
    message = None
    for condition in pod_status.conditions or []:
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            message = condition.message
    ports = {
        p.name: p.container_port for c in pod_spec.containers for p in (c.ports or []) if p.name
    }
    return PodInfo(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        node_name=pod_spec.node_name,
        phase=pod_status.phase or "Unknown",
        containers=containers,
        labels=meta.labels or {},
        pod_ip=pod_status.pod_ip,
        unschedulable_message=message,
        ports=ports,
        annotations=meta.annotations or {},
        priority_class_name=pod_spec.priority_class_name,
    )


class TimedApiClient(client.ApiClient):
    """An ApiClient on which no call waits forever.

    Each call gets `timeout` unless it names its own, and one that gets no answer
    (timeout, refused or reset connection) raises ApiException with status 0, as
    the client itself does for TLS failures: every `except ApiException` in this
    module then covers it, including calls added later. Read timeouts are not
    retried (urllib3 would try a GET four times).
    """

    def __init__(self, configuration: client.Configuration, timeout: float) -> None:
        configuration.retries = urllib3.Retry(total=2, read=False)
        super().__init__(configuration)
        self.timeout = timeout

    def call_api(
        self,
        method: Any,
        url: Any,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        try:
            return super().call_api(
                method,
                url,
                header_params,
                body,
                post_params,
                _request_timeout=_request_timeout or self.timeout,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ApiException(status=0, reason=f"no answer from the API server: {exc}") from exc


class KubeClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.authn = client.AuthenticationV1Api(api_client)
        self.authz = client.AuthorizationV1Api(api_client)

    @classmethod
    def from_config(cls, kubeconfig: Path | None, timeout: float = 10.0) -> KubeClient:
        configuration = client.Configuration()
        if kubeconfig is not None:
            config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
        return cls(TimedApiClient(configuration, timeout))

    def close(self) -> None:
        self.api.close()

    def token(self) -> str | None:
        """This agent's own bearer token (for forwarding to other agents)."""
        auth = self.api.configuration.auth_settings().get("BearerToken")
        # A kubeconfig gives "Bearer <token>"; the in-cluster loader "bearer <token>".
        scheme, _, token = str((auth or {}).get("value") or "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return token.strip() or None

    # -- pods
    def get_pod(self, namespace: str, name: str) -> PodInfo:
        try:
            return _pod_info(self.core.read_namespaced_pod(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                raise PodNotFound(f"pod {namespace}/{name} not found") from exc
            raise _upstream(exc, f"reading pod {namespace}/{name}") from exc

    def find_pod(self, namespace: str, name: str) -> PodInfo | None:
        try:
            return self.get_pod(namespace, name)
        except PodNotFound:
            return None

    def create_pod(self, namespace: str, manifest: dict[str, Any]) -> PodInfo:
        try:
            # The client serializes a dict body as it is; its types name only the model.
            created = self.core.create_namespaced_pod(namespace, manifest)  # type: ignore[arg-type]
            return _pod_info(created)
        except ApiException as exc:
            raise api_error(exc, f"creating pod in {namespace}", namespace) from exc

    def create_holder(self, namespace: str, manifest: dict[str, Any]) -> tuple[str, str]:
        """`create_pod` for a pod of which only the name and UID are needed (a blocker or a
        pin, several to a mount): the answer is read as JSON, not into the client's
        models (a millisecond or more of CPU per pod, on the mount's path)."""
        try:
            response: Any = self.core.create_namespaced_pod(
                namespace,
                manifest,  # type: ignore[arg-type]
                _preload_content=False,
            )
            meta = json.loads(response.data).get("metadata") or {}
        except ApiException as exc:
            raise api_error(exc, f"creating pod in {namespace}", namespace) from exc
        except ValueError as exc:
            raise UpstreamError(f"creating pod in {namespace}: the answer is not JSON") from exc
        if not meta.get("name") or not meta.get("uid"):
            raise UpstreamError(f"creating pod in {namespace}: the answer names no pod")
        return str(meta["name"]), str(meta["uid"])

    def hand_over(self, namespace: str, name: str, labels: dict[str, str], owner: PodInfo) -> None:
        """Make pod `name` stand for `owner`: its labels and its one owner reference, in one
        patch (the admission policy checks that both agree)."""
        patch = hand_over_patch(labels, owner)
        try:
            # A JSON merge patch replaces the owner list; a strategic merge would add the
            # new owner beside the old, and the old one's deletion would take the pin along.
            self.core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            if exc.status == 404:
                raise PodNotFound(f"pod {namespace}/{name} not found") from exc
            raise _upstream(exc, f"patching pod {namespace}/{name}") from exc

    def node_allocatable(self, node: str, resource: str) -> int:
        """How many of `resource` the node offers the scheduler (0 when none)."""
        try:
            found = self.core.read_node(node)
        except ApiException as exc:
            raise _upstream(exc, f"reading node {node}") from exc
        value = ((found.status and found.status.allocatable) or {}).get(resource, "0")
        try:
            return int(value)
        except ValueError:
            return 0

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            # The deleted pod comes back; read, not made into the client's models.
            response: Any = self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0, _preload_content=False
            )
            response.read()
        except ApiException as exc:
            if exc.status != 404:
                raise _upstream(exc, f"deleting pod {namespace}/{name}") from exc

    def pods_on_node(self, namespace: str, selector: str, node: str) -> list[PodInfo]:
        try:
            pods = self.core.list_namespaced_pod(
                namespace, label_selector=selector, field_selector=f"spec.nodeName={node}"
            )
        except ApiException as exc:
            raise _upstream(exc, f"listing agents on {node}") from exc
        return [_pod_info(p) for p in pods.items]

    def holder_pods(self, selector: str) -> list[HolderPod]:
        """Pods matching `selector` in every namespace (holder pods are few)."""
        try:
            pods = self.core.list_pod_for_all_namespaces(label_selector=selector)
        except ApiException as exc:
            raise _upstream(exc, "listing holder pods") from exc
        return [_holder_pod(p) for p in pods.items]

    def agent_pods(self, namespace: str, selector: str) -> list[PodInfo]:
        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
        except ApiException as exc:
            raise _upstream(exc, "listing agents") from exc
        return [_pod_info(p) for p in pods.items]

    # -- events
    def event_on_pod(
        self, namespace: str, name: str, reason: str, message: str, warning: bool = False
    ) -> None:
        """`record_event` on a pod named by namespace and name; best effort too: a pod
        that is gone, or cannot be read, gets none."""
        try:
            pod = self.find_pod(namespace, name)
        except ApiError:
            return
        if pod is not None:
            self.record_event(pod, reason, message, warning=warning)

    def record_event(self, pod: PodInfo, reason: str, message: str, warning: bool = False) -> None:
        """Best effort: an event that cannot be written must not fail the operation."""
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.hotmount-"),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid
            ),
            reason=reason,
            message=message,
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component="gpu-hotmount", host=pod.node_name),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(pod.namespace, event)
        except Exception as exc:  # the work is done: an Event must never turn it into a 500
            log.warning(
                "could not record event %s on %s/%s: %s",
                reason,
                pod.namespace,
                pod.name,
                getattr(exc, "reason", None) or exc,
            )

    # -- configmaps
    def configmap(self, namespace: str, name: str) -> dict[str, str]:
        try:
            return self.core.read_namespaced_config_map(name, namespace).data or {}
        except ApiException as exc:
            raise _upstream(exc, f"reading configmap {namespace}/{name}") from exc

    # -- authentication and authorization
    def token_review(self, token: str, audiences: list[str]) -> UserInfo | None:
        review = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=audiences or None)
        )
        try:
            result = self.authn.create_token_review(review)
        except ApiException as exc:
            raise _upstream(exc, "TokenReview") from exc
        status = result.status
        if not status or not status.authenticated or not status.user:
            return None
        user = status.user
        if user.username is None:  # never so when authenticated; the client types it optional
            return None
        return UserInfo(
            user.username, list(user.groups or []), user.uid or "", dict(user.extra or {})
        )

    def subject_access_review(
        self, user: UserInfo, verb: str, namespace: str, name: str, *, resource: str, group: str
    ) -> tuple[bool, str]:
        attributes = client.V1ResourceAttributes(
            group=group,
            resource=resource,
            verb=verb,
            namespace=namespace or None,
            name=name or None,
        )
        return self._access_review(user, resource_attributes=attributes)

    def path_access_review(self, user: UserInfo, verb: str, path: str) -> tuple[bool, str]:
        """A SubjectAccessReview for a non-resource URL (`get /metrics`), as the kubelet's
        and controller-runtime's metrics filters ask it."""
        attributes = client.V1NonResourceAttributes(path=path, verb=verb)
        return self._access_review(user, non_resource_attributes=attributes)

    def _access_review(self, user: UserInfo, **attributes: Any) -> tuple[bool, str]:
        """(allowed, reason) for `user` and the resource or non-resource `attributes`."""
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user.username,
                groups=user.groups,
                uid=user.uid or None,
                extra=user.extra or None,
                **attributes,
            )
        )
        try:
            result = self.authz.create_subject_access_review(review)
        except ApiException as exc:
            raise _upstream(exc, "SubjectAccessReview") from exc
        status = result.status
        assert status is not None  # the API server always answers a review with its status
        return bool(status.allowed), status.reason or ""

    def ping(self) -> None:
        try:
            client.VersionApi(self.api).get_code(_request_timeout=3)
        except Exception as exc:  # any failure means "not reachable"
            raise UpstreamError(f"the API server is unreachable: {exc}") from exc


def _holder_pod(pod: client.V1Pod) -> HolderPod:
    meta, spec = pod.metadata, pod.spec
    # As in _pod_info: always there in what the API server returns.
    assert meta is not None and spec is not None
    assert meta.namespace is not None and meta.name is not None
    return HolderPod(
        namespace=meta.namespace,
        name=meta.name,
        labels=meta.labels or {},
        node=spec.node_name or _pinned_node(spec),
    )


def _pinned_node(spec: client.V1PodSpec) -> str | None:
    """The node a pending holder is pinned to: `metadata.name` in its required node
    affinity, or the hostname label of holders made before that (older agents)."""
    affinity = spec.affinity and spec.affinity.node_affinity
    required = affinity and affinity.required_during_scheduling_ignored_during_execution
    for term in (required and required.node_selector_terms) or []:
        for field_ in term.match_fields or []:
            if field_.key == "metadata.name" and field_.operator == "In" and field_.values:
                return str(field_.values[0])
    return (spec.node_selector or {}).get("kubernetes.io/hostname")


def hand_over_patch(labels: dict[str, str], owner: PodInfo) -> dict[str, object]:
    """The one change the agent makes to a pod: a pin's labels and its one owner reference,
    as a JSON merge patch (the admission policy admits this change of a pin, and no other)."""
    return {"metadata": {"labels": labels, "ownerReferences": [owner_reference(owner)]}}


def owner_reference(owner: PodInfo) -> dict[str, object]:
    """A same-namespace, non-controller owner reference: the garbage collector deletes the
    holder with its pod (a cross-namespace owner would read as absent: GPUMounter's bug)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": owner.name,
        "uid": owner.uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }


def _quota_message(exc: ApiException) -> str | None:
    """The API server's own words when a ResourceQuota refused the pod (403 `exceeded
    quota: <name>, requested: ..., used: ..., limited: ...`), else None."""
    if exc.status != 403:
        return None
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except ValueError:
        return None
    return message if "exceeded quota" in message else None


def api_error(exc: ApiException, what: str, namespace: str = "") -> Exception:
    """The agent's error for the API server's answer to a create: a ResourceQuota's
    refusal is the tenant's to read (QuotaExceeded), the rest as `_upstream`."""
    quota = _quota_message(exc)
    if quota:
        return QuotaExceeded(quota, {"namespace": namespace})
    return _upstream(exc, what)


def _upstream(exc: ApiException, what: str) -> Exception:
    if exc.status == 403:
        return Forbidden(f"{what}: the agent's service account is not allowed ({exc.reason})")
    if not exc.status:  # no HTTP answer at all (see TimedApiClient)
        return UpstreamError(f"{what}: {exc.reason}")
    return UpstreamError(f"{what}: {exc.status} {exc.reason}")
