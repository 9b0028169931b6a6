"""Mounts that outlast a container restart.

A container that dies (an OOM kill, a crash, `kill 1`) comes back with a new container
ID and none of the devices hot-mounted into the old one, and the engine's reconcile
forgets the dead container's record and releases its claims. Before that, the agent
keeps what the container had as an *intent* in its own store (agent/common/intents.py),
keyed by the pod's UID and the container's name. Each reconcile then mounts it into the
container that replaced the dead one, once that one runs, with the same pins, holders,
idle timeout and sharing, and tells the pod (a `GPURemounted` Event).

While the new container is not running yet (a crash-loop back-off), the intent waits,
and the pins and holders it names stay: the GPUs stay in the pod's books, so no other
pod is given them meanwhile. When the pod is deleted, has finished (Succeeded or
Failed: nothing restarts), or is replaced by a new pod of the same name (a new UID),
the intent goes, and with it its pins and holders, which nothing names any more.
Mounts made before the agent recorded pod UIDs, and mounts asked `once`, are not
carried over.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from agent.common.intents import Intent, Intents
from agent.common.locks import ContainerLocks
from agent.common.results import ONCE, POD_UID, record_event
from agent.errors import ApiError, PodNotFound
from agent.kube.client import KubeClient, PodInfo
from hotmount.api import (
    ContainerRecord,
    DeviceRecord,
    DriverUnavailable,
    Engine,
    HotmountError,
    now,
)

log = logging.getLogger(__name__)
FINISHED = ("Succeeded", "Failed")  # a pod whose containers are never started again


@dataclass(frozen=True)
class Remounts:
    engine: Engine
    kube: KubeClient | None
    locks: ContainerLocks
    intents: Intents

    def keep(self, records: Iterable[ContainerRecord]) -> None:
        """Keep what each dead container of a pod had, for its successor."""
        for record in records:
            owner = owner_of(record)
            kept = {k: d for k, d in record.devices.items() if d.metadata.get(ONCE) != "true"}
            if owner is None or not kept:
                continue
            key = f"{owner[POD_UID]}/{owner['container']}"
            intent = Intent(
                key=key, owner=owner, devices=kept, saved_at=now(), with_driver=bool(record.driver)
            )
            self.intents.save(intent)
            log.info("keeping %s of %s for its container's successor", list(record.devices), key)

    def remount(self) -> list[str]:
        """Mount each kept intent into the container now running in its place; drop the
        intents of pods that are gone. Returns the intents done with."""
        if self.kube is None:
            return []
        done = []
        for intent in self.intents.all():
            try:
                if self._remount_one(self.kube, intent):
                    done.append(intent.key)
            except (ApiError, HotmountError) as exc:
                log.warning("cannot mount %s again yet: %s", intent.key, exc.message)
        return done

    def _remount_one(self, kube: KubeClient, intent: Intent) -> bool:
        owner = intent.owner
        namespace, pod, name = owner["namespace"], owner["pod"], owner["container"]
        try:
            info = kube.get_pod(namespace, pod)
        except PodNotFound:
            info = None
        container = info.container(name) if info is not None else None
        if info is None or info.uid != owner[POD_UID] or container is None:
            self.intents.delete(intent.key)
            log.info("dropped %s: pod %s/%s is gone", intent.key, namespace, pod)
            return True
        if info.phase in FINISHED:
            self.intents.delete(intent.key)
            log.info("dropped %s: pod %s/%s has %s", intent.key, namespace, pod, info.phase)
            return True
        new_id = container.container_id
        if not container.running or not new_id or new_id == owner.get("containerId"):
            return False  # its successor is not running yet
        with self.locks.try_hold(new_id) as free:
            if not free:  # a call on the new container runs: the next pass (never waits)
                log.debug("remount of %s: container %s is busy", intent.key, new_id)
                return False
            mounted = self._mount(new_id, info, intent.devices, intent.with_driver)
        self.intents.delete(intent.key)
        names = ", ".join(mounted)
        record_event(
            kube,
            info,
            "GPURemounted",
            f"hot-mounted {names} again into {name}: the container restarted",
        )
        log.info("mounted %s again into %s of %s/%s", names, name, namespace, pod)
        return True

    def _mount(
        self,
        container_id: str,
        pod: PodInfo,
        devices: dict[str, DeviceRecord],
        with_driver: bool | None = None,
    ) -> list[str]:
        """The same devices, each with its own metadata (pin, holder, idle timeout), by
        the group they shared with; RDMA devices ride with the GPUs they came with; the
        driver's files if the dead container had them (and only then). Where they are
        gone from the node since, the devices come back with the node's default."""
        riders = [k for k, d in devices.items() if d.with_devices]
        # Whom the claims name (a refusal tells another tenant who holds the GPU).
        workload = next(iter(devices.values())).workload
        by_share: dict[str | None, list[str]] = defaultdict(list)
        for key, device in devices.items():
            if key not in riders:
                by_share[device.shared_with].append(key)
        mounted: list[str] = []
        for index, (share, keys) in enumerate(by_share.items()):
            mount = functools.partial(
                self.engine.mount,
                container_id,
                keys,
                workload=workload,
                group=f"{pod.namespace}/{pod.name}",
                share_with=share,
                rdma=riders if index == 0 and riders else None,
                device_metadata={k: d.metadata for k, d in devices.items()},
            )
            try:
                result = mount(with_driver=with_driver)
            except DriverUnavailable as exc:
                log.warning("the driver's files cannot come back (%s): the node's default", exc)
                result = mount()
            mounted += [m.key for m in result.mounted + result.already_mounted]
        return mounted


def forget_devices(
    intents: Intents, namespace: str, pod: str, container: str | None, keys: set[str] | None
) -> tuple[str, list[str]] | None:
    """Take `keys` (None: all) out of the intents of the pod's container (None: any), for an
    unmount while the container is down. (The old container's ID, the keys taken), or None
    when no intent is kept for it."""
    found = [
        i
        for i in intents.all()
        if (i.owner["namespace"], i.owner["pod"]) == (namespace, pod)
        and container in (None, i.owner["container"])
    ]
    if not found:
        return None
    taken: list[str] = []
    for intent in found:
        gone = [k for k in intent.devices if keys is None or k in keys]
        for key in gone:
            del intent.devices[key]
        taken += gone
        if intent.devices:
            intents.save(intent)
        else:
            intents.delete(intent.key)
    return found[0].owner["containerId"], taken


def owner_of(record: ContainerRecord) -> dict[str, str] | None:
    """Who the record's devices were mounted for, when that is a pod's container the
    agent can find again: namespace, pod, its UID, the container's name and old ID."""
    for device in record.devices.values():
        meta = device.metadata
        if all(meta.get(k) for k in ("namespace", "pod", "container", POD_UID)):
            return {
                "namespace": meta["namespace"],
                "pod": meta["pod"],
                POD_UID: meta[POD_UID],
                "container": meta["container"],
                "containerId": record.container_id or record.key,
            }
    return None
