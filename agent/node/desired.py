"""The GPUMount a pod should have: what `kubectl apply` sets, kept per pod.

`kubectl apply -f gpumount.yaml` reads the object, diffs it against its own
last-applied annotation and sends a JSON merge patch. So the agent keeps each pod's
spec exactly as applied (device references as the user wrote them) with its
annotations, under the state directory (`desired/`), and answers a GET with them:
applying the same file again then sends no patch at all. The spec is tied to the pod's
UID: a new pod of the same name starts without one, and reconcile drops the specs of
pods that are gone. Each is kept in a file named by the digest of `namespace/pod` alone:
a pod's name may be 253 characters, which with its namespace passed NAME_MAX (255) in the
old `<namespace>_<pod>_<digest>.json` names (a 500 on GET, PATCH and DELETE). Files of the
old names are renamed to the new at start (`_migrate`), so that a spec is never in two
files that `all()` would both read and `delete` would half remove.

`merge_patch` and `difference` are pure; `DesiredMounts` is the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from hotmount.api import atomic_write

log = logging.getLogger(__name__)


class DesiredMount(BaseModel):
    namespace: str
    pod: str
    uid: str  # the pod's: a namesake is another pod
    spec: dict[str, Any]  # camelCase, as applied
    annotations: dict[str, str]
    created: str  # when it was first applied (the object's creationTimestamp)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, `null` deletes, anything else
    (lists included) replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


@dataclass(frozen=True)
class Difference:
    """What to do to a container so that it has what its spec says."""

    mount: list[str]  # device keys to mount by name
    mount_count: int  # GPUs to add by count
    unmount: list[str]  # device keys to take


def difference(
    wanted_keys: list[str] | None,
    wanted_count: int | None,
    named: Iterable[str],
    by_count: Iterable[str],
) -> Difference:
    """`named`: the keys mounted by name now; `by_count`: those mounted by count, in mount
    order. A spec by name keeps exactly its devices (a count mount of one of them
    included); a spec by count keeps that many count mounts, the oldest first, and no
    named ones."""
    named, by_count = list(named), list(by_count)
    if wanted_keys is not None:
        have = set(named) | set(by_count)
        return Difference(
            mount=[k for k in dict.fromkeys(wanted_keys) if k not in have],
            mount_count=0,
            unmount=[k for k in [*named, *by_count] if k not in wanted_keys],
        )
    count = wanted_count or 0
    return Difference(
        mount=[],
        mount_count=max(count - len(by_count), 0),
        unmount=[*named, *by_count[count:]],
    )


DIGEST_NAME = re.compile(r"^[0-9a-f]{64}\.json$")


def file_name(namespace: str, pod: str) -> str:
    """69 characters whatever the names' length (NAME_MAX is 255)."""
    return hashlib.sha256(f"{namespace}/{pod}".encode()).hexdigest() + ".json"


class DesiredMounts:
    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "desired"
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._migrate()

    def _path(self, namespace: str, pod: str) -> Path:
        return self.directory / file_name(namespace, pod)

    def _migrate(self) -> None:
        """Rename the files of older agents (`<namespace>_<pod>_<digest>.json`) to their
        digest names. Migrating once, rather than reading both names for ever, keeps one
        file per pod; a file that does not parse is left where it is, and read by nobody."""
        for path in sorted(self.directory.glob("*.json")):
            if DIGEST_NAME.match(path.name):
                continue
            try:
                found = DesiredMount.model_validate_json(path.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("leaving the unreadable desired spec %s: %s", path, exc)
                continue
            new = self._path(found.namespace, found.pod)
            if not new.exists():  # a newer spec under the new name wins
                os.replace(path, new)
            else:
                path.unlink()

    def get(self, namespace: str, pod: str, uid: str | None = None) -> DesiredMount | None:
        """The pod's spec (only if it was applied to the pod with this `uid`, when given)."""
        try:
            found = DesiredMount.model_validate_json(self._path(namespace, pod).read_bytes())
        except (FileNotFoundError, ValueError):
            return None
        return found if uid is None or found.uid == uid else None

    def put(self, desired: DesiredMount) -> None:
        atomic_write(
            os.fspath(self._path(desired.namespace, desired.pod)),
            desired.model_dump_json().encode(),
        )

    def delete(self, namespace: str, pod: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(namespace, pod).unlink()

    def all(self) -> list[DesiredMount]:
        found = []
        for path in sorted(self.directory.glob("*.json")):
            with contextlib.suppress(FileNotFoundError, ValueError):
                found.append(DesiredMount.model_validate_json(path.read_bytes()))
        return found
