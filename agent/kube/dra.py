"""The DRA calls the agent makes (``resource.k8s.io/v1``), over the official client.

Objects go in and come out as plain JSON dicts, as agent/books/dra.py builds and reads
them, so nothing outside agent/kube touches the client's models. Errors map as
agent/kube/client.py maps them: a quota's refusal to QuotaExceeded, 403 to Forbidden,
everything else to UpstreamError.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.kube.client import api_error


class ResourceApi:
    """ResourceClaims (namespaced) and ResourceSlices (cluster-scoped) of ``resource.k8s.io/v1``."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api = api_client
        self.resource = client.ResourceV1Api(api_client)

    def _json(self, obj: object) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(obj))

    def create_claim(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            # The client serializes a dict body as it is; its types name only the model.
            created = self.resource.create_namespaced_resource_claim(namespace, manifest)  # type: ignore[arg-type]
            return self._json(created)
        except ApiException as exc:
            raise api_error(exc, f"creating resourceclaim in {namespace}", namespace) from exc

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(self.resource.read_namespaced_resource_claim(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise api_error(exc, f"reading resourceclaim {namespace}/{name}") from exc

    def delete_claim(self, namespace: str, name: str) -> None:
        """Gone or going: a claim still reserved by a pod stays (with a deletionTimestamp)
        until that pod is gone, and then the GPU is free."""
        try:
            self.resource.delete_namespaced_resource_claim(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise api_error(exc, f"deleting resourceclaim {namespace}/{name}") from exc

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        """ResourceSlices published for ``node``, by every driver; [] on a cluster that does
        not serve ``resource.k8s.io/v1`` (no DRA: the device plugin's books are the books)."""
        try:
            found = self.resource.list_resource_slice(field_selector=f"spec.nodeName={node}")
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise api_error(exc, f"listing resourceslices of {node}") from exc
        return [self._json(item) for item in found.items or []]
