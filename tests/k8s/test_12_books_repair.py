"""Flow 12: when the scheduler's books go wrong anyway, it is found and never silent; an
agent restart keeps them right (docs/api.md, "Accounting").

Double booking: the kubelet gives a hot-mounted GPU to another pod (its pin was
deleted while the agent was down, or the mount was forced past the books). Reconcile
(every 5 s here) puts a Warning Event `GPUDoubleBooked` on both pods and, by default
(`onDoubleBooking: take-back`), takes the GPU back from the hot-mount, since the
scheduler promised it to the other pod.
"""

from __future__ import annotations

from tests.k8s import flows
from tests.k8s.flows import (
    ABSENT,
    DENIED,
    EXIT_CONFLICT,
    GRANTED,
    NAMESPACE,
    NVML_GPUS,
    RECONCILE_INTERVAL,
)
from tests.k8s.node.cluster import Node

GPU0, GPU1 = NVML_GPUS[0].uuid, NVML_GPUS[1].uuid
DOUBLE_BOOKED = "GPUDoubleBooked"
# A few reconciles, plus an nvcli call and the Event's own way to the API server.
FEW_RECONCILES = 3 * RECONCILE_INTERVAL + 10


def double_booking_found(node: Node, mounted_in: str, given_to: str) -> None:
    """Warning Events on both pods, and the hot-mount taken back from `mounted_in`."""

    def reported() -> list[dict[str, object]] | None:
        on_both = [flows.events(node, pod, DOUBLE_BOOKED) for pod in (mounted_in, given_to)]
        return on_both if all(on_both) else None

    try:
        on_mounted, on_given = flows.wait_for("GPUDoubleBooked on both pods", reported,
                                              FEW_RECONCILES)  # fmt: skip
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_agent_log(node)}") from None
    for event in (*on_mounted, *on_given):
        assert event["type"] == "Warning", event
    assert given_to in str(on_mounted[-1]["message"]), on_mounted[-1]
    assert mounted_in in str(on_given[-1]["message"]), on_given[-1]
    flows.wait_for(
        "the GPU is taken back from the hot-mount",
        lambda: flows.mounted_uuids(node, "alice", mounted_in) == [],
        FEW_RECONCILES,
    )
    assert flows.device_state(node, mounted_in) in (ABSENT, DENIED)


def _agent_log(node: Node) -> str:
    logs = node.kubectl("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=gpu-hotmount",
                        "--tail=40", check=False)  # fmt: skip
    return f"$ kubectl logs (agent)\n{logs.stdout}{logs.stderr}"[-6000:]


def test_a_pin_deleted_while_the_agent_is_down_is_found_double_booked_and_taken_back(
    node: Node, hotmount: flows.Release
) -> None:
    a, wide = flows.new_name("pinned"), flows.new_name("wide")
    with flows.running_pod(node, flows.quick_pod_manifest(a)) as pod:
        flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "0")
        pin = flows.the_pin(node, pod)["metadata"]["name"]
        try:
            # The agent held still (as if down) from the pin's deletion until the kubelet
            # has given GPU 0 away: a reconcile in between would find the pin gone and no
            # other pod on the GPU, and take it back as unheld (docs/api.md, no Event).
            with flows.agent_frozen(node, hotmount):
                node.kubectl("delete", "pod", pin, "--wait=true")
                node.apply(flows.gpu_pod_manifest(wide, 2))
                assert flows.given_to(node, wide) == (GPU0, GPU1)
            double_booking_found(node, pod, wide)
        finally:
            flows.delete_pod(node, wide)
            flows.nvcli(node, "alice", "unmount", "--name", pod, "--all")


def test_a_forced_mount_past_the_books_is_reported_as_double_booked_and_taken_back(
    node: Node, hotmount: flows.Release
) -> None:
    a, ordinary = flows.new_name("forced"), flows.new_name("ordinary")
    with flows.running_pod(node, flows.quick_pod_manifest(a)) as pod:
        node.apply(flows.gpu_pod_manifest(ordinary, 2))
        try:
            assert flows.given_to(node, ordinary) == (GPU0, GPU1)
            # Without force the books refuse: GPU 0 is the kubelet's for the other pod.
            refused = flows.nvcli(node, "alice", "mount", "--name", pod, "--mount", "0")
            assert refused.returncode == EXIT_CONFLICT, (refused.returncode, refused.stderr)
            assert f"kubelet allocated to running pod default/{ordinary}" in refused.stderr, (
                refused.stderr
            )
            assert flows.mounted_uuids(node, "alice", pod) == []
            forced = flows.nvcli(node, "admin", "mount", "--name", pod, "--mount", "0", "--force")
            assert forced.returncode == 0, forced.stderr
            assert flows.pins(node, pod) == [], "a forced mount cannot be pinned"
            double_booking_found(node, pod, ordinary)
        finally:
            flows.delete_pod(node, ordinary)
            flows.nvcli(node, "admin", "unmount", "--name", pod, "--all", "--force")


def test_an_agent_restart_keeps_the_pin_and_unmount_then_deletes_it(
    node: Node, hotmount: flows.Release
) -> None:
    name = flows.new_name("pinned")
    with flows.running_pod(node, flows.quick_pod_manifest(name)) as pod:
        flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "0")
        pin = flows.the_pin(node, pod)["metadata"]

        before = hotmount.agent_pod()
        assert before is not None
        node.kubectl("delete", "pod", before, "-n", NAMESPACE, "--wait=true")
        flows.wait_for(
            "a new agent pod is Ready", lambda: hotmount.agent_pod() not in (None, before), 180
        )
        hotmount.wait_available()
        # A whole reconcile of the new agent: one that did not know the pin (its uid in
        # the ledger) would take the GPU back as unheld.
        hotmount.wait_reconciles(2, "a whole reconcile pass of the new agent")

        now = flows.the_pin(node, pod)["metadata"]
        assert (now["name"], now["uid"]) == (pin["name"], pin["uid"]), "not the same pin"
        assert flows.status_pins(node, "alice", pod) == {GPU0: pin["name"]}
        listed = flows.nvcli(node, "admin", "list")
        assert f"default/{pod} (main) [hotmount, pin {pin['name']}]" in listed.stdout, listed
        assert flows.device_state(node, pod) == GRANTED
        assert flows.ordinary_gpu_pod(node) == (GPU1,)

        flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--unmount", "0")
        assert flows.pins(node, pod) == [], "unmount returned with the pin still there"
        assert flows.mounted_uuids(node, "alice", pod) == []
