"""Flow 24: `nvidia.com/gpu` on the node is NVIDIA's own device plugin (k8s-device-plugin,
tests/k8s/deviceplugin/nvidia.py) on the fake NVML, and it chooses an ordinary pod's GPU.

What the books flows (3, 11, 12) rely on, seen from a pod: the GPU the kubelet's books
give it (PodResources) is the one NVIDIA's plugin hands the container, by UUID
(`NVIDIA_VISIBLE_DEVICES`, the envvar strategy) and by device node (`/dev/nvidia<minor>`,
pass-device-specs); the other GPU is not in the container at all.
"""

from __future__ import annotations

import pytest

from tests.k8s import flows
from tests.k8s.deviceplugin import nvidia
from tests.k8s.flows import ABSENT, GRANTED, NVML_GPUS
from tests.k8s.node.cluster import Node

MINOR = {gpu.uuid: gpu.minor for gpu in NVML_GPUS}


def test_an_ordinary_gpu_pod_gets_the_gpu_of_its_books_from_nvidias_plugin(
    node: Node, hotmount: flows.Release
) -> None:
    if not nvidia.selected():
        pytest.skip(f"{nvidia.CHOICE_ENV}=fake: the fake plugin hands out no devices")
    plugin = hotmount.gpus.plugin
    assert isinstance(plugin, nvidia.NvidiaDevicePlugin) and plugin.running(), plugin

    name = flows.new_name("ordinary")
    node.apply(flows.gpu_pod_manifest(name, 1))
    try:
        (uuid,) = flows.given_to(node, name)
        visible = node.kubectl("exec", name, "--", "sh", "-c", 'echo "$NVIDIA_VISIBLE_DEVICES"')
        assert visible.stdout.strip() == uuid, visible.stdout
        (other,) = [gpu.uuid for gpu in NVML_GPUS if gpu.uuid != uuid]
        assert flows.device_state(node, name, MINOR[uuid]) == GRANTED
        assert flows.device_state(node, name, MINOR[other]) == ABSENT
    finally:
        flows.delete_pod(node, name)
    assert "Registered device plugin for 'nvidia.com/gpu'" in plugin.log_tail(20000)
