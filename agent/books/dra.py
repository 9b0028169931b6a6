"""DRA (``resource.k8s.io/v1``) pieces for putting a hot-mounted GPU in the scheduler's books.

On a cluster whose GPUs are published by NVIDIA's DRA driver, a GPU mounted by name
is only safe once a ResourceClaim selecting exactly that GPU is allocated and held by a
pod (docs/api.md, "Accounting"). This module builds that claim and the holder's reference
to it, and reads the node's ResourceSlices; it does no I/O (agent/kube/dra.py does).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.podresources.client import ClaimAllocation

if TYPE_CHECKING:
    from agent.config import AgentSettings

__all__ = [
    "CLAIM_REF",
    "DRA_GROUP",
    "DRA_VERSION",
    "GPU_CLASS",
    "GPU_DRIVER",
    "MIG_CLASS",
    "NVIDIA_NAMES",
    "ClaimAllocation",
    "DraNames",
    "SliceDevice",
    "claim_manifest",
    "same_uuid",
    "slice_devices",
    "with_claim",
]

DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
GPU_DRIVER = "gpu.nvidia.com"
# The DeviceClasses NVIDIA's chart installs: whole GPUs (type "gpu") and MIG devices.
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"


@dataclass(frozen=True)
class DraNames:
    """Which DRA driver publishes the node's GPUs, and how: its name (the ResourceSlices'
    driver and the domain of its attributes), the DeviceClasses a pin's claim asks for,
    and the attribute holding a device's GPU or MIG UUID. NVIDIA's by default; settings
    (``--dra-driver`` ...) name another driver's, with no code for any one driver."""

    driver: str = GPU_DRIVER
    gpu_class: str = GPU_CLASS
    mig_class: str = MIG_CLASS
    uuid_attribute: str = "uuid"

    @classmethod
    def of(cls, settings: AgentSettings) -> DraNames:
        return cls(
            settings.dra_driver,
            settings.dra_gpu_class,
            settings.dra_mig_class,
            settings.dra_uuid_attribute,
        )


NVIDIA_NAMES = DraNames()  # NVIDIA's DRA driver (k8s-dra-driver-gpu), the default


CLAIM_REF = "gpu"  # the pod's spec.resourceClaims entry, and the claim's one request
# Device-plugin resources of NVIDIA's domain (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...):
# a GPU held through DRA must not be asked of the device plugin as well.
_PLUGIN_DOMAIN = "nvidia.com/"
# Only hex digits and dashes may follow the prefix: the UUID is pasted into a CEL
# string literal, and nothing here can close the quote or add an operator. The prefix in
# either case: NVML says GPU-, a driver may publish the same UUID as gpu- (same_uuid).
_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F-]*", re.IGNORECASE)
# What the names may be, as the API validates them (so they paste into CEL safely): a
# driver or DeviceClass is a DNS subdomain, an attribute a C identifier of 32 at most.
_SUBDOMAIN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def same_uuid(a: str, b: str) -> bool:
    """UUIDs compare without case (RFC 9562: hex digits in either case), prefix too."""
    return a.casefold() == b.casefold()


def claim_manifest(
    namespace: str,
    name: str,
    uuid: str,
    *,
    mig: bool,
    labels: dict[str, str],
    owner: dict[str, object] | None,
    names: DraNames = NVIDIA_NAMES,
) -> dict[str, Any]:
    """A ResourceClaim for exactly the device whose UUID attribute is ``uuid`` (spelled as
    the driver publishes it: the selector compares strings).

    Raises ValueError for a UUID that is not ``GPU-``/``MIG-`` plus hex and dashes, or
    whose prefix does not fit ``mig`` (such a claim could never be allocated), or for
    driver, class or attribute names that could not be pasted into CEL safely.
    """
    if not _UUID.fullmatch(uuid):
        raise ValueError(f"not a GPU or MIG UUID: {uuid!r}")
    for what, value in vars(names).items():
        form = _IDENTIFIER if what == "uuid_attribute" else _SUBDOMAIN
        if not form.fullmatch(value):
            raise ValueError(f"DRA {what} {value!r} is not a name the API accepts")
    if uuid.upper().startswith("MIG-") != mig:
        kind = "MIG" if mig else "GPU"
        raise ValueError(f"{uuid} is not a {kind} UUID")
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    expression = f'device.attributes["{names.driver}"].{names.uuid_attribute} == "{uuid}"'
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
                            "deviceClassName": names.mig_class if mig else names.gpu_class,
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


def slice_devices(
    slices: list[dict[str, Any]], node: str, names: DraNames = NVIDIA_NAMES
) -> list[SliceDevice]:
    """The GPU driver's devices on ``node`` from ResourceSlice JSON objects.

    Only a pool's newest generation counts: a driver that republishes leaves older
    slices behind for a while, and their devices may no longer exist.
    """
    newest: dict[str, int] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") == names.driver:
            pool = spec.get("pool") or {}
            name = str(pool.get("name", ""))
            newest[name] = max(newest.get(name, 0), int(pool.get("generation") or 0))
    found: list[SliceDevice] = []
    for obj in slices:
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        pool_name = str(pool.get("name", ""))
        if spec.get("driver") != names.driver:
            continue
        if int(pool.get("generation") or 0) < newest[pool_name]:
            continue
        per_device = bool(spec.get("perDeviceNodeSelection"))
        for device in spec.get("devices") or []:
            where = device.get("nodeName") if per_device else spec.get("nodeName")
            if where != node:
                continue
            uuid = _uuid(device, names)
            found.append(SliceDevice(names.driver, pool_name, device["name"], uuid))
    return found


def _uuid(device: dict[str, Any], names: DraNames) -> str | None:
    """The driver's UUID attribute; a slice may name it bare or domain-qualified."""
    attributes = device.get("attributes") or {}
    bare = names.uuid_attribute
    value = attributes.get(bare) or attributes.get(f"{names.driver}/{bare}") or {}
    found = value.get("string")
    return str(found) if found else None
