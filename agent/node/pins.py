"""Pins: a GPU mounted by name, reserved in the scheduler's books for its pod.

A hot-mount the kubelet does not know about is a GPU it will hand to the next GPU pod.
So a mount by name first gets a *pin*, a holder pod that the books give exactly that
GPU, in the target's namespace (its ResourceQuota is charged):

- device plugin: the kubelet cannot be asked for one device, only for a count. The pin
  holds every free GPU at once with 1-GPU *scouts*, keeps the scout that was given the
  wanted GPU and deletes the others: bounded by the node's GPU count, and done one
  mount at a time on the node (`HolderPods.turn`);
- DRA: a ResourceClaim selecting the GPU by UUID, and a holder pod that references it;
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

from agent.config import AgentSettings
from agent.errors import QuotaExceeded, Unschedulable, UpstreamError
from agent.kube.client import KubeClient, PodInfo, owner_reference
from agent.kube.dra import ResourceApi
from agent.node import dra
from agent.node.accounting import Accounting, Books, Management
from agent.node.holders import (
    HOLDER_LABEL,
    MANAGED_BY,
    ROLE_LABEL,
    Holder,
    HolderPods,
    Role,
    holder_manifest,
)
from agent.node.kubelet import KubeletBooks
from agent.node.results import device_label, require_kube
from hotmount import claims
from hotmount import engine as eng
from hotmount.claims import Claim
from hotmount.devices.model import Device, DeviceKind

log = logging.getLogger(__name__)

HOLDER_KIND = "holderKind"  # ledger metadata: "pin" for a pin (a count holder has none)


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
    engine: eng.Engine
    kube: KubeClient | None
    kubelet: KubeletBooks
    holders: HolderPods
    accounting: Accounting
    resources: ResourceApi | None

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
        pins, needed = self._existing(target, devices, share, force, books)
        made: list[Holder] = []
        if needed:
            with self.holders.turn():
                made = self._make(target, needed, books)
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
            given = [h for h in holds if h.footprint.overlaps(footprint)]
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
        blockers = claims.blocking(new, self.engine.ledger.claims(), share)
        if blockers:
            raise claims.claimed_error(device, blockers)

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
                made.update(self._scout(target, by_plugin))
            for device in by_claim:
                made[device.key] = self._claim(target, device, books)
        except BaseException:
            self.holders.delete(target.namespace, [h.name for h in made.values()])
            raise
        return [made[key] for key in needed]

    def _scout(self, target: PodInfo, wanted: list[Device]) -> dict[str, Holder]:
        """Hold every free GPU with a 1-GPU scout; keep the scouts given a wanted GPU."""
        namespace = target.namespace
        free = self.kubelet.free_count()
        if free < len(wanted):
            raise Unschedulable(
                f"the kubelet counts {free} {self.settings.gpu_resource} free on this node, "
                f"and {', '.join(device_label(d) for d in wanted)} must be among them: a pod "
                "that is starting or terminating may hold it; retry, or pass force"
            )
        names = [self.holders.new_name(target, Role.PIN) for _ in range(free)]
        scouts: list[Holder] = []
        quota: QuotaExceeded | None = None
        with self.holders.in_flight(namespace, names):
            try:
                for name in names:
                    try:
                        scouts.append(self._create_scout(target, name))
                    except QuotaExceeded as exc:
                        if not scouts:
                            raise QuotaExceeded(
                                f"namespace {namespace} has no room for the pin that keeps "
                                f"{', '.join(device_label(d) for d in wanted)} in the "
                                f"scheduler's books: {exc.message}",
                                exc.details,
                            ) from exc
                        quota = exc
                        break
                outcome = self.holders.wait_all_running(namespace, [s.name for s in scouts])
                running = [s.name for s in scouts if outcome[s.name] is None]
                given = self.kubelet.given_to(namespace, running) if running else {}
                kept = self._pick(wanted, scouts, given)
            except BaseException:
                self.holders.delete(namespace, [s.name for s in scouts])
                raise
            others = [s.name for s in scouts if s not in kept.values()]
            self.holders.delete(namespace, others)
            self._wait_freed(namespace, others)
            missing = [d for d in wanted if d.key not in kept]
            if missing:
                self.holders.delete(namespace, [h.name for h in kept.values()])
                labels = ", ".join(device_label(d) for d in missing)
                if quota is not None:
                    raise QuotaExceeded(
                        f"namespace {namespace}'s quota let {len(scouts)} of the {free} free "
                        f"GPUs be held at once, and the kubelet gave {labels} to none of them "
                        f"({quota.message}); retry, or raise the quota",
                        quota.details,
                    )
                raise Unschedulable(
                    f"the kubelet gave {labels} to none of {len(scouts)} pins: another pod "
                    "took it meanwhile; retry"
                )
        log.info(
            "pinned %s for %s/%s with %d scout(s)",
            ", ".join(f"{k} as {h.name}" for k, h in kept.items()),
            namespace,
            target.name,
            len(scouts),
        )
        return kept

    def _wait_freed(self, namespace: str, names: list[str]) -> None:
        """Until the kubelet lists none of these deleted scouts as holding a GPU: the next
        mount's turn (or an ordinary pod) then finds their GPUs free. Bounded by
        `--holder-timeout`; past it, the next turn merely sees fewer GPUs free."""
        deadline = time.monotonic() + self.settings.holder_timeout
        while names and time.monotonic() < deadline:
            if not any(self.kubelet.given_to(namespace, names).values()):
                return
            time.sleep(0.1)
        if names:
            log.warning("the kubelet still lists deleted scouts %s", ", ".join(names))

    def _create_scout(self, target: PodInfo, name: str) -> Holder:
        manifest = holder_manifest(self.settings, target, name, 1, Role.PIN)
        created = require_kube(self.kube).create_pod(target.namespace, manifest)
        return Holder(name, created.uid)

    def _pick(
        self, wanted: list[Device], scouts: list[Holder], given: dict[str, list[str]]
    ) -> dict[str, Holder]:
        inventory = self.engine.inventory
        kept: dict[str, Holder] = {}
        for device in wanted:
            footprint = inventory.footprint(device)
            for scout in scouts:
                if scout in kept.values():
                    continue
                keys = given.get(scout.name, [])
                devices = [d for k in keys if (d := inventory.get(k)) is not None]
                if any(inventory.footprint(d).overlaps(footprint) for d in devices):
                    kept[device.key] = scout
                    break
        return kept

    def _claim(self, target: PodInfo, device: Device, books: Books) -> Holder:
        """A ResourceClaim for exactly this GPU (by UUID) and a pin pod that uses it."""
        if self.resources is None or device.uuid is None:
            raise UpstreamError(f"device {device_label(device)} is DRA's, and has no UUID to claim")
        namespace = target.namespace
        name = self.holders.new_name(target, Role.PIN)
        claim = pin_claim_manifest(
            target, name, books.published_uuid(device.uuid),
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
                    holder_manifest(self.settings, target, name, 1, Role.PIN, device.uuid), name
                )
                created = require_kube(self.kube).create_pod(namespace, pod)
                self.holders.wait_running(namespace, name)
            except BaseException:
                self.holders.delete(namespace, [name])
                raise
        return Holder(name, created.uid)
