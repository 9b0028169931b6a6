"""Structured DRA allocation for the fake API server (``resource.k8s.io/v1``).

Pure functions over JSON objects, after kube-scheduler's ``dynamicresources`` plugin
and the resourceclaim controller, for the part the agent relies on:

- a request ``exactly {deviceClassName, allocationMode: ExactCount, count, selectors}``
  gets ``count`` devices of the node's ResourceSlices for which the DeviceClass's and
  the request's CEL selectors are true and which no allocated claim holds;
- CEL runs in celpy over ``device.driver`` and ``device.attributes[domain][name]``,
  where a bare attribute name belongs to the driver's domain, as in DRA;
- an allocation is node-local (``nodeSelector`` on ``metadata.name``) and is kept while
  any pod reserves the claim; a claim allocated already only fits its own node.

Not modelled: ``firstAvailable``, ``allocationMode: All``, constraints, admin access,
taints, ResourceClaimTemplates, capacity. A selector that fails at run time (a missing
attribute) excludes the device, where the real allocator fails the whole attempt.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import celpy

from agent.books.dra import GPU_DRIVER

Obj = dict[str, Any]
Triplet = tuple[str, str, str]  # (driver, pool, device): a device in the books

CANNOT_ALLOCATE = "cannot allocate all claims"
FINALIZER = "resource.kubernetes.io/delete-protection"
# The DeviceClasses NVIDIA's chart installs (deployments/helm/.../deviceclass-*.yaml).
DEVICE_CLASSES = {
    "gpu.nvidia.com": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    ),
    "mig.nvidia.com": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    ),
}

_ENV = celpy.Environment()


@functools.cache
def _program(expression: str) -> Any:
    return _ENV.program(_ENV.compile(expression))


@dataclass(frozen=True)
class Device:
    """One published device, with the value CEL sees as ``device``."""

    driver: str
    pool: str
    name: str
    cel: Any = field(compare=False, hash=False)

    @property
    def triplet(self) -> Triplet:
        return (self.driver, self.pool, self.name)


def _value(attribute: Obj) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in attribute:
            return attribute[kind]
    return None


def _cel_device(driver: str, device: Obj) -> Any:
    attributes: dict[str, dict[str, Any]] = {driver: {}}
    for key, value in (device.get("attributes") or {}).items():
        domain, _, name = key.rpartition("/")
        attributes.setdefault(domain or driver, {})[name] = _value(value)
    return celpy.json_to_cel({"driver": driver, "attributes": attributes})


def devices_on(slices: Iterable[Obj], node: str) -> list[Device]:
    """Every device the slices publish for ``node``."""
    found = []
    for obj in slices:
        spec = obj.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        per_device = bool(spec.get("perDeviceNodeSelection"))
        for device in spec.get("devices") or []:
            if (device.get("nodeName") if per_device else spec.get("nodeName")) == node:
                found.append(Device(driver, pool, device["name"], _cel_device(driver, device)))
    return found


def _true(expression: str, device: Device) -> bool:
    try:
        result = _program(expression).evaluate({"device": device.cel})
    except celpy.CELEvalError:
        return False
    return not isinstance(result, celpy.CELEvalError) and bool(result)


def invalid(claim: Obj) -> str | None:
    """Why the API server would refuse this ResourceClaim (422), or None."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for i, request in enumerate(requests):
        where = f"spec.devices.requests[{i}]"
        if not request.get("name"):
            return f"{where}.name: Required value"
        exactly = request.get("exactly")
        if (exactly is None) == (request.get("firstAvailable") is None):
            return f"{where}: Invalid value: exactly one of exactly or firstAvailable is required"
        if exactly is None:
            continue
        if not exactly.get("deviceClassName"):
            return f"{where}.exactly.deviceClassName: Required value"
        for j, selector in enumerate(exactly.get("selectors") or []):
            expression = (selector.get("cel") or {}).get("expression", "")
            try:
                _program(expression)
            except celpy.CELParseError as err:
                return (
                    f"{where}.exactly.selectors[{j}].cel.expression: Invalid value: "
                    f"{expression!r}: compilation failed: {' '.join(str(err).split())}"
                )
    return None


def allocated_node(claim: Obj) -> str | None:
    """The node an allocated claim is bound to (its nodeSelector on metadata.name)."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for expr in term.get("matchFields") or []:
            if expr.get("key") == "metadata.name" and expr.get("values"):
                return str(expr["values"][0])
    return None


def results(allocation: Obj | None) -> list[Obj]:
    """The devices of a ``status.allocation`` (none for None)."""
    return list(((allocation or {}).get("devices") or {}).get("results") or [])


def held(claims: Iterable[Obj]) -> set[Triplet]:
    """Devices that allocated claims hold."""
    return {
        (r["driver"], r["pool"], r["device"])
        for c in claims
        for r in results((c.get("status") or {}).get("allocation"))
    }


def allocate(claim: Obj, node: str, devices: list[Device], taken: set[Triplet]) -> Obj | None:
    """``status.allocation`` for ``claim`` on ``node``, or None if it cannot be had there."""
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation:  # shared claims go where their devices are
        return allocation if allocated_node(claim) in (None, node) else None
    chosen: list[Obj] = []
    busy = set(taken)
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = request.get("exactly")
        if exactly is None or exactly.get("allocationMode", "ExactCount") != "ExactCount":
            return None
        class_selector = DEVICE_CLASSES.get(exactly.get("deviceClassName", ""))
        if class_selector is None:
            return None  # the real scheduler: device class does not exist
        selectors = [class_selector] + [
            (s.get("cel") or {}).get("expression", "") for s in exactly.get("selectors") or []
        ]
        fits = [
            d
            for d in devices
            if d.triplet not in busy and all(_true(expr, d) for expr in selectors)
        ][: int(exactly.get("count", 1))]
        if len(fits) < int(exactly.get("count", 1)):
            return None
        for device in fits:
            busy.add(device.triplet)
            chosen.append(
                {
                    "request": request["name"],
                    "driver": device.driver,
                    "pool": device.pool,
                    "device": device.name,
                }
            )
    return {
        "devices": {"results": chosen},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def cdi_name(claim: Obj, result: Obj) -> str:
    """The CDI device NVIDIA's kubelet plugin prepares for one allocated device, named per
    claim (cmd/gpu-kubelet-plugin/cdi.go, GetClaimDeviceName):
    ``k8s.gpu.nvidia.com/claim=<claim uid>-<device>``."""
    return f"k8s.{result['driver']}/claim={claim['metadata']['uid']}-{result['device']}"


def nvidia_slice(node: str, devices: dict[str, tuple[str, str]]) -> Obj:
    """What NVIDIA's kubelet plugin publishes: pool = node, bare attribute names."""
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com-x7k2p"},
        "spec": {
            "driver": GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": name,
                    "attributes": {
                        "type": {"string": kind},
                        "uuid": {"string": uuid},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        "driverVersion": {"version": "580.65.6"},
                    },
                }
                for name, (kind, uuid) in devices.items()
            ],
        },
    }
