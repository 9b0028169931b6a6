"""Where the `%gpu` magic finds the agent and who this pod is (cli/notebook/__init__.py): read
from the pod's ServiceAccount and the environment, each guess overridable (the variables
are listed in cli/notebook/__init__.py's docstring). The token is read at every call."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the client (pydantic) loads on the first call, not at %load_ext
    from cli.client import HotmountClient

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
AGENT_CA = Path("/var/run/secrets/hotmount.io/ca.crt")
DEFAULT_AGENT = "https://gpu-hotmount.gpu-hotmount.svc"


class NotebookError(Exception):
    """A problem the user can fix, said in one line."""


@dataclass(frozen=True)
class Config:
    """Where the agent is and who this pod is; `token_file` is read at every call
    (projected ServiceAccount tokens are rotated)."""

    agent: str
    token_file: Path
    namespace: str
    pod: str
    container: str | None = None
    ca_file: Path | None = None
    idle_timeout: str | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, service_account: Path = SERVICE_ACCOUNT
    ) -> Config:
        env = os.environ if env is None else env
        token_file = Path(env.get("GPU_HOTMOUNT_TOKEN_FILE") or service_account / "token")
        namespace = env.get("GPU_HOTMOUNT_NAMESPACE") or _read(service_account / "namespace")
        if not namespace:
            raise NotebookError(
                f"cannot tell this pod's namespace: no {service_account}/namespace "
                "(not inside a Kubernetes pod?); set GPU_HOTMOUNT_NAMESPACE"
            )
        pod = env.get("GPU_HOTMOUNT_POD") or env.get("HOSTNAME") or socket.gethostname()
        ca = env.get("GPU_HOTMOUNT_CA_FILE")
        ca_file = Path(ca) if ca else _first_file(AGENT_CA, service_account / "ca.crt")
        from cli.transport.cleartext import refuse_plain_credentials

        agent = (env.get("GPU_HOTMOUNT_AGENT") or DEFAULT_AGENT).rstrip("/")
        try:  # the pod's token goes with every call: never in clear text on the network
            refuse_plain_credentials(agent, "this pod's ServiceAccount token")
        except ValueError as exc:
            raise NotebookError(f"GPU_HOTMOUNT_AGENT: {exc}") from None
        return cls(
            agent=agent,
            token_file=token_file,
            namespace=namespace,
            pod=pod,
            container=env.get("GPU_HOTMOUNT_CONTAINER") or None,
            ca_file=ca_file,
            idle_timeout=env.get("GPU_HOTMOUNT_IDLE_TIMEOUT") or None,
        )

    def __post_init__(self) -> None:
        """Built by hand too: the pod's token goes with every call, never in clear text."""
        from cli.transport.cleartext import refuse_plain_credentials

        try:
            refuse_plain_credentials(self.agent, "this pod's ServiceAccount token")
        except ValueError as exc:
            raise NotebookError(str(exc)) from None

    def token(self) -> str:
        token = _read(self.token_file)
        if not token:
            raise NotebookError(
                f"no ServiceAccount token at {self.token_file} (the pod has "
                "automountServiceAccountToken: false?); set GPU_HOTMOUNT_TOKEN_FILE"
            )
        return token

    def client(self, timeout: float | None = None) -> HotmountClient:
        """A client of the agent as this pod; `timeout`: each call's bound (the client's
        default when None)."""
        from cli.client import HotmountClient

        verify: str | bool = str(self.ca_file) if self.ca_file else True
        bound = {"timeout": timeout} if timeout is not None else {}
        return HotmountClient.for_agent(self.agent, self.token(), verify=verify, **bound)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _first_file(*paths: Path) -> Path | None:
    return next((p for p in paths if p.is_file()), None)
