"""What a pod's routes take from the path and the query, with the limits every face
checks (the routes themselves are the operation table's: agent/operations/)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

Namespace = Annotated[str, Path(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
PodName = Annotated[str, Path(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)]
DevicePath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_./:=-]*$", max_length=160)]
ContainerQuery = Annotated[
    str | None, Query(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
]

# A suspend's or a resume's progress is the POST's to see: the POST's own verb on the pod
# (`delete` to suspend, `create` to resume), so who may not suspend a pod may not watch it.
PROGRESS_VERBS = {"suspend": "delete", "resume": "create"}
