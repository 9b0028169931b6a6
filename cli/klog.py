"""nvcli's `-v` logging, in klog's line format (kubectl's): its own module so that the
typer commands (cli.wiring) and `nvcli status`'s quick path (cli.statusline) set it up
alike."""

from __future__ import annotations

import logging
import sys


class _KlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, "%m%d %H:%M:%S") + f".{int(record.msecs * 1000):06d}"
        where = f"{record.filename}:{record.lineno}"
        return f"{record.levelname[0]}{stamp} {record.process:>7} {where}] {record.getMessage()}"


def setup_logging(verbosity: int) -> None:
    """4 logs each HTTP call, 6 adds headers and bodies; below, warnings only."""
    logger = logging.getLogger("nvcli")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_KlogFormatter())
        logger.addHandler(handler)
        logger.propagate = False
    if verbosity >= 6:
        logger.setLevel(logging.DEBUG)
    elif verbosity >= 4:
        logger.setLevel(logging.INFO)
    else:
        logger.setLevel(logging.WARNING)
