"""Nodes a cluster-wide list could not list, as the agent named them (`missingNodes`).

They travel in the result beside the nodes that answered, as entries with no devices
and an `unavailable` reason, so `-o json` and `-o yaml` carry them and a script that
reads `.devices` of each entry still works; the table leaves them out and `nvcli list`
warns about each on stderr.
"""

from __future__ import annotations

from typing import Any

from hotmount.wire.schemas import DeviceList, Model


class Unavailable(Model):
    reason: str
    message: str = ""


class UnlistedNode(DeviceList):
    """A node the list could not list: no devices known, and why."""

    unavailable: Unavailable


def unlisted(metadata: Any) -> list[UnlistedNode]:
    """The `missingNodes` of a list's metadata; entries without a node are dropped."""
    missing = metadata.get("missingNodes") if isinstance(metadata, dict) else None
    return [
        UnlistedNode(
            node=entry["node"],
            devices=[],
            unavailable=Unavailable(
                reason=str(entry.get("reason") or "Unknown"), message=str(entry.get("message", ""))
            ),
        )
        for entry in (missing if isinstance(missing, list) else [])
        if isinstance(entry, dict) and isinstance(entry.get("node"), str) and entry["node"]
    ]


def warning_lines(result: Any) -> list[str]:
    """One line per node that did not answer, for stderr: printable (cli/output.py),
    as the agent that listed may not be."""
    from cli.output import printable

    return [
        printable(
            f"warning: node {r.node} did not answer ({r.unavailable.reason}): "
            f"{r.unavailable.message}"
        ).replace("\n", "?")
        for r in (result if isinstance(result, list) else [])
        if isinstance(r, UnlistedNode)
    ]
