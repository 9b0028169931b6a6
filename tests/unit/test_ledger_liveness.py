"""Reconcile must never forget a live container, nor free a device a mount is claiming.

On a fixture host tree: a container whose cgroup lists a process that exits while
the container is being resolved (an exec probe, `kubectl exec`), and a mount on
another container that lands while reconcile sweeps stale claims.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.state.claims import Claim
from hotmount.state.ledger import ContainerRecord, PendingOp
from tests.unit.hosttree import BY_INDEX, build_host, write

CID = "4f2b8c0e9d1a3b5c7e9f0a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d"
GPU = BY_INDEX[0].uuid
INIT, GONE = 4100, 37  # the exec'd process got a lower PID after a wrap-around
START_TIME = 777


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    host = build_host(tmp_path / "host", mig=False)
    cgroup = f"/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope"
    write(host, f"/sys/fs/cgroup{cgroup}/cgroup.procs", f"{GONE}\n{INIT}\n")
    write(host, f"/proc/{INIT}/cgroup", f"0::{cgroup}\n")
    write(host, f"/proc/{INIT}/status", f"Name:\tpause\nNSpid:\t{INIT}\t1\n")
    stat_fields = ["S", *["0"] * 18, str(START_TIME)]
    write(host, f"/proc/{INIT}/stat", f"{INIT} (pause) {' '.join(stat_fields)}\n")
    for pid, ns in ((1, "mnt:[4026531841]"), (INIT, "mnt:[4026532999]")):
        (host / f"proc/{pid}/ns").mkdir(parents=True, exist_ok=True)
        os.symlink(ns, host / f"proc/{pid}/ns/mnt")
    config = EngineConfig(host_root=host, cdi_dirs=(), state_dir=tmp_path / "state", use_nvml=False)
    return Engine(config)


def test_a_process_exiting_mid_resolve_does_not_hide_the_container(engine: Engine) -> None:
    container = engine.resolve(CID)
    assert (container.id, container.init_pid) == (CID, INIT)


def test_reconcile_keeps_the_record_of_a_live_container(engine: Engine) -> None:
    record = ContainerRecord(
        key=CID, container_id=CID, init_pid=INIT, init_start_time=START_TIME,
        v1_dir=None, v2_dir=None,
        pending=PendingOp(op="mount", devices=[GPU], nodes=[]),
    )  # fmt: skip
    engine.ledger.save(record)
    engine.ledger.add_claims([gpu_claim(engine)])
    report = engine.reconcile()
    assert report.forgotten == []
    assert engine.ledger.load(CID) is not None


def test_reconcile_leaves_the_claim_of_a_mount_that_lands_meanwhile(engine: Engine) -> None:
    ledger = engine.ledger
    sweep = ledger.claims
    landed = []

    def mount_lands_now() -> list[Claim]:
        # Another thread mounts into CID between reconcile's look at the records and
        # its sweep of the claims: the record goes on disk first, then the claim.
        if landed:
            return sweep()
        landed.append(True)
        ledger.save(
            ContainerRecord(
                key=CID, container_id=CID, init_pid=INIT, init_start_time=START_TIME,
                v1_dir=None, v2_dir=None,
                pending=PendingOp(op="mount", devices=[GPU], nodes=[]),
            )
        )  # fmt: skip
        ledger.add_claims([gpu_claim(engine)])
        return sweep()

    ledger.claims = mount_lands_now  # type: ignore[method-assign]
    engine.reconcile()
    assert [(c.owner, c.device) for c in sweep()] == [(CID, GPU)]


def gpu_claim(engine: Engine) -> Claim:
    device = engine.inventory.get(GPU)
    assert device is not None
    return Claim(CID, GPU, CID, engine.inventory.footprint(device))
