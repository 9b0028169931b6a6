"""One door to a tenant's files and processes (issue 41, item 4), held by reading the
source: no module of hotmount/, agent/ or cli/ outside hotmount/tenantfs/ builds a path
into `/proc/<pid>/root`, `cwd`, `fd`, `fdinfo` or `ns/...` (nor any `/proc/<pid>` path:
`/proc/1/...`, `f"/proc/{pid}"`, `host.proc / ...`), and none but
hotmount/tenantfs/signals.py sends a signal (and that one through pidfds only).

Strings are read from the syntax tree: constants, f-strings (each `{...}` read as one
path component), and the parts of `os.path.join(...)`, `Path(...)` and `a / b`. Docstrings
are prose, not paths, and are skipped.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("hotmount", "agent", "cli")
DOOR = "hotmount/tenantfs/"
SIGNALS = "hotmount/tenantfs/signals.py"

_ENTRIES = r"(?:root|cwd|fd|fdinfo|ns)"
# `/proc/<anything but self or thread-self>/<entry>`, and `{...}/<entry>` in an f-string
# (`f"{proc}/{pid}/fd/{n}"`), and any `ns/` link (`"ns/mnt"`, `f"ns/{kind}"`).
_PROC_PATH = re.compile(rf"/proc/(?!self/|thread-self/)[^/\s`'\"]+/{_ENTRIES}(?:/|$|\W)")
_FORMATTED = re.compile(rf"\{{\}}/{_ENTRIES}(?:/|$)")
_NS_LINK = re.compile(r"(?:^|/)ns/(?:\{\}|[a-z_]+)")
_ANY_PID = re.compile(r"/proc/(?:[0-9]+|\{\})(?:/|$)")  # `/proc/1/stat`, f"/proc/{pid}"
_OWN = re.compile(r"^/proc/(?:self|thread-self)/")  # the agent's own: no tenant's
_JOINED_PARTS = {"root", "cwd", "fd", "fdinfo", "ns"}
# Sending a signal: by PID anywhere, or by pidfd outside the one module.
_SIGNAL_CALLS = {"kill", "killpg", "pidfd_send_signal", "pthread_kill", "sigqueue"}
_PROCESS_METHODS = {"send_signal", "terminate"}  # Popen's: os.kill by PID underneath


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose, never a path)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _text(node: ast.JoinedStr) -> str:
    return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)


def _is_join(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr == "join" and ast.unparse(func.value) in ("os.path", "posixpath")
    return isinstance(func, ast.Name) and func.id in ("Path", "PurePath")


def _is_proc(node: ast.expr) -> bool:
    """`host.proc`, `self.host.proc`: the host's /proc, where every PID's directory is."""
    return isinstance(node, ast.Attribute) and node.attr == "proc"


def path_problems(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each path into /proc/<pid>'s root, cwd, fd, fdinfo or ns/ built
    in `source`."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in prose:
                continue
            own = _OWN.match(node.value)
            if (
                _PROC_PATH.search(node.value)
                or _ANY_PID.search(node.value)
                or (_NS_LINK.search(node.value) and not own)
            ):
                yield node.lineno, f"the string {node.value!r}"
        elif isinstance(node, ast.JoinedStr):
            text = _text(node)
            own = _OWN.match(text)
            if (
                _PROC_PATH.search(text)
                or _ANY_PID.search(text)
                or _FORMATTED.search(text)
                or (_NS_LINK.search(text) and not own)
            ):
                yield node.lineno, f"the f-string {ast.unparse(node)}"
        elif isinstance(node, ast.Call) and _is_join(node):
            parts = [a.value for a in node.args if isinstance(a, ast.Constant)]
            under_proc = bool(node.args) and _is_proc(node.args[0])
            if under_proc or any(
                isinstance(p, str) and p.strip("/") in _JOINED_PARTS for p in parts
            ):
                yield node.lineno, f"the path {ast.unparse(node)}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if _is_proc(node.left) or (
                isinstance(right, ast.Constant)
                and isinstance(right.value, str)
                and right.value.strip("/") in _JOINED_PARTS
            ):
                yield node.lineno, f"the path {ast.unparse(node)}"


def signal_problems(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each signal sent (or a sender imported) in `source`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            owner = ast.unparse(node.func.value)
            if (name in _SIGNAL_CALLS and owner in ("os", "signal")) or (name in _PROCESS_METHODS):
                yield node.lineno, f"the call {ast.unparse(node.func)}(...)"
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "signal"):
            for alias in node.names:
                if alias.name in _SIGNAL_CALLS:
                    yield node.lineno, f"the import of {node.module}.{alias.name}"


def _sources() -> Iterator[tuple[str, str]]:
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text()


def test_no_path_into_a_process_is_built_outside_the_door() -> None:
    found = [
        f"{name}:{line}: {what}"
        for name, source in _sources()
        if not name.startswith(DOOR)
        for line, what in path_problems(source)
    ]
    assert not found, (
        "paths into /proc/<pid>/{root,cwd,fd,fdinfo,ns} go through hotmount/tenantfs/ "
        "(procfs: pinned, bounded, nothing followed unless said):\n" + "\n".join(found)
    )


def test_no_signal_is_sent_outside_the_one_module() -> None:
    found = [
        f"{name}:{line}: {what}"
        for name, source in _sources()
        if name != SIGNALS
        for line, what in signal_problems(source)
    ]
    assert not found, (
        "processes are stopped through hotmount/tenantfs/signals.py (pidfds only):\n"
        + "\n".join(found)
    )


def test_the_one_signal_module_sends_through_pidfds_only() -> None:
    source = (REPO / SIGNALS).read_text()
    calls = {line: what for line, what in signal_problems(source)}
    assert calls, "signals.py sends no signal: the scan no longer sees how it does"
    assert all("pidfd_send_signal" in what for what in calls.values()), calls


def test_the_door_is_where_the_paths_are_built() -> None:
    """The scan sees the door's own paths: it would see them anywhere else."""
    source = (REPO / DOOR / "procfs.py").read_text()
    assert list(path_problems(source)), "the scan no longer recognises procfs's own paths"


def test_each_way_of_building_a_forbidden_path_is_named() -> None:
    source = '''
import os, signal
from pathlib import Path
from os import kill
def f(proc, pid, n, base, p):
    """A docstring may say /proc/<pid>/fd."""
    a = f"{proc}/{pid}/root"
    b = f"/proc/{pid}/fd/{n}"
    c = os.path.join(base, "fdinfo", str(n))
    d = proc / str(pid) / "ns" / "mnt"
    e = "/proc/1/ns/net"
    g = f"ns/{n}"
    h = os.readlink("/proc/self/ns/mnt")
    os.kill(pid, signal.SIGTERM)
    signal.pidfd_send_signal(n, signal.SIGKILL)
    p.terminate()
    i = p.host.proc / str(pid) / "stat"
    j = os.path.join(p.host.proc, str(pid))
    k = Path(f"/proc/{pid}") / "status"
    m = "/proc/2"
    q = "/proc/driver/nvidia/gpus"
'''
    lines = sorted({line for line, _ in path_problems(source)})
    # not the docstring, not /proc/self, not /proc/driver
    assert lines == [7, 8, 9, 10, 11, 12, 17, 18, 19, 20], lines
    signals = sorted(line for line, _ in signal_problems(source))
    assert signals == [4, 14, 15, 16], signals
