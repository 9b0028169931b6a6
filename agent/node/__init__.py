"""The node: pods to containers, the kubelet's books, holder pods, then the engine.

One module per use case here (mounting, moves, listing, the reconcile pass), and beside
it the sub-systems they use: agent/common/ (container locks, targets, results),
agent/books/ (the kubelet's books, pins, holder pods), agent/idle/ and agent/suspend/.
Each part is given what it uses in its constructor. `Node.build` wires them; the routes
reach the use case they serve through agent/http/deps.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.books.accounting import Accounting
from agent.books.double_booking import DoubleBookings
from agent.books.gpu_states import GpuStates
from agent.books.holders import HolderPods
from agent.books.kubelet import KubeletBooks
from agent.books.pins import Pins
from agent.books.plugin_pins import PluginPins
from agent.common.background import Background
from agent.common.intents import Intents
from agent.common.locks import ContainerLocks
from agent.common.targets import Targets
from agent.config import AgentSettings
from agent.idle.reclaim import IdleReclaim
from agent.kube.client import KubeClient
from agent.kube.dra import ResourceApi
from agent.metrics import Metrics
from agent.node.desired import DesiredMounts
from agent.node.listing import Listing
from agent.node.mounting import Mounting
from agent.node.moves import Moves
from agent.node.reconcile import ReconcilePass
from agent.node.remounts import Remounts
from agent.ondemand.arbiter import Arbiter
from agent.ondemand.handover import HandOver
from agent.podresources import PodResourcesClient
from agent.suspend.suspending import Suspending
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
    ondemand: Arbiter

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
        intents = Intents(settings.state_dir)
        holders = HolderPods(settings, engine, kube, locks, intents, resources)
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
        suspending = Suspending(engine, kube, metrics, locks, targets, kubelet, holders, pins)
        handover = HandOver(engine, metrics.on_demand, mounting, suspending)
        ondemand = Arbiter(settings, engine, metrics.on_demand, targets, handover)
        listing = Listing(
            settings, engine, kube, targets, kubelet, accounting, idle_reclaim, ondemand.queued
        )
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
            suspending=suspending,
            ondemand=ondemand,
            reconciler=ReconcilePass(
                engine,
                metrics,
                holders,
                DoubleBookings(settings, engine, kube, metrics, locks, kubelet, holders),
                idle_reclaim,
                Remounts(engine, kube, locks, intents),
                desired,
                kube,
                locks,
                background,
            ),
        )
