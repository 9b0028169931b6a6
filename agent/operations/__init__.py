"""The operation table: every operation on a pod, one row each, and the routes both API
faces get from it (/v1, and the aggregated `hotmount.io/v1alpha1`).

A row (table.py `Operation`) names the operation's verb on the pod, its request and
result models, the use case it runs, the aggregated kind, its metric, and each face's
spelling (`Face`: path, parameters, how they read, what a forward sends, how the answer
is written). Adding an operation is one row here. Before any handler runs, the route's
dependency authorizes the caller, looks the pod up once and either forwards the call to
the pod's node or hands the pod to the use case (placement.py).
"""

from __future__ import annotations

from fastapi import APIRouter

from agent.aggregated.objects import PREFIX
from agent.operations import mounts, ondemand, reassign, suspends
from agent.operations.table import Operation, register

OPERATIONS: tuple[Operation, ...] = (
    mounts.GET,
    mounts.MOUNT,
    mounts.UNMOUNT,
    suspends.SUSPEND,
    suspends.RESUME,
    suspends.SUSPEND_PROGRESS,
    suspends.RESUME_PROGRESS,
    ondemand.ACQUIRE,
    ondemand.RELEASE,
    reassign.REASSIGN,
    mounts.APPLY,
)


def routers() -> tuple[APIRouter, APIRouter]:
    """The /v1 routes and the aggregated API's, made from the table."""
    v1 = APIRouter(prefix="/v1", tags=["pods"])
    aggregated = APIRouter(prefix=PREFIX, tags=["aggregated"])
    register(v1, aggregated, OPERATIONS)
    return v1, aggregated
