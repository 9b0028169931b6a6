"""A notebook pod on the real node (flows 10 and 26), and two ways to run its cells.

The pod runs the notebook image (tests/k8s/notebook_image.py), starts with
`NVIDIA_VISIBLE_DEVICES=none` and no GPU, and is configured as docs/notebooks.md says
a platform configures it: its ServiceAccount bound to hotmount-user in its namespace,
the agent's CA from a ConfigMap at /var/run/secrets/hotmount.io/. Nothing else: the
magic finds the token, the namespace, its own pod name and the Service by itself.
There is no cluster DNS on this node: the pod maps the Service's name to its ClusterIP
with `hostAliases`, so TLS still checks the name the certificate carries.

- `ipython(node, pod, *lines)`: a fresh IPython for each call (`python3 -m IPython -c`);
- `Kernel`: one IPython shell that lives as long as the pod (its main process) and runs
  each cell it is given, as a notebook's kernel does: variables, child processes and
  the `pre_run_cell`/`post_run_cell` hooks stay from cell to cell. It is IPython's
  InteractiveShell, the class ipykernel's shell extends; the cells come through files
  in the pod instead of ZMQ (the image has IPython, not ipykernel).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.k8s import flows
from tests.k8s.flows import NAMESPACE, RELEASE
from tests.k8s.node.cluster import Node

CELLS = "/tmp/cells"  # in the pod: <n>.py a cell to run, <n>.out what it printed

# The kernel, the pod's main process: runs <n>.py in order, its output into <n>.out.
KERNEL = f"""
import contextlib, io, pathlib, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="NoColor")
cells = pathlib.Path("{CELLS}")
cells.mkdir(exist_ok=True)
n = 0
while True:
    source = cells / f"{{n}}.py"
    if not source.exists():
        time.sleep(0.05)
        continue
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        shell.run_cell(source.read_text(), store_history=True)
    (cells / f"{{n}}.new").write_text(out.getvalue())
    (cells / f"{{n}}.new").rename(cells / f"{{n}}.out")
    n += 1
"""

# One cell given to the kernel (argv: its number, its code, a deadline); prints its output.
_SEND = f"""
import pathlib, sys, time
n, code, deadline = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
cells = pathlib.Path("{CELLS}")
cells.mkdir(exist_ok=True)
(cells / f".{{n}}").write_text(code)
(cells / f".{{n}}").rename(cells / f"{{n}}.py")
out = cells / f"{{n}}.out"
while not out.exists():
    if time.monotonic() > deadline:
        sys.exit(f"cell {{n}} did not finish")
    time.sleep(0.05)
print(out.read_text(), end="")
"""


def ipython(node: Node, pod: str, *lines: str) -> str:
    """Run magics in a fresh IPython in the pod, as cells of a notebook; its output."""
    code = "\n".join(lines)
    result = node.kubectl(
        "exec", pod, "--", "python3", "-m", "IPython", "--quick", "--no-banner",
        "--colors=NoColor", "-c", code, timeout=180,
    )  # fmt: skip
    return result.stdout + result.stderr


@dataclass
class Kernel:
    """The notebook pod's kernel (its main process is `KERNEL`)."""

    node: Node
    pod: str
    cells: int = 0

    def run(self, code: str, timeout: float = 120) -> str:
        """Run one cell; what it printed (its output and errors, the hooks' lines)."""
        result = self.node.kubectl(
            "exec", self.pod, "--", "python3", "-c", _SEND, str(self.cells), code,
            str(timeout), timeout=timeout + 30,
        )  # fmt: skip
        self.cells += 1
        return result.stdout + result.stderr


@contextmanager
def notebook_pod(
    node: Node,
    release: flows.Release,
    image: str,
    *,
    kernel: bool = False,
    annotations: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A Running notebook pod in `default` (its name), deleted afterwards with its
    ServiceAccount, RoleBinding and CA ConfigMap. `kernel`: its main process is a
    `Kernel`'s, else `sleep infinity`."""
    account, ca = flows.new_name("notebook"), flows.new_name("hotmount-ca")
    node.kubectl("create", "serviceaccount", account, "-n", "default")
    try:
        node.kubectl(
            "create", "rolebinding", account, "-n", "default",
            f"--clusterrole={flows.USER_ROLE}", f"--serviceaccount=default:{account}",
        )  # fmt: skip
        node.kubectl(
            "create", "configmap", ca, "-n", "default",
            f"--from-literal=ca.crt={release.ca_bundle()}",
        )  # fmt: skip
        me = flows.new_name("jupyter")
        manifest = flows.pod_manifest(
            me, image=image, serviceAccountName=account,
            hostAliases=[
                {"ip": release.service_ip(), "hostnames": [f"{RELEASE}.{NAMESPACE}.svc"]}
            ],
            volumes=[{"name": "hotmount-ca", "configMap": {"name": ca}}],
        )  # fmt: skip
        if annotations:
            manifest["metadata"]["annotations"] = annotations
        container = manifest["spec"]["containers"][0]
        container["command"] = ["python3", "-c", KERNEL] if kernel else ["sleep", "infinity"]
        if env:
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        container["volumeMounts"] = [
            {"name": "hotmount-ca", "mountPath": "/var/run/secrets/hotmount.io", "readOnly": True}
        ]
        with flows.running_pod(node, manifest):
            yield me
    finally:
        node.kubectl("delete", "configmap", ca, "-n", "default", check=False)
        node.kubectl("delete", "rolebinding,serviceaccount", account, "-n", "default", check=False)
