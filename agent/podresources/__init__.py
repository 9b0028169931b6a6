"""Client for the kubelet PodResources v1 API (vendored proto, generated stubs)."""

from agent.podresources.client import (
    DEFAULT_SOCKET,
    Allocation,
    ClaimAllocation,
    PodResourcesClient,
    PodResourcesError,
)

__all__ = [
    "DEFAULT_SOCKET",
    "Allocation",
    "ClaimAllocation",
    "PodResourcesClient",
    "PodResourcesError",
]
