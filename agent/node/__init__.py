"""The node: pods to containers, the kubelet's books, holder pods, then the engine.

One module per use case (mounting, moves, listing, the reconcile pass) and the parts
they share (container locks, targets, the kubelet's books, holder pods, idle reclaim),
each given what it uses in its constructor. `Node.build` wires them; the routes reach
the use case they serve through agent/deps.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.config import AgentSettings
from agent.kube.client import KubeClient
from agent.kube.dra import ResourceApi
from agent.metrics import Metrics
from agent.node.accounting import Accounting
from agent.node.background import Background
from agent.node.desired import DesiredMounts
from agent.node.double_booking import DoubleBookings
from agent.node.gpu_states import GpuStates
from agent.node.holders import HolderPods
from agent.node.idle_reclaim import IdleReclaim
from agent.node.kubelet import KubeletBooks
from agent.node.listing import Listing
from agent.node.locks import ContainerLocks
from agent.node.mounting import Mounting
from agent.node.moves import Moves
from agent.node.pins import Pins
from agent.node.plugin_pins import PluginPins
from agent.node.reconcile import ReconcilePass
from agent.node.remounts import Remounts
from agent.node.suspending import Suspending
from agent.node.targets import Targets
from agent.podresources import PodResourcesClient
from hotmount.api import Engine


@dataclass(frozen=True)
class Node:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    metrics: Metrics
    mounting: Mounting
    moves: Moves
    listing: Listing
    reconciler: ReconcilePass
    suspending: Suspending

    @classmethod
    def build(
        cls,
        settings: AgentSettings,
        engine: Engine,
        kube: KubeClient | None,
        podresources: PodResourcesClient | None,
        metrics: Metrics,
    ) -> Node:
        locks = ContainerLocks()
        targets = Targets(settings, kube)
        resources = ResourceApi(kube.api) if kube is not None else None
        holders = HolderPods(settings, engine, kube, locks, resources)
        kubelet = KubeletBooks(settings, engine, kube, podresources, resources)
        accounting = Accounting(settings, engine, kube, podresources, resources)
        plugin_pins = PluginPins(settings, engine, kube, kubelet, holders)
        pins = Pins(settings, engine, kube, kubelet, holders, accounting, resources, plugin_pins)
        background = Background()  # minutes-long work on a container, beside reconcile
        idle_reclaim = IdleReclaim(settings, engine, kube, metrics, locks, holders, background)
        desired = DesiredMounts(settings.state_dir)
        mounting = Mounting(
            engine, kube, metrics, locks, targets, kubelet, holders, pins, idle_reclaim, desired
        )
        listing = Listing(settings, engine, kube, targets, kubelet, accounting, idle_reclaim)
        metrics.watch_mounts(settings.node_name or "", listing.mount_samples)
        metrics.watch_gpu_states(settings.node_name or "", GpuStates(engine, kubelet).counts)
        return cls(
            settings=settings,
            engine=engine,
            kube=kube,
            metrics=metrics,
            mounting=mounting,
            moves=Moves(engine, kube, metrics, locks, targets, mounting),
            listing=listing,
            suspending=Suspending(engine, kube, metrics, locks, targets, kubelet, holders, pins),
            reconciler=ReconcilePass(
                engine,
                metrics,
                holders,
                DoubleBookings(settings, engine, kube, metrics, locks, kubelet, holders),
                idle_reclaim,
                Remounts(engine, kube, locks),
                desired,
                kube,
                locks,
                background,
            ),
        )
