"""DRA (``resource.k8s.io/v1``) pieces for putting a hot-mounted GPU in the scheduler's books.

On a cluster whose GPUs are published by NVIDIA's DRA driver, a GPU mounted by name
is only safe once a ResourceClaim selecting exactly that GPU is allocated and held by a
pod (DESIGN.md, "Accounting"). This module builds that claim and the holder's reference
to it, and reads the node's ResourceSlices; it does no I/O (agent/kube/dra.py does).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from agent.podresources.client import ClaimAllocation

__all__ = [
    "CLAIM_REF",
    "DRA_GROUP",
    "DRA_VERSION",
    "GPU_CLASS",
    "GPU_DRIVER",
    "MIG_CLASS",
    "ClaimAllocation",
    "SliceDevice",
    "claim_manifest",
    "slice_devices",
    "with_claim",
]

DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
GPU_DRIVER = "gpu.nvidia.com"
# The DeviceClasses NVIDIA's chart installs: whole GPUs (type "gpu") and MIG devices.
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
CLAIM_REF = "gpu"  # the pod's spec.resourceClaims entry, and the claim's one request
# Device-plugin resources of NVIDIA's domain (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...):
# a GPU held through DRA must not be asked of the device plugin as well.
_PLUGIN_DOMAIN = "nvidia.com/"
# Only hex digits and dashes may follow the prefix: the UUID is pasted into a CEL
# string literal, and nothing here can close the quote or add an operator.
_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F-]*")


def claim_manifest(
    namespace: str,
    name: str,
    uuid: str,
    *,
    mig: bool,
    labels: dict[str, str],
    owner: dict[str, object] | None,
) -> dict[str, Any]:
    """A ResourceClaim for exactly the device whose ``uuid`` attribute is ``uuid``.

    Raises ValueError for a UUID that is not ``GPU-``/``MIG-`` plus hex and dashes, or
    whose prefix does not fit ``mig`` (such a claim could never be allocated).
    """
    if not _UUID.fullmatch(uuid):
        raise ValueError(f"not a GPU or MIG UUID: {uuid!r}")
    if uuid.startswith("MIG-") != mig:
        kind = "MIG" if mig else "GPU"
        raise ValueError(f"{uuid} is not a {kind} UUID")
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    expression = f'device.attributes["{GPU_DRIVER}"].uuid == "{uuid}"'
    return {
        "apiVersion": f"{DRA_GROUP}/{DRA_VERSION}",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": CLAIM_REF,
                        "exactly": {
                            "deviceClassName": MIG_CLASS if mig else GPU_CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def with_claim(pod_manifest: dict[str, Any], claim_name: str) -> dict[str, Any]:
    """A copy of a one-container holder pod that holds its GPU through ``claim_name``.

    Every ``nvidia.com/`` resource leaves the container's limits and requests (the GPU
    comes from the claim, not the device plugin); cpu and memory stay, so the pod keeps
    its QoS class.
    """
    pod = copy.deepcopy(pod_manifest)
    spec = pod.setdefault("spec", {})
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise ValueError(f"a holder pod has one container, not {len(containers)}")
    spec["resourceClaims"] = [{"name": CLAIM_REF, "resourceClaimName": claim_name}]
    resources = containers[0].setdefault("resources", {})
    for key in ("limits", "requests"):
        amounts = resources.get(key)
        if amounts is None:
            continue
        kept = {k: v for k, v in amounts.items() if not k.startswith(_PLUGIN_DOMAIN)}
        if kept:
            resources[key] = kept
        else:
            del resources[key]
    resources["claims"] = [{"name": CLAIM_REF}]
    return pod


@dataclass(frozen=True)
class SliceDevice:
    """A device NVIDIA's driver published for a node: the (driver, pool, device) triplet
    that allocations and PodResources name, and the GPU or MIG UUID it stands for."""

    driver: str
    pool: str
    device: str
    uuid: str | None


def slice_devices(slices: list[dict[str, Any]], node: str) -> list[SliceDevice]:
    """The GPU driver's devices on ``node`` from ResourceSlice JSON objects.

    Only a pool's newest generation counts: a driver that republishes leaves older
    slices behind for a while, and their devices may no longer exist.
    """
    newest: dict[str, int] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") == GPU_DRIVER:
            pool = spec.get("pool") or {}
            name = str(pool.get("name", ""))
            newest[name] = max(newest.get(name, 0), int(pool.get("generation") or 0))
    found: list[SliceDevice] = []
    for obj in slices:
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        pool_name = str(pool.get("name", ""))
        if spec.get("driver") != GPU_DRIVER:
            continue
        if int(pool.get("generation") or 0) < newest[pool_name]:
            continue
        per_device = bool(spec.get("perDeviceNodeSelection"))
        for device in spec.get("devices") or []:
            where = device.get("nodeName") if per_device else spec.get("nodeName")
            if where != node:
                continue
            found.append(SliceDevice(GPU_DRIVER, pool_name, device["name"], _uuid(device)))
    return found


def _uuid(device: dict[str, Any]) -> str | None:
    """The driver's ``uuid`` attribute; a slice may name it bare or domain-qualified."""
    attributes = device.get("attributes") or {}
    value = attributes.get("uuid") or attributes.get(f"{GPU_DRIVER}/uuid") or {}
    found = value.get("string")
    return str(found) if found else None
