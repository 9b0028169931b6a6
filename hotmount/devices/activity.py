"""What NVML says a GPU did since the last look: the input of the `unused` idle policy.

A process that holds `/dev/nvidia0` open says nothing about use: a notebook kernel that
ran one CUDA cell holds it until it exits. NVML's utilization does: the device-wide
rates (SM and memory-copy, over the driver's last sample period) and, where the driver
keeps them, per-process samples since a timestamp, which also catch a burst between two
looks. One NVML session serves every look (nvmlInit is the expensive part on a real
node); one call per GPU and per kind per pass, on the caller's schedule: no thread.

A GPU NVML cannot sample (a MIG instance on most drivers, no NVML at all) is reported
as not judged, with the reason: the caller falls back to holders.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class GpuActivity:
    """One look at one GPU. `judged` False: NVML could not say (`why_not`)."""

    judged: bool
    why_not: str | None = None
    sm_percent: int = 0  # device-wide, over the driver's last sample period
    memory_percent: int = 0
    # Per process since the last look: pid -> (highest SM %, highest memory %).
    processes: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def device_busy(self) -> bool:
        return self.sm_percent > 0 or self.memory_percent > 0

    def busy_for(self, pids: Iterable[int]) -> bool:
        """Used now (device-wide rates: conservative on a shared GPU) or by one of `pids`
        since the last look (process samples)."""
        if self.device_busy:
            return True
        return any(sm > 0 or mem > 0 for pid, (sm, mem) in self._own(pids))

    def utilization_for(self, pids: Iterable[int]) -> float:
        """0..1: the SM share of `pids` where process samples exist, else the device's."""
        own = self._own(pids)
        if self.processes:
            return min(1.0, sum(sm for _, (sm, _mem) in own) / 100)
        return self.sm_percent / 100

    def _own(self, pids: Iterable[int]) -> list[tuple[int, tuple[int, int]]]:
        wanted = set(pids)
        return [(pid, s) for pid, s in self.processes.items() if pid in wanted]


class ActivitySampler:
    """NVML utilization for the GPUs asked about, one session kept open between passes."""

    def __init__(self) -> None:
        self._nvml: object | None = None  # the pynvml module once nvmlInit succeeded
        self._retry_at = 0.0
        self._why_not = "NVML is not loaded"
        self._last_seen: dict[str, int] = {}  # uuid -> newest process sample's timestamp

    def sample(self, uuids: Iterable[str]) -> dict[str, GpuActivity]:
        wanted = list(dict.fromkeys(uuids))
        if not wanted:
            return {}
        nvml = self._session()
        if nvml is None:
            return {u: GpuActivity(False, self._why_not) for u in wanted}
        return {u: self._look(u) for u in wanted}

    def retain(self, uuids: Iterable[str]) -> None:
        """Forget the cursors of every GPU but `uuids` (those no longer looked at). Apart
        from `sample`: a look at one GPU (the last one before a reclaim) must not reset
        the others' cursors, or their next look reads old samples again as new use."""
        keep = set(uuids)
        self._last_seen = {u: t for u, t in self._last_seen.items() if u in keep}

    def close(self) -> None:
        if self._nvml is not None:
            import pynvml

            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            self._nvml = None

    def _session(self) -> object | None:
        if self._nvml is not None:
            return self._nvml
        if time.monotonic() < self._retry_at:
            return None
        try:
            import pynvml
        except ImportError:
            self._retry_at, self._why_not = float("inf"), "pynvml is not installed"
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self._retry_at = time.monotonic() + _RETRY_SECONDS
            self._why_not = f"NVML does not load: {exc}"
            return None
        self._nvml = pynvml
        return self._nvml

    def _look(self, uuid: str) -> GpuActivity:
        import pynvml

        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        except pynvml.NVMLError as exc:
            return GpuActivity(False, f"NVML cannot sample {uuid}: {exc}")
        processes: dict[int, tuple[int, int]] = {}
        since = self._last_seen.get(uuid, 0)
        try:
            for s in pynvml.nvmlDeviceGetProcessUtilization(handle, since):
                sm, mem = processes.get(s.pid, (0, 0))
                processes[s.pid] = (max(sm, s.smUtil), max(mem, s.memUtil))
                since = max(since, s.timeStamp)
            self._last_seen[uuid] = since
        except pynvml.NVMLError:
            pass  # NOT_FOUND: no sample since; NOT_SUPPORTED: device-wide rates only
        return GpuActivity(True, None, rates.gpu, rates.memory, processes)
