"""Flow 26 (issue 33): an idle notebook's GPU is suspended, used by another pod, and given
back by the notebook's next cell, with the kernel's Python state and GPU memory intact.
And (issue 42) three on-demand notebooks share the node's two GPUs; and a real Prometheus
(tests/k8s/prometheus.py), scraping the agent all along as the chart's ServiceMonitor
says, draws every panel of the chart's dashboard and fires, then resolves, the chart's
HotmountOnDemandQueueNotDraining and HotmountAgentDown (the last test).

The notebook pod runs a kernel (tests/k8s/notebook.py's `Kernel`) with the pod annotated
`hotmount.io/idle-policy: suspend`, as a user would: `%load_ext cli.notebook`, `%gpu
attach 0 --idle 10s`, then a cell that starts a CUDA program (the stand-in CUDA process,
tests/fakes/driver/cuda_process.c, in the notebook image) holding a known pattern in
its "GPU memory", and keeps some Python state. The GPU is busy in NVML's activity
while that is set up; then the notebook goes quiet: the agent warns (`GPUIdleSoon`),
suspends (`GPUSuspended`: the process checkpointed, the GPU unmounted, its pin
deleted), and `kubectl get gpumounts` shows the mount suspended. Another pod then gets
that GPU mounted by name (the kubelet gives its pin that GPU: the books freed it),
opens it, and lets it go. The notebook's next cell resumes first (the `pre_run_cell`
hook) and finds its variables and the process's pattern intact on a GPU again, and
that GPU pinned again (the kubelet gives the new pin the resumed GPU).

The agent has the stand-in driver as a node has its own: the driver root
(tests/fakes/driver: libcuda.so.1 with the checkpoint calls) in a host directory it
reads through the host's / at /host, as flow 18 sets it up; the fake NVML reports the
process's host PID on GPU 0 (and, as the real one, not while it is checkpointed:
FAKE_CUDA_STATE_DIR, in the agent's pod). There is no driver behind the GPU nodes
(195:<minor>): the process holds them by O_PATH once the cgroup lets them open.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fakes import driver, nvml
from tests.fakes.nvml import FakeActivity, FakeGpu
from tests.k8s import flows
from tests.k8s import prometheus as prom
from tests.k8s.conftest import TIMINGS
from tests.k8s.flows import ABSENT, EXIT_CONFLICT, GRANTED, NVML_ACTIVITY, NVML_GPUS
from tests.k8s.node.cluster import NODE_NAME, Node
from tests.k8s.notebook import Kernel, notebook_pod

pytestmark = pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in driver")

GPU0 = NVML_GPUS[0].uuid
STATE_DIR = "/run/fake-cuda"  # in the agent's pod: the stand-in driver's checkpointed PIDs
STATUS = "/tmp/gpu.status"  # in the notebook pod: where the CUDA process says how it is
START = f"""
import subprocess
gpus = []
for i, uuid in enumerate({[g.uuid for g in NVML_GPUS]!r}):
    gpus += ["--gpu", f"{{uuid}}=/dev/nvidia{{i}}"]
program = subprocess.Popen(
    ["cuda_process", *gpus, "--ctl", "/dev/nvidiactl", "--status", "{STATUS}"],
    stdout=subprocess.PIPE, cwd="/",
)
print(program.stdout.readline().decode().strip())
tensors = {{"weights": [1.5, 2.5], "step": 42}}
"""
NEXT = f"print('state', tensors['step'], sum(tensors['weights'])); print(open('{STATUS}').read())"


@pytest.fixture(scope="module")
def standin_driver(
    hotmount: flows.Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[flows.Release]:
    """The release with the stand-in driver root; the chart's defaults after."""
    root = driver.build_root(tmp_path_factory.mktemp("cuda-driver"))
    hotmount.set_driver_and_extras(
        {"hostRoot": "/host", "hostRootPropagation": "None", "root": str(root), "inject": "never"},
        {
            "extraVolumes": [{"name": "fake-cuda-state", "emptyDir": {}}],
            "extraVolumeMounts": [{"name": "fake-cuda-state", "mountPath": STATE_DIR}],
            "extraEnv": [{"name": "FAKE_CUDA_STATE_DIR", "value": STATE_DIR}],
        },
    )
    try:
        yield hotmount
    finally:
        hotmount.set_driver_and_extras({}, {})


@pytest.fixture(scope="module", autouse=True)
def prometheus(node: Node, standin_driver: flows.Release) -> Iterator[prom.Prometheus | None]:
    """A real Prometheus scraping the agent through this module's flows (the last test
    reads it); None where Debian's `prometheus` is missing (that test then skips, or
    fails under CI). The chart's monitoring goes off again with standin_driver's own
    upgrade, right after this."""
    if prom.PROMETHEUS is None and not os.environ.get("CI"):
        yield None
        return
    try:
        begun = time.monotonic()
        started = prom.start(node, standin_driver)
        TIMINGS["prometheus start (flow 26)"] = time.monotonic() - begun
        try:
            yield started
        finally:
            begun = time.monotonic()
            started.stop()
            TIMINGS["prometheus stop"] = time.monotonic() - begun
    finally:
        standin_driver.monitoring = {}


def _nvml_shows(release: flows.Release, pids_on_gpu0: tuple[int, ...]) -> None:
    """The fake NVML's GPUs, with these processes on GPU 0 (replaced in one rename)."""
    config = release.gpus.nvml_dir / release.nvml_config
    gpus = [FakeGpu(NVML_GPUS[0].uuid, NVML_GPUS[0].bus_id, NVML_GPUS[0].minor, pids_on_gpu0),
            *NVML_GPUS[1:]]  # fmt: skip
    nvml.write_config(config.with_name(config.name + ".new"), gpus).replace(config)


def _host_pids(node: Node, pod: str, command: str) -> list[int]:
    """Host PIDs of the pod's processes running `command` (by the pod's cgroup)."""
    found = flows.get_pod(node, pod)
    assert found is not None
    uid = found["metadata"]["uid"]
    marks = (uid, uid.replace("-", "_"))
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc / "comm").read_text().strip() != command:
                continue
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if any(mark in cgroup for mark in marks):
            pids.append(int(proc.name))
    return pids


def _gpumount(node: Node, pod: str) -> dict[str, str]:
    (row,) = [r for r in flows.kubectl_table(node, "alice", "gpumounts", "-o", "wide")
              if r["NAME"] == pod]  # fmt: skip
    return row


def _live_pins(node: Node, pod: str) -> list[str]:
    return [p["metadata"]["name"] for p in flows.pins(node, pod)
            if not p["metadata"].get("deletionTimestamp")]  # fmt: skip


def test_an_idle_notebook_is_suspended_its_gpu_lent_and_its_next_cell_resumes_it(
    node: Node, standin_driver: flows.Release, notebook_image: str
) -> None:
    release = standin_driver
    activity = release.gpus.nvml_dir / NVML_ACTIVITY
    nvml.write_activity(activity, [FakeActivity(GPU0, gpu=60, memory=20)])  # busy, set-up
    annotations = {"hotmount.io/idle-policy": "suspend"}
    try:
        with notebook_pod(
            node, release, notebook_image, kernel=True, annotations=annotations
        ) as notebook:
            kernel = Kernel(node, notebook)
            said = kernel.run("%load_ext cli.notebook")
            said += kernel.run("%gpu attach 0 --idle 10s")
            assert f"attached GPU 0 ({GPU0}) to default/{notebook} (main)" in said, said
            said = kernel.run(START)
            assert "READY" in said and "Traceback" not in said, said
            [pid] = _host_pids(node, notebook, "cuda_process")
            _nvml_shows(release, (pid,))
            [pin] = _live_pins(node, notebook)

            nvml.write_activity(activity, [])  # the notebook's user went for lunch
            flows.wait_for(
                "GPUSuspended",
                lambda: flows.events(node, notebook, "GPUSuspended"),
                90,
                every=1,
            )

            [soon] = flows.events(node, notebook, "GPUIdleSoon")
            [suspended] = flows.events(node, notebook, "GPUSuspended")
            assert soon["type"] == "Warning", soon
            assert soon["firstTimestamp"] <= suspended["firstTimestamp"], (soon, suspended)
            assert "1 processes kept, 512 MiB of GPU memory in host memory" in str(
                suspended["message"]
            ), suspended
            row = _gpumount(node, notebook)
            assert row["GPUS"] == f"0 ({GPU0.removeprefix('GPU-')[:8]}) suspended", row
            assert row["STATE"] == "suspended", row
            status = node.kubectl("exec", notebook, "--", "cat", STATUS).stdout
            assert status.strip() == "checkpointed - pattern=ok", status
            assert flows.device_state(node, notebook) == ABSENT
            assert _live_pins(node, notebook) == [], pin

            other = flows.new_name("borrower")
            with flows.running_pod(node, flows.quick_pod_manifest(other)):
                flows.nvcli_ok(node, "alice", "mount", "--name", other, "--mount", "0")
                assert flows.device_state(node, other) == GRANTED
                [lent] = _live_pins(node, other)
                assert flows.given_to(node, lent) == (GPU0,)
                flows.nvcli_ok(node, "alice", "unmount", "--name", other, "--all")

            # the cell's own GPU work: its resumed GPU stays busy while it is looked at
            nvml.write_activity(activity, [FakeActivity(g.uuid, gpu=60) for g in NVML_GPUS])
            said = kernel.run(NEXT)

            assert "%gpu: resumed" in said and "1 processes restored" in said, said
            assert "state 42 4.0" in said, said
            found = re.search(r"running /dev/nvidia(\d) pattern=ok", said)
            assert found, said
            onto = int(found.group(1))
            assert (onto == 0) == (f"onto {NVML_GPUS[1].uuid}" not in said), said
            assert flows.device_state(node, notebook, onto) == GRANTED
            assert flows.events(node, notebook, "GPUResumed")
            assert _gpumount(node, notebook)["STATE"] == "mounted"
            # the resumed GPU is in the books again: a pin the kubelet gave that GPU
            [repinned] = _live_pins(node, notebook)
            [resumed_gpu] = [g.uuid for g in NVML_GPUS if g.minor == onto]
            assert flows.given_to(node, repinned) == (resumed_gpu,)
    finally:
        activity.unlink(missing_ok=True)
        _nvml_shows(release, ())


ON_DEMAND = {"hotmount.io/gpu-on-demand": "1", "hotmount.io/gpu-on-demand-idle": "1h"}
# The CUDA program on whichever GPU the cell was given (the first --gpu is the one it opens).
START_HERE = f"""
import os, subprocess
uuids = {[g.uuid for g in NVML_GPUS]!r}
mine = [i for i in range(len(uuids)) if os.path.exists(f"/dev/nvidia{{i}}")]
gpus = []
for i in mine + [i for i in range(len(uuids)) if i not in mine]:
    gpus += ["--gpu", f"{{uuids[i]}}=/dev/nvidia{{i}}"]
program = subprocess.Popen(
    ["cuda_process", *gpus, "--ctl", "/dev/nvidiactl", "--status", "{STATUS}"],
    stdout=subprocess.PIPE, cwd="/",
)
print(program.stdout.readline().decode().strip(), "on", mine)
tensors = {{"weights": [1.5, 2.5], "step": 42}}
"""


def _books_match(node: Node, attached: dict[str, int]) -> None:
    """Each pod of `attached` holds its GPU (by index) granted, with one live pin the
    kubelet gave that GPU; one given -1 holds no pin (suspended, or none yet)."""
    for pod, index in attached.items():
        if index < 0:
            assert _live_pins(node, pod) == [], pod
            continue
        assert flows.device_state(node, pod, index) == GRANTED, pod
        [pin] = _live_pins(node, pod)
        assert flows.given_to(node, pin) == (NVML_GPUS[index].uuid,), (pod, pin)


def _gpu_of(said: str) -> int:
    found = re.search(r"READY.* on \[(\d)\]", said) or re.search(
        r"/dev/nvidia(\d) pattern=ok", said
    )
    assert found, said
    return int(found.group(1))


def test_three_on_demand_notebooks_share_two_gpus(
    node: Node, standin_driver: flows.Release, notebook_image: str
) -> None:
    """Each notebook holds a GPU only while its cells run. Two start on the two GPUs; two
    long cells keep both busy while the third notebook's cell waits in line
    (`waiting for a GPU: 1st in line`), then gets the GPU of the first long cell to end;
    each suspended notebook's next cell takes the GPU of the one idle longest and resumes
    onto it (onto another GPU than its own, for the third), its Python state and CUDA
    memory pattern intact; at every step the kubelet's books (the pins) match who holds
    which GPU. While the notebooks hold both GPUs an ordinary GPU pod is unschedulable;
    once they are gone, an ordinary pod and a mount by count each get a GPU."""
    release = standin_driver
    env = {"GPU_HOTMOUNT_ON_DEMAND": "1"}
    pods: list[str] = []
    kernels: list[Kernel] = []
    with (
        notebook_pod(node, release, notebook_image, kernel=True, annotations=ON_DEMAND,
                     env=env) as first,
        notebook_pod(node, release, notebook_image, kernel=True, annotations=ON_DEMAND,
                     env=env) as second,
        notebook_pod(node, release, notebook_image, kernel=True, annotations=ON_DEMAND,
                     env=env) as third,
    ):  # fmt: skip
        pods = [first, second, third]
        kernels = [Kernel(node, pod) for pod in pods]
        for kernel in kernels:
            kernel.run("%load_ext cli.notebook")
        said = [kernels[0].run(START_HERE), kernels[1].run(START_HERE)]
        assert all("READY" in s and "Traceback" not in s for s in said), said
        on = {first: _gpu_of(said[0]), second: _gpu_of(said[1])}
        assert sorted(on.values()) == [0, 1], said
        _books_match(node, {**on, third: -1})

        # two long cells: both GPUs busy while the third notebook's cell asks (and waits
        # longer than HotmountOnDemandQueueNotDraining's window, prom.QUEUE_WINDOW)
        with ThreadPoolExecutor(2) as pool:
            short = pool.submit(kernels[0].run, "import time; time.sleep(14)")
            long = pool.submit(kernels[1].run, "import time; time.sleep(24)")
            time.sleep(3)
            said_third = kernels[2].run(START_HERE)
            short.result(), long.result()
        assert "%gpu: waiting for a GPU: 1st in line" in said_third, said_third
        assert "READY" in said_third, said_third
        on[third] = _gpu_of(said_third)
        assert on[third] == on[first], (on, said_third)  # the first long cell's GPU
        assert flows.events(node, first, "GPUSuspended")
        _books_match(node, {first: -1, second: on[second], third: on[third]})

        # the first notebook's next cell: the third has been idle longest, its GPU goes
        said_first = kernels[0].run(NEXT)
        assert "%gpu: resumed" in said_first and "state 42 4.0" in said_first, said_first
        assert _gpu_of(said_first) == on[third], said_first
        _books_match(node, {first: on[third], second: on[second], third: -1})

        # the third's: the second is idle longest now; the third resumes onto its GPU
        said_third = kernels[2].run(NEXT)
        assert "%gpu: resumed" in said_third and "state 42 4.0" in said_third, said_third
        assert " onto " in said_third and _gpu_of(said_third) == on[second], said_third
        _books_match(node, {first: on[third], second: -1, third: on[second]})

        # both GPUs pinned for the notebooks that hold them: an ordinary GPU pod waits
        blocked = flows.new_name("ordinary")
        node.apply(flows.gpu_pod_manifest(blocked, 1))
        try:
            flows.wait_unschedulable(node, blocked)
        finally:
            flows.delete_pod(node, blocked)

    # the notebooks gone, their GPUs are the node's again: an ordinary pod gets one, and a
    # mount by count the other, through its holder
    assert len(flows.ordinary_gpu_pod(node)) == 1
    counted = flows.new_name("counted")
    with flows.running_pod(node, flows.quick_pod_manifest(counted)):
        flows.nvcli_ok(node, "alice", "mount", "--name", counted, "--count", "1")
        [holder] = flows.holders_of(node, counted)
        [gpu] = flows.pod_resources()[("default", holder["metadata"]["name"])]
        assert flows.mounted_uuids(node, "alice", counted) == [gpu]
        flows.nvcli_ok(node, "alice", "unmount", "--name", counted, "--all")


QUEUE_ALERT, AGENT_DOWN = "HotmountOnDemandQueueNotDraining", "HotmountAgentDown"
# Dashboard queries that may draw nothing here, and why; each is checked otherwise below.
MAY_BE_EMPTY = {
    # no reclaim fails in these flows: Prometheus must still know the metric (its metadata)
    "hotmount_gpu_reclaim_failures_total": "metadata",
}


def test_operators_see_it_in_a_real_prometheus(
    node: Node, standin_driver: flows.Release, prometheus: prom.Prometheus | None
) -> None:
    """Prometheus found the agent through the ServiceMonitor's discovery and relabelings
    (one target: the node-local Service's endpoints dropped) and scrapes it with the
    chart's metrics-reader token. The queue alert fired while the third notebook waited
    (above) and resolved once it got a GPU. Then, with a GPU hot-mounted by name, a
    refused call, a device node removed in the pod (reconcile puts it back: a drift
    repair) and a GPU forced past the scheduler's books (double booked, taken back),
    every query of the shipped dashboard draws data, as Grafana would ask for it, but
    one (MAY_BE_EMPTY: failed reclaims, none here), checked otherwise; the double
    booking too, though it lasts about one scrape (the panel takes the most of each
    step's interval: this flow found a plain gauge query stepping past it). Last,
    the agent frozen: HotmountAgentDown fires, naming the node and the pod, and
    resolves once it is thawed."""
    if prometheus is None:
        prom.cannot("no prometheus: `apt-get install prometheus` (scripts/setup.sh does)")
    assert prometheus is not None
    release = standin_driver
    agent = release.agent_pod()
    target = prom.the_target(prometheus)
    assert target["labels"]["pod"] == agent, target

    fired = prometheus.fired_between(QUEUE_ALERT, prometheus.started, time.time())
    assert fired, f"{QUEUE_ALERT} never fired\n{prometheus.log_tail()}"
    [queue] = prometheus.query("hotmount_ondemand_queue_length", fired[0])
    assert float(queue["value"][1]) > 0, ("it fired while none waited", queue)
    assert prometheus.firing(QUEUE_ALERT) == [], "it did not resolve"
    [alert] = prometheus.query(f'last_over_time(ALERTS{{alertname="{QUEUE_ALERT}"}}[1h])')
    assert alert["metric"]["node"] == NODE_NAME and alert["metric"]["severity"] == "warning"

    activity = release.gpus.nvml_dir / NVML_ACTIVITY
    nvml.write_activity(activity, [FakeActivity(GPU0, gpu=60)])
    pod, ordinary = flows.new_name("watched"), flows.new_name("ordinary")
    manifest = flows.quick_pod_manifest(pod)
    manifest["metadata"]["annotations"] = {"hotmount.io/idle-policy": "unused",
                                           "hotmount.io/idle-timeout": "1h"}  # fmt: skip
    try:
        with flows.running_pod(node, manifest):
            flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "0")
            node.kubectl("exec", pod, "--", "rm", "/dev/nvidia0")
            _seen(prometheus, 'hotmount_drift_repairs_total{kind="node"}')
            # GPU 1 the kubelet's for an ordinary pod: refused, then forced into this one
            node.apply(flows.gpu_pod_manifest(ordinary, 1))
            assert flows.given_to(node, ordinary) == (NVML_GPUS[1].uuid,)
            refused = flows.nvcli(node, "alice", "mount", "--name", pod, "--mount", "1")
            assert refused.returncode == EXIT_CONFLICT, (refused.returncode, refused.stderr)
            forced = flows.nvcli(node, "admin", "mount", "--name", pod, "--mount", "1", "--force")
            assert forced.returncode == 0, forced.stderr
            _seen(prometheus, "hotmount_gpu_double_bookings_taken_back_total > 0")
            _seen(prometheus, "max_over_time(hotmount_gpu_double_booked[5m]) > 0")
            _seen(prometheus, "hotmount_operations_refused_total")

            def undrawn() -> list[str]:
                drawn = prom.dashboard_data(prometheus, prometheus.started, time.time())
                return [q for q, n in drawn.items() if n == 0]

            # A counter first scraped a moment ago has no rate yet (one sample in the
            # window): the panels draw it a scrape or two later.
            deadline = time.monotonic() + 30
            while (empty := undrawn()) and time.monotonic() < deadline:
                allowed = [q for q in empty if any(m in q for m in MAY_BE_EMPTY)]
                if empty == allowed:
                    break
                time.sleep(2)
            allowed = [q for q in empty if any(m in q for m in MAY_BE_EMPTY)]
            assert empty == allowed, (
                "dashboard queries without data:\n" + "\n".join(empty)
                + f"\nscrapes: {prometheus.scrape_health()}"
            )  # fmt: skip
            for metric in (m for m, how in MAY_BE_EMPTY.items() if how == "metadata"):
                assert prom.metadata(prometheus, metric), metric
            flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--all")
    finally:
        flows.delete_pod(node, ordinary)
        activity.unlink(missing_ok=True)

    with flows.agent_frozen(node, release):
        down = flows.wait_for(f"{AGENT_DOWN} fires", lambda: prometheus.firing(AGENT_DOWN), 12)
    [firing] = down
    assert (firing["labels"]["node"], firing["labels"]["pod"]) == (NODE_NAME, agent), firing
    assert NODE_NAME in firing["annotations"]["summary"], firing
    flows.wait_for(f"{AGENT_DOWN} resolves", lambda: not prometheus.firing(AGENT_DOWN), 30)
    assert [t["health"] for t in prometheus.targets()["activeTargets"]] == ["up"]


def _seen(prometheus: prom.Prometheus, expr: str) -> None:
    """Until Prometheus has scraped what makes `expr` true (a few reconciles at most)."""
    try:
        flows.wait_for(f"Prometheus sees {expr}", lambda: prometheus.query(expr), 40, every=1)
    except AssertionError as error:
        raise AssertionError(f"{error}\nscrapes: {prometheus.scrape_health()}") from None
