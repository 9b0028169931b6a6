"""Pins: a GPU mounted by name, reserved in the scheduler's books for its pod.

A hot-mount the kubelet does not know about is a GPU it will hand to the next GPU pod.
So a mount by name first gets a *pin*, a holder pod that the books give exactly that
GPU, in the target's namespace (its ResourceQuota is charged):

- device plugin: the kubelet cannot be asked for one device, only for a count. Blockers
  in the agent's own namespace take every other free GPU, and the pin takes the one
  left; decided when the kubelet admits the pods, not when they run, one mount at a
  time on the node (`HolderPods.turn`): agent/books/plugin_pins.py;
- DRA: a ResourceClaim selecting the GPU by UUID, and a holder pod that references it,
  done once the claim is allocated and the pin bound;
- a GPU no one else manages needs no pin: the agent is its only allocator.

A pin is recorded with its mount as `holder`/`holderUid`, like a count holder: unmount
deletes it once no container of the pod has the GPU, reconcile takes the GPU back if
the pin goes, and an agent restart keeps both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agent.books import dra
from agent.books.accounting import Accounting, Books, Management
from agent.books.holders import (
    HOLDER_LABEL,
    MANAGED_BY,
    ROLE_LABEL,
    Holder,
    HolderPods,
    Role,
    holder_manifest,
)
from agent.books.kubelet import KubeletBooks
from agent.books.plugin_pins import PluginPins, is_blocker
from agent.common.results import device_label, require_kube
from agent.config import AgentSettings
from agent.errors import QuotaExceeded, Timeout, Unschedulable, UpstreamError
from agent.kube.client import KubeClient, PodInfo, owner_reference
from agent.kube.dra import ResourceApi
from hotmount.api import Claim, Device, DeviceKind, Engine, blocking_claims, claimed_error, gpu_uuid

log = logging.getLogger(__name__)

CLAIM_POLL = 0.05  # seconds between two looks at a DRA pin and its claim
HOLDER_KIND = "holderKind"  # ledger metadata: "pin" for a pin (a count holder has none)
# The labels that name a mount's pin or holder pod: released on suspend (the engine drops
# them from the GPUs a resume mounts, which get the pins made for them instead).
HOLDER_LABELS = frozenset({"holder", "holderUid", HOLDER_KIND})


def pin_metadata(pin: Holder) -> dict[str, str]:
    """What a mount's ledger entry records of its pin."""
    return {"holder": pin.name, "holderUid": pin.uid, HOLDER_KIND: str(Role.PIN)}


def pin_of(metadata: dict[str, str]) -> str | None:
    """The pin a ledger entry names (None for a count holder or no holder)."""
    return metadata.get("holder") if metadata.get(HOLDER_KIND) == Role.PIN else None


def pin_claim_manifest(
    target: PodInfo, name: str, uuid: str, *, mig: bool, names: dra.DraNames = dra.NVIDIA_NAMES
) -> dict[str, Any]:
    """The ResourceClaim a pin holds its GPU through under DRA, labelled and owned like the
    pin itself (the admission policy admits only that shape)."""
    return dra.claim_manifest(
        target.namespace,
        name,
        uuid,
        mig=mig,
        labels={MANAGED_BY[0]: MANAGED_BY[1], HOLDER_LABEL: target.name, ROLE_LABEL: str(Role.PIN)},
        owner=owner_reference(target),
        names=names,
    )


@dataclass(frozen=True)
class Pins:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    kubelet: KubeletBooks
    holders: HolderPods
    accounting: Accounting
    resources: ResourceApi | None
    plugin: PluginPins

    @contextmanager
    def pinned(
        self, target: PodInfo, devices: list[Device], share: str | None, force: bool
    ) -> Iterator[dict[str, Holder]]:
        """The pin of each device that needs one (by inventory key), for the body to
        mount; the pins made here are deleted again if the body fails."""
        if self.kube is None:
            yield {}
            return
        books = self.accounting.books(strict=True)
        made: list[Holder] = []
        pins: dict[str, Holder] = {}
        needed: dict[str, Device] = {}
        if any(self.accounting.case(d, books) is not Management.UNMANAGED for d in devices):
            # The kubelet's books are read within the turn: another mount's blockers are
            # gone from them by then.
            with self.holders.turn():
                pins, needed = self._existing(target, devices, share, force, books)
                made = self._make(target, needed, books) if needed else []
        pins.update({key: holder for key, holder in zip(needed, made, strict=True)})
        try:
            with self.holders.in_flight(target.namespace, [h.name for h in made]):
                yield pins
        except BaseException:
            self.holders.delete(target.namespace, [h.name for h in made])
            raise

    def _existing(
        self,
        target: PodInfo,
        devices: list[Device],
        share: str | None,
        force: bool,
        books: Books,
    ) -> tuple[dict[str, Holder], dict[str, Device]]:
        """The pins this pod already has (another of its containers has the GPU), and the
        devices that need a new one. No pin where no one else keeps books, or where the
        kubelet gave the GPU to this pod or the one it shares with; a forced mount of a
        GPU the kubelet gave elsewhere gets none either (it cannot), and reconcile
        reports it as double-booked."""
        inventory = self.engine.inventory
        holds = self.kubelet.holds(strict=True)
        mine = {f"{target.namespace}/{target.name}", *([share] if share else [])}
        pins: dict[str, Holder] = {}
        needed: dict[str, Device] = {}
        for device in devices:
            if self.accounting.case(device, books) is Management.UNMANAGED:
                continue
            footprint = inventory.footprint(device)
            given = [
                h
                for h in holds
                if h.footprint.overlaps(footprint)
                and not is_blocker(h.allocation.pod_namespace, h.allocation.pod_name, self.settings)
            ]
            owners = {(h.allocation.pod_namespace, h.allocation.pod_name) for h in given}
            if not owners:
                needed[device.key] = device
                continue
            if any(f"{ns}/{pod}" in mine for ns, pod in owners):
                continue
            pin = self._own_pin(target, owners, share)
            if pin is not None:
                pins[device.key] = pin
            elif not force:
                self._refuse_claimed(device, target, share)
                raise Unschedulable(
                    f"device {device_label(device)} is given to another pod in the kubelet's "
                    "books, so it cannot be pinned for this one"
                )
        return pins, needed

    def _refuse_claimed(self, device: Device, target: PodInfo, share: str | None) -> None:
        """The engine's own 409 (naming the container) where another pod's pin stands for
        a hot-mount of the same GPU: the caller learns who has it, not just "pinned"."""
        group = f"{target.namespace}/{target.name}"
        new = Claim("", device.key, group, self.engine.inventory.footprint(device))
        blockers = blocking_claims(new, self.engine.mounts.claims(), share)
        if blockers:
            raise claimed_error(device, blockers)

    def _own_pin(
        self, target: PodInfo, owners: set[tuple[str, str]], share: str | None
    ) -> Holder | None:
        """A pin among `owners` that stands for the target pod (another of its containers
        has the GPU) or for a pod it shares with on purpose: the mount names it too, so
        the pin stays while any of them has the GPU."""
        kube = require_kube(self.kube)
        for namespace, name in sorted(owners):
            if namespace != target.namespace:
                continue
            pod = kube.find_pod(namespace, name)
            # Sharing on purpose joins a circle of pods of one namespace, any of which the
            # pin may stand for; the engine's claims decide whether the share is allowed.
            if (
                pod is not None
                and (share is not None or pod.labels.get(HOLDER_LABEL) == target.name)
                and pod.labels.get(ROLE_LABEL) == Role.PIN
            ):
                return Holder(pod.name, pod.uid)
        return None

    def _make(self, target: PodInfo, needed: dict[str, Device], books: Books) -> list[Holder]:
        """A new pin for each needed device, in order; all or none."""
        by_plugin = [d for d in needed.values() if books.cases.get(d.key) != Management.DRA]
        by_claim = [d for d in needed.values() if books.cases.get(d.key) == Management.DRA]
        made: dict[str, Holder] = {}
        try:
            if by_plugin:
                made.update(self.plugin.pin(target, by_plugin))
            for device in by_claim:
                made[device.key] = self._claim(target, device, books)
        except BaseException:
            self.holders.delete(target.namespace, [h.name for h in made.values()])
            raise
        return [made[key] for key in needed]

    def _claim(self, target: PodInfo, device: Device, books: Books) -> Holder:
        """A ResourceClaim for exactly this GPU (by UUID) and a pin pod that uses it."""
        uuid = gpu_uuid(device)
        if self.resources is None or uuid is None:
            raise UpstreamError(f"device {device_label(device)} is DRA's, and has no UUID to claim")
        namespace = target.namespace
        name = self.holders.new_name(target, Role.PIN)
        claim = pin_claim_manifest(
            target, name, books.published_uuid(uuid),
            mig=device.kind is DeviceKind.MIG, names=dra.DraNames.of(self.settings),
        )  # fmt: skip
        with self.holders.in_flight(namespace, [name]):
            try:
                self.resources.create_claim(namespace, claim)
            except QuotaExceeded as exc:
                raise QuotaExceeded(
                    f"namespace {namespace} has no room for the claim on "
                    f"{device_label(device)}: {exc.message}",
                    exc.details,
                ) from exc
            try:
                pod = dra.with_claim(
                    holder_manifest(self.settings, target, name, 1, Role.PIN, uuid), name
                )
                created = require_kube(self.kube).create_pod(namespace, pod)
                self._wait_allocated(namespace, name, created.uid)
            except BaseException:
                self.holders.delete(namespace, [name])
                raise
        return Holder(name, created.uid)

    def _wait_allocated(self, namespace: str, name: str, uid: str) -> None:
        """Until the scheduler has allocated the pin's claim, reserved it for the pin and
        bound the pin to this node: from then on the GPU is the claim's in the books (the
        kubelet prepares it when it admits the pin). The pin goes on starting in the
        background; a pin that fails later is found by reconcile (its GPU taken back)."""
        assert self.resources is not None
        kube = require_kube(self.kube)
        deadline = time.monotonic() + self.settings.holder_timeout
        while True:
            pod = kube.find_pod(namespace, name)
            if pod is None or pod.uid != uid:
                raise Unschedulable(f"pin {namespace}/{name} disappeared")
            if pod.unschedulable_message:
                raise Unschedulable(f"no room for {name}: {pod.unschedulable_message}")
            if pod.phase in ("Failed", "Succeeded"):
                raise Unschedulable(f"pin {name} was rejected ({pod.phase})")
            if pod.node_name:
                status = (self.resources.get_claim(namespace, name) or {}).get("status") or {}
                reserved = {r.get("uid") for r in status.get("reservedFor") or []}
                if status.get("allocation") and uid in reserved:
                    return
            if time.monotonic() > deadline:
                raise Timeout(
                    f"the claim of pin {name} was not allocated and the pin not bound after "
                    f"{self.settings.holder_timeout:g}s"
                )
            time.sleep(CLAIM_POLL)
