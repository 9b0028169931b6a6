"""The two Python halves of scripts/gpu-check-suspend.sh (the real-GPU suspend check).

    python3 -c "$(cat gpu_check_suspend.py)" worker GIB STATUS GO   # in the container
    python3 gpu_check_suspend.py engine suspend|resume pid:N        # on the host

`worker`: PyTorch fills GIB GiB of GPU memory with a known pattern by a kernel (i*7+3,
int64), frees every cached block, writes "ready <elements>" to STATUS, then waits for
the file GO without a CUDA call (a checkpointed process is locked: its CUDA calls would
wait). Then it checks every element against the pattern by a kernel on the GPU it runs
on now, and writes "intact ..." or "CORRUPT ..." with the kernel's time and the GPU's
name; a CUDA error is written as "ERROR ...". It stays alive afterwards (the check
kills it), so nvidia-smi can show it back on the GPU.

`engine`: hotmount's engine suspends or resumes the container's GPUs, as the agent
does, with the node's own libcuda.so.1 (driver root /) and the engine CLI's defaults
(NVML inventory, /var/lib/gpu-hotmount, the CDI directories). Prints one JSON line:
{"ok": result, "seconds": the call's wall time} or {"error", "message"}; exit 1 on error.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _say(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as out:
        out.write(text + "\n")
    os.replace(path + ".tmp", path)


def worker(gib: float, status: str, go: str) -> int:
    try:
        import torch

        elements = int(gib * (1 << 30)) // 8
        x = torch.arange(elements, dtype=torch.int64, device="cuda").mul_(7).add_(3)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # only x stays: the memory moved is x and the context
        _say(status, f"ready {elements}")
        while not os.path.exists(go):
            time.sleep(0.05)
        start = time.monotonic()
        expected = torch.arange(elements, dtype=torch.int64, device="cuda").mul_(7).add_(3)
        same = bool(torch.equal(x, expected))
        torch.cuda.synchronize()
        took = time.monotonic() - start
        del expected
        torch.cuda.empty_cache()
        name = torch.cuda.get_device_name(torch.cuda.current_device())
        verdict = "intact" if same else "CORRUPT"
        _say(status, f"{verdict} elements={elements} kernel_s={took:.3f} gpu={name}")
    except Exception as exc:  # every failure reaches the check as a line, never silence
        _say(status, f"ERROR {type(exc).__name__}: {exc}")
        return 1
    while True:
        time.sleep(3600)


def engine(op: str, ref: str) -> int:
    from hotmount.engine.core import Engine, EngineConfig
    from hotmount.errors import HotmountError

    made = Engine(EngineConfig(driver_root="/"))  # the engine CLI's defaults otherwise
    start = time.monotonic()
    try:
        if op == "suspend":
            result = made.suspender.suspend(ref).as_dict()
        else:
            result = made.suspender.resume(ref).as_dict()
    except HotmountError as exc:
        print(json.dumps({"error": exc.reason, "message": exc.message}))
        return 1
    print(json.dumps({"ok": result, "seconds": round(time.monotonic() - start, 3)}))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "worker":
        return worker(float(argv[1]), argv[2], argv[3])
    if len(argv) == 3 and argv[0] == "engine" and argv[1] in ("suspend", "resume"):
        return engine(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
