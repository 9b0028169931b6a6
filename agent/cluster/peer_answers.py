"""Another agent's part of a list, read within bounds and believed only once checked.

An agent that fans a list out (agent/cluster/gateway.py) must survive any one peer, buggy or
compromised (root on one node holds the agents' token). So each answer is:

- read as a stream, at most `--list-max-bytes` of it (a huge body is cut off at the
  cap, never buffered whole), undecoded (the ask takes no compression, so a small
  gzip cannot unpack into gigabytes), and before its own deadline: the end of the
  peer's `--list-timeout` or of the list's `--list-deadline`, whichever comes first.
  The deadline is checked after every read and each read waits at most what was left
  when the ask began, so a peer that trickles a byte at a time is cut off, and an ask
  the list has given up on stops at its next read;
- validated with the agent's own models (`PodDevices`, `DeviceList`) and rebuilt from
  them, so that one malformed item cannot make the list, or its kubectl Table, a 500:
  the peer is named in `missingNodes` instead (`BadAnswer`);
- held to the peer's own node: an answer with an item for another node (or for
  another namespace than the one listed) is refused whole, and the peer named.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

import httpx
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from hotmount.wire.schemas import DeviceList, KubeName, PodDevices

GROUP_VERSION = "hotmount.io/v1alpha1"
LIST_KINDS = {"gpumounts": "GPUMount", "nodedevices": "NodeDevices"}  # by the path's end


class PeerAnswerError(Exception):
    """The peer's answer is not believed: `reason` is a missingNodes reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass(frozen=True)
class ReadBounds:
    max_bytes: int
    until: float  # time.monotonic() by which the whole answer must be in
    abandoned: threading.Event  # set once the list has stopped waiting


def read_answer(
    client: httpx.Client,
    url: str,
    headers: list[tuple[str, str]],
    extensions: dict[str, Any] | None,
    bounds: ReadBounds,
) -> tuple[int, bytes]:
    """The peer's status and body, or PeerAnswerError (Timeout, BadAnswer)."""
    left = bounds.until - time.monotonic()
    if left <= 0 or bounds.abandoned.is_set():
        raise PeerAnswerError("Timeout", "no time was left to ask it within the list's deadline")
    asked = [*headers, ("accept-encoding", "identity")]
    with client.stream(
        "GET", url, headers=asked, extensions=extensions, timeout=httpx.Timeout(left)
    ) as answer:
        encoding = answer.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise PeerAnswerError("BadAnswer", f"a {encoding[:20]!r} body, asked for none")
        declared = answer.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > bounds.max_bytes:
            raise _too_large(bounds.max_bytes)
        body = bytearray()
        for chunk in answer.iter_raw():
            body += chunk
            if len(body) > bounds.max_bytes:
                raise _too_large(bounds.max_bytes)
            if bounds.abandoned.is_set() or time.monotonic() > bounds.until:
                raise PeerAnswerError("Timeout", f"still sending after {len(body)} bytes")
        return answer.status_code, bytes(body)


def _too_large(cap: int) -> PeerAnswerError:
    return PeerAnswerError("BadAnswer", f"the answer is over --list-max-bytes ({cap} bytes)")


def _aware_timestamp(value: str) -> str:
    """RFC 3339 with a zone (kubectl's Table computes AGE from it)."""
    if datetime.fromisoformat(value).tzinfo is None:
        raise ValueError("a timestamp without a time zone")
    return value


class _Metadata(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    name: KubeName
    namespace: KubeName | None = None
    creation_timestamp: Annotated[str, AfterValidator(_aware_timestamp)] | None = None
    annotations: dict[str, str] | None = None


class _PeerObject(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    api_version: Literal["hotmount.io/v1alpha1"] = Field(alias="apiVersion")
    metadata: _Metadata


class _GPUMount(_PeerObject):
    kind: Literal["GPUMount"]
    spec: dict[str, Any] | None = None
    status: PodDevices


class _NodeDevices(_PeerObject):
    kind: Literal["NodeDevices"]
    status: DeviceList


class _GPUMountList(BaseModel):
    items: list[_GPUMount] = Field(max_length=100_000)


class _NodeDevicesList(BaseModel):
    items: list[_NodeDevices] = Field(max_length=100_000)


def list_kind(path: str) -> str:
    """GPUMount or NodeDevices, from a list's path."""
    return LIST_KINDS[path.rstrip("/").rsplit("/", 1)[-1]]


def peer_items(path: str, node: str, body: bytes) -> list[dict[str, Any]]:
    """The items of `node`'s answer to the list at `path`, as this agent would write
    them; PeerAnswerError(BadAnswer) for anything else."""
    model = _GPUMountList if list_kind(path) == "GPUMount" else _NodeDevicesList
    try:
        listed = model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PeerAnswerError(
            "BadAnswer", f"not a list of its own objects: {where}: {first['msg']}"[:300]
        ) from None
    namespace = _listed_namespace(path)
    items = []
    for item in listed.items:
        _require_own(item, node, namespace)
        items.append(_rebuilt(item))
    return items


def _listed_namespace(path: str) -> str | None:
    parts = path.strip("/").split("/")
    return parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] else None


def _require_own(item: _GPUMount | _NodeDevices, node: str, namespace: str | None) -> None:
    named = {item.status.node}
    if isinstance(item, _NodeDevices):
        named.add(item.metadata.name)
    if named != {node}:
        others = ", ".join(sorted(str(n) for n in named - {node}))[:100]
        raise PeerAnswerError("BadAnswer", f"it answered for another node ({others}), not its own")
    if isinstance(item, _GPUMount) and (
        item.metadata.namespace is None or namespace not in (None, item.metadata.namespace)
    ):
        raise PeerAnswerError("BadAnswer", "it answered with a GPUMount of another namespace")


def _rebuilt(item: _GPUMount | _NodeDevices) -> dict[str, Any]:
    """The object as agent/aggregated/objects.py's `kube_object` writes it: only known fields."""
    obj: dict[str, Any] = {
        "apiVersion": GROUP_VERSION,
        "kind": item.kind,
        "metadata": item.metadata.model_dump(by_alias=True, exclude_none=True),
    }
    if isinstance(item, _GPUMount) and item.spec is not None:
        obj["spec"] = item.spec
    obj["status"] = item.status.model_dump(mode="json", by_alias=True)
    return obj
