"""The Tables kubectl prints: content negotiation, Kubernetes' ages, rows from objects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.node.listing import suspended_device
from hotmount.state.ledger import DeviceRecord, SuspendedGpu
from hotmount.wire.tables import human_duration, table, table_version

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
KUBECTL_ACCEPT = (  # what kubectl 1.20 to 1.35 sends with `get`
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


@pytest.mark.parametrize(
    ("accept", "version"),
    [
        (KUBECTL_ACCEPT, "v1"),
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json", "v1beta1"),
        ("application/json", None),
        (None, None),
        ("application/json;as=Table;v=v2;g=meta.k8s.io,application/json", None),
        ("application/json;as=Table;v=v1;g=example.com", None),
        ("application/yaml;as=Table;v=v1;g=meta.k8s.io", None),
        ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", None),
    ],
)
def test_table_version_follows_the_accept_header(accept: str | None, version: str | None) -> None:
    assert table_version(accept) == version


@pytest.mark.parametrize(
    ("delta", "text"),
    [  # apimachinery's duration_test.go, HumanDuration
        (timedelta(seconds=1), "1s"),
        (timedelta(seconds=70), "70s"),
        (timedelta(seconds=190), "3m10s"),
        (timedelta(minutes=5), "5m"),
        (timedelta(minutes=70), "70m"),
        (timedelta(hours=3, minutes=20), "3h20m"),
        (timedelta(hours=47), "47h"),
        (timedelta(hours=49), "2d1h"),
        (timedelta(hours=8 * 24 + 2), "8d"),
        (timedelta(days=367), "367d"),
        (timedelta(days=365 * 2 + 3), "2y3d"),
        (timedelta(days=365 * 8 + 3), "8y"),
        (timedelta(seconds=-1), "0s"),
        (timedelta(seconds=-5), "<invalid>"),
    ],
)
def test_human_duration_reads_as_kubectl_prints_ages(delta: timedelta, text: str) -> None:
    assert human_duration(delta.total_seconds()) == text


def gpumount(name: str, **device: object) -> dict[str, object]:
    mounted = (NOW - timedelta(minutes=5)).isoformat()
    return {
        "apiVersion": "hotmount.io/v1alpha1",
        "kind": "GPUMount",
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": mounted},
        "status": {
            "namespace": "ml",
            "pod": name,
            "node": "gpu-1",
            "containers": [
                {
                    "container": "main",
                    "containerId": "c0ffee",
                    "devices": [
                        {
                            "key": "GPU-8c1f2e3a-0000",
                            "kind": "gpu",
                            "index": 0,
                            "uuid": "GPU-8c1f2e3a-0000",
                            "paths": ["/dev/nvidia0"],
                            **device,
                        }
                    ],
                }
            ],
        },
    }


def test_a_gpumount_row_names_its_gpus_idle_time_and_what_keeps_it_booked() -> None:
    doc = table(
        "GPUMount",
        [gpumount("nb", idleSeconds=720, idleTimeout="30m", holder="hotmount-holder-x")],
        "v1",
        now=NOW,
    )
    assert doc["kind"] == "Table" and doc["apiVersion"] == "meta.k8s.io/v1"
    names = [c["name"] for c in doc["columnDefinitions"] if c["priority"] == 0]
    assert names == ["Name", "Container", "GPUs", "Idle", "Shared", "Pin or holder", "Queue",
                     "Age"]  # fmt: skip
    (row,) = doc["rows"]
    assert row["cells"][:8] == ["nb", "main", "0 (8c1f2e3a)", "12m/30m", "-",
                                "holder hotmount-holder-x", "-", "5m"]  # fmt: skip
    assert row["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": gpumount("nb")["metadata"],
    }
    assert len(row["cells"]) == len(doc["columnDefinitions"])


def test_an_on_demand_pod_in_line_shows_its_place() -> None:
    waiting = gpumount("nb", state="suspended")
    waiting["status"]["queued"] = 2  # type: ignore[index]
    (row,) = table("GPUMount", [waiting], "v1", now=NOW)["rows"]
    assert row["cells"][2] == "0 (8c1f2e3a) suspended" and row["cells"][6] == "2 in line"


def test_include_object_none_or_object() -> None:
    obj = gpumount("nb", pin="hotmount-pin-nb-1", idleSeconds=0)
    (bare,) = table("GPUMount", [obj], "v1beta1", "None", now=NOW)["rows"]
    assert bare["object"] is None and bare["cells"][3:6] == [
        "busy/never",
        "-",
        "pin hotmount-pin-nb-1",
    ]
    (full,) = table("GPUMount", [obj], "v1", "Object", now=NOW)["rows"]
    assert full["object"] == obj


def test_nodedevices_has_a_row_per_device_with_every_holder() -> None:
    node = {
        "metadata": {"name": "gpu-1"},  # no creationTimestamp: kubectl's own <unknown>
        "status": {
            "node": "gpu-1",
            "devices": [
                {"key": "GPU-a", "kind": "gpu", "index": 0, "uuid": "GPU-a", "nodes": [],
                 "management": "dra",
                 "holders": [{"source": "kubelet", "namespace": "ml", "pod": "a",
                              "container": "main"},
                             {"source": "hotmount", "namespace": "ml", "pod": "b",
                              "pin": "hotmount-pin-b-1"}]},
                {"key": "mlx5_0", "kind": "rdma", "nodes": [], "holders": []},
            ],
        },
    }  # fmt: skip
    rows = [r["cells"][:6] for r in table("NodeDevices", [node], "v1", now=NOW)["rows"]]
    assert rows == [
        ["gpu-1", "0", "GPU-a", "ml/a (main) [kubelet], ml/b [hotmount, pin hotmount-pin-b-1]",
         "DRA", "<unknown>"],
        ["gpu-1", "mlx5_0", "-", "<free>", "-", "<unknown>"],
    ]  # fmt: skip


def test_a_suspended_gpu_says_so() -> None:
    """A GPU a suspension took: its row says suspended, in GPUs and in -o wide's State;
    the device is what the agent's listing makes of the ledger's entry (its index too)."""
    record = DeviceRecord(key="GPU-8c1f2e3a-0000", kind="gpu", node_paths=["/dev/nvidia0"],
                          mounted_at="2026-11-24T11:55:00Z")  # fmt: skip
    entry = SuspendedGpu(device=record, uuid=record.key, suspended_at="2026-11-24T11:58:00Z")
    obj = gpumount("nb")
    obj["status"]["containers"][0]["devices"] = [
        suspended_device(entry, 0).model_dump(mode="json", by_alias=True, exclude_none=True)
    ]
    doc = table("GPUMount", [obj], "v1", "None", now=NOW)
    names = [c["name"] for c in doc["columnDefinitions"]]
    (row,) = doc["rows"]
    cells = dict(zip(names, row["cells"], strict=True))
    assert cells["GPUs"] == "0 (8c1f2e3a) suspended"
    assert cells["State"] == "suspended" and cells["Paths"] == "-"
    (mounted,) = table("GPUMount", [gpumount("nb")], "v1", "None", now=NOW)["rows"]
    assert dict(zip(names, mounted["cells"], strict=True))["State"] == "mounted"
