"""Flow 10: `%gpu attach` in IPython inside a notebook pod, through the agents' Service.

The pod (tests/k8s/notebook.py) is configured as docs/notebooks.md says a platform
configures it, and nothing else: the magic finds the token, the namespace, its own pod
name and the Service by itself.
"""

from __future__ import annotations

from tests.k8s import flows
from tests.k8s.flows import ABSENT, GRANTED
from tests.k8s.node.cluster import Node
from tests.k8s.notebook import ipython, notebook_pod


def test_gpu_attach_in_a_notebook_pod_mounts_with_the_pods_own_token(
    node: Node, hotmount: flows.Release, notebook_image: str
) -> None:
    with notebook_pod(node, hotmount, notebook_image) as me:
        assert flows.device_state(node, me) == ABSENT

        said = ipython(node, me, "%load_ext cli.notebook", "%gpu attach 0 --idle 1h")

        assert f"attached GPU 0 ({flows.NVML_GPUS[0].uuid}) to default/{me} (main)" in said
        assert "given back after 1h unused" in said and "Traceback" not in said
        assert flows.device_state(node, me) == GRANTED

        said = ipython(node, me, "%load_ext cli.notebook", "%gpu status", "%gpu detach")

        assert f"GPU 0 ({flows.NVML_GPUS[0].uuid}) in main:" in said, said
        assert f"detached {flows.NVML_GPUS[0].uuid}" in said, said
        assert flows.device_state(node, me) == ABSENT
