"""`python -m hotmount`: drive the engine from a shell, one operation per process.

    python -m hotmount devices
    python -m hotmount mount   --container ID|pid:N --device 0[,GPU-...,nvidia.com/gpu=1]
    python -m hotmount unmount --container ID|pid:N [--device ...] [--force]
    python -m hotmount status  [--container ID|pid:N]
    python -m hotmount reconcile

Exit status: 0 done; 1 error; 2 bad input; 3 busy or conflict; 4 not found.
Errors are one line on stderr; `-o json` prints results as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from hotmount.config import DEFAULT_STATE_DIR, EngineConfig
from hotmount.devices.inventory import DEFAULT_CDI_DIRS
from hotmount.engine.core import Engine
from hotmount.errors import Conflict, HotmountError, InvalidRequest, NotFound

EXIT_ERROR, EXIT_USAGE, EXIT_CONFLICT, EXIT_NOT_FOUND = 1, 2, 3, 4


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--host-root", type=Path, default=Path("/"), help="where the host's / is")
    common.add_argument(
        "--cdi-dir",
        action="append",
        dest="cdi_dirs",
        metavar="DIR",
        help=f"CDI spec directory (repeatable; default {' '.join(DEFAULT_CDI_DIRS)})",
    )
    common.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    common.add_argument("--no-nvml", action="store_true", help="read /proc/driver/nvidia only")
    common.add_argument(
        "--node-method",
        choices=("auto", "openat2", "setns"),
        default="auto",
        help=argparse.SUPPRESS,
    )
    common.add_argument("-o", "--output", choices=("text", "json"), default="text")
    common.add_argument("-v", "--verbose", action="store_true")

    parser = argparse.ArgumentParser(prog="python -m hotmount", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("devices", parents=[common], help="the node's device inventory")
    for name, text in (("mount", "grant devices to a container"), ("unmount", "take them away")):
        cmd = sub.add_parser(name, parents=[common], help=text)
        cmd.add_argument("--container", required=True, help="container ID or pid:N")
        cmd.add_argument(
            "--device",
            action="append",
            default=[],
            required=name == "mount",
            help="index, UUID or CDI name; comma-separated or repeated",
        )
        cmd.add_argument("--force", action="store_true")
        if name == "mount":
            cmd.add_argument(
                "--with-driver",
                action="store_true",
                default=None,
                help="bring the driver's libraries and tools (docs/driver.md)",
            )
            cmd.add_argument("--driver-root", help="where the driver's files are (host path)")
        if name == "unmount":
            cmd.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    status = sub.add_parser("status", parents=[common], help="what is hot-mounted")
    status.add_argument("--container", help="container ID or pid:N (default: all)")
    sub.add_parser("reconcile", parents=[common], help="repair drift, forget gone containers")
    return parser


def _devices(values: list[str]) -> list[str]:
    return [part for value in values for part in value.split(",") if part.strip()]


def run(args: argparse.Namespace) -> Any:
    engine = Engine(
        EngineConfig(
            host_root=args.host_root,
            cdi_dirs=tuple(args.cdi_dirs) if args.cdi_dirs else DEFAULT_CDI_DIRS,
            state_dir=args.state_dir,
            use_nvml=not args.no_nvml,
            node_method=args.node_method,
            stop_grace=getattr(args, "grace", 10.0),
            driver_root=getattr(args, "driver_root", None),
        )
    )
    if args.command == "devices":
        holders = engine.holders()
        return [
            {**device.as_dict(), "heldBy": holders.get(device.key)}
            for device in engine.inventory.devices
        ]
    if args.command == "mount":
        devices = _devices(args.device)
        return engine.mount(
            args.container, devices, force=args.force, with_driver=args.with_driver
        ).as_dict()
    if args.command == "unmount":
        refs = _devices(args.device) or None
        return engine.unmount(args.container, refs, force=args.force).as_dict()
    if args.command == "status":
        if args.container:
            return engine.status(args.container).as_dict()
        return [s.as_dict() for s in engine.statuses()]
    return engine.reconcile().as_dict()


def _text(command: str, result: Any) -> str:
    if command == "devices":
        rows = [f"{'INDEX':<6}{'KEY':<48}{'KIND':<5}NODES  HELD BY"]
        for d in result:
            index = "-" if d["index"] is None else str(d["index"])
            nodes = ",".join(n["path"] for n in d["nodes"])
            rows.append(f"{index:<6}{d['key']:<48}{d['kind']:<5}{nodes}  {d['heldBy'] or '-'}")
        return "\n".join(rows)
    if command == "mount":
        done = [d["key"] for d in result["mounted"]]
        same = [d["key"] for d in result["already_mounted"]]
        text = f"mounted: {', '.join(done) or '-'}; already mounted: {', '.join(same) or '-'}"
        driver = result.get("driver") or {}
        exports = [f"export {k}={v}" for k, v in (driver.get("env") or {}).items()]
        return "\n".join([text, *exports])
    if command == "unmount":
        return (
            f"unmounted: {', '.join(result['unmounted']) or '-'}; "
            f"not mounted: {', '.join(result['not_mounted']) or '-'}"
        )
    return json.dumps(result, indent=2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        result = run(args)
    except HotmountError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if isinstance(exc, InvalidRequest):
            return EXIT_USAGE
        if isinstance(exc, Conflict):
            return EXIT_CONFLICT
        return EXIT_NOT_FOUND if isinstance(exc, NotFound) else EXIT_ERROR
    except PermissionError as exc:
        print(f"error: {exc.strerror}: {exc.filename} (the engine needs root)", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(result, indent=2) if args.output == "json" else _text(args.command, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
