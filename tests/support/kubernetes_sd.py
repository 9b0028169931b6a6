"""Prometheus' Kubernetes discovery (role `endpointslice`) as a pure function: the target
groups, with Prometheus' own meta labels, that it makes of EndpointSlices, their
Services and the pods they point at (discovery/kubernetes/endpointslice.go, pod.go,
service.go of Prometheus 2.42; the labels are documented under `kubernetes_sd_config`).

Debian's `prometheus` is built without Kubernetes discovery (`kubernetes_sd_configs` is
"not found in type config.ScrapeConfig"), so the real-node tier serves these groups to
it over HTTP discovery (`http_sd_configs`), listed from the real API server at every
refresh (tests/k8s/prometheus.py). The relabelings that pick the target are the real
Prometheus' own, on these labels.
"""

from __future__ import annotations

from typing import Any

from tests.support.prometheus_config import sanitize

Obj = dict[str, Any]
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def _labels_of(prefix: str, metadata: Obj) -> dict[str, str]:
    """`<prefix>_label_<name>`, `<prefix>_labelpresent_<name>`, and the same for
    annotations, as Prometheus spells them."""
    out: dict[str, str] = {}
    for kind in ("label", "annotation"):
        for name, value in (metadata.get(f"{kind}s") or {}).items():
            out[f"{prefix}_{kind}_{sanitize(name)}"] = value
            out[f"{prefix}_{kind}present_{sanitize(name)}"] = "true"
    return out


def _service_labels(service: Obj) -> dict[str, str]:
    meta = "__meta_kubernetes_service"
    return {
        f"{meta}_name": service["metadata"]["name"],
        **_labels_of(meta, service["metadata"]),
    }


def _pod_labels(pod: Obj) -> dict[str, str]:
    meta = "__meta_kubernetes_pod"
    status, metadata = pod.get("status", {}), pod["metadata"]
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )
    out = {
        f"{meta}_name": metadata["name"],
        f"{meta}_ip": status.get("podIP", ""),
        f"{meta}_ready": "true" if ready else "false",
        f"{meta}_phase": status.get("phase", ""),
        f"{meta}_node_name": pod["spec"].get("nodeName", ""),
        f"{meta}_host_ip": status.get("hostIP", ""),
        f"{meta}_uid": metadata.get("uid", ""),
        **_labels_of(meta, metadata),
    }
    for owner in metadata.get("ownerReferences", []):
        if owner.get("controller"):
            out[f"{meta}_controller_kind"] = owner["kind"]
            out[f"{meta}_controller_name"] = owner["name"]
    return out


def _container_of(pod: Obj, port: Obj) -> dict[str, str]:
    """The container that declares the slice's port (by number and protocol)."""
    meta = "__meta_kubernetes_pod_container"
    for container in pod["spec"].get("containers", []):
        for declared in container.get("ports", []):
            if declared["containerPort"] == port.get("port") and declared.get(
                "protocol", "TCP"
            ) == port.get("protocol", "TCP"):
                return {
                    f"{meta}_name": container["name"],
                    f"{meta}_image": container.get("image", ""),
                    f"{meta}_port_name": declared.get("name", ""),
                    f"{meta}_port_number": str(declared["containerPort"]),
                    f"{meta}_port_protocol": declared.get("protocol", "TCP"),
                    f"{meta}_init": "false",
                }
    return {}


def endpointslice_groups(slices: list[Obj], services: list[Obj], pods: list[Obj]) -> list[Obj]:
    """One target group per EndpointSlice (`{"targets": [...], "labels": {...}}`, HTTP
    discovery's form: each target's own labels are a group of their own, as a target
    group's labels are shared)."""
    by_service = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
    by_pod = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    groups = []
    for eps in slices:
        metadata = eps["metadata"]
        namespace = metadata["namespace"]
        shared = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_endpointslice_name": metadata["name"],
            "__meta_kubernetes_endpointslice_address_type": eps.get("addressType", ""),
            **_labels_of("__meta_kubernetes_endpointslice", metadata),
        }
        service = by_service.get((namespace, (metadata.get("labels") or {}).get(
            SERVICE_NAME_LABEL, "")))  # fmt: skip
        if service is not None:
            shared.update(_service_labels(service))
        for endpoint in eps.get("endpoints") or []:
            for port in eps.get("ports") or []:
                for address in endpoint.get("addresses", []):
                    labels = _target(endpoint, port, address, by_pod, namespace)
                    groups.append({"targets": [labels.pop("__address__")],
                                   "labels": {**shared, **labels}})  # fmt: skip
    return groups


def _target(
    endpoint: Obj, port: Obj, address: str, by_pod: dict[tuple[str, str], Obj], namespace: str
) -> dict[str, str]:
    meta = "__meta_kubernetes_endpointslice"
    conditions = endpoint.get("conditions", {})
    labels = {
        "__address__": f"{address}:{port.get('port')}",
        f"{meta}_port": str(port.get("port", "")),
        f"{meta}_port_name": port.get("name", ""),
        f"{meta}_port_protocol": port.get("protocol", "TCP"),
    }
    for condition in ("ready", "serving", "terminating"):
        if conditions.get(condition) is not None:
            value = "true" if conditions[condition] else "false"
            labels[f"{meta}_endpoint_conditions_{condition}"] = value
    if endpoint.get("hostname"):
        labels[f"{meta}_endpoint_hostname"] = endpoint["hostname"]
    ref = endpoint.get("targetRef")
    if ref:
        labels[f"{meta}_address_target_kind"] = ref.get("kind", "")
        labels[f"{meta}_address_target_name"] = ref.get("name", "")
        pod = by_pod.get((ref.get("namespace", namespace), ref.get("name", "")))
        if ref.get("kind") == "Pod" and pod is not None:
            labels.update(_pod_labels(pod))
            labels.update(_container_of(pod, port))
    return labels
