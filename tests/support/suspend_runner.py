"""The engine's suspend, resume or reconcile in a process of its own, as the agent runs
them: with the stand-in driver's environment (fake NVML by LD_LIBRARY_PATH, the
stand-in libcuda under a driver root), and able to die at a named step.

    python -m tests.support.suspend_runner CONFIG.json

CONFIG: {"op": "suspend"|"resume"|"reconcile", "container": ID, "cdi_dir", "state_dir",
"driver_root", "lock_timeout", "onto", "released_on_suspend", "crash_at": [event, nth]}.
Prints one JSON line: {"ok": result} or {"error": reason, "message": text, "status":
http}. With `crash_at` the process SIGKILLs itself when the progress event comes for the
nth time: a real crash at that step, nothing patched.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import HotmountError


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    engine = Engine(
        EngineConfig(
            cdi_dirs=(config["cdi_dir"],),
            state_dir=Path(config["state_dir"]),
            use_nvml=False,  # the inventory from CDI; suspend reads NVML itself
            stop_grace=2,
            driver_root=config["driver_root"],
            released_on_suspend=frozenset(config.get("released_on_suspend", ())),
        )
    )
    crash = config.get("crash_at")
    seen: dict[str, int] = {}
    events: list[list[object]] = []

    def progress(event: str, details: dict[str, object]) -> None:
        name = details["step"] if event == "step" else event
        seen[str(name)] = seen.get(str(name), 0) + 1
        events.append([name, details])
        if crash and crash[0] == name and crash[1] == seen[str(name)]:
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        if config["op"] == "suspend":
            timeout = config.get("lock_timeout", 10.0)
            result = engine.suspender.suspend(
                config["container"], lock_timeout=timeout, progress=progress
            ).as_dict()
        elif config["op"] == "resume":
            result = engine.suspender.resume(
                config["container"], onto=config.get("onto"), progress=progress
            ).as_dict()
        else:
            result = engine.reconcile().as_dict()
    except HotmountError as exc:
        print(json.dumps({"error": exc.reason, "message": exc.message,
                          "status": exc.http_status, "events": events}))  # fmt: skip
        return 1
    print(json.dumps({"ok": result, "events": events}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
