"""The options every nvcli command takes (kubectl's names), as one value: parsed by
cli.main, read by the transports it builds and by `--local` (cli.local), which import
this module rather than cli.main."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


@dataclass
class Common:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    v: int | None = None
    timeout: str | None = None
    output: OutputFormat | None = None
    agent: str | None = None
    token: str | None = None
    token_file: Path | None = None
    certificate_authority: Path | None = None
    insecure_skip_tls_verify: bool = False
    local: bool = False
    host_root: Path | None = None
    cdi_dir: list[str] | None = None
    state_dir: Path | None = None

    def merged(self, outer: Common | None) -> Common:
        """Flags given after the command win over the same flags given before it."""
        if outer is None:
            return self
        values = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(outer, f.name)
            values[f.name] = theirs if mine is None or mine is False else mine
        return Common(**values)

    @property
    def fmt(self) -> str:
        return self.output.value if self.output else "table"


def split_refs(values: list[str] | None) -> list[str]:
    """`--mount 0,1`, `--mount=0 --mount 1`: one flat list, duplicates kept once."""
    refs = [part.strip() for value in values or [] for part in value.split(",")]
    return list(dict.fromkeys(r for r in refs if r))
