"""Which driver files a container gets, and where: pure functions, no I/O.

Two sources, as NVIDIA's toolkit has them:

- a CDI spec's `containerEdits` (spec-level and the device's own): `mounts` are bind
  mounts of host files, `hooks` are *read* for their meaning and never run
  (create-symlinks: links; update-ldcache: folders the linker must learn; every other
  hook is reported as ignored), `env` becomes environment edits for the caller;
- a driver root (the host's `/`, or the GPU Operator's `/run/nvidia/driver`): the
  files the toolkit would mount from it, for one driver version.

The linker step (see docs/driver.md): a soname link (`libcuda.so.1`) for each
library, made in the directory that holds the container's own `libc.so.6`, which
its glibc searches by default; the container's ld.so.cache and ld.so.conf.d are
never written.
"""

from __future__ import annotations

import platform
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from hotmount.errors import DriverUnavailable

BIND, SYMLINK = "bind", "symlink"

# What nvidia-container-toolkit mounts for the compute and utility capabilities.
DRIVER_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
DRIVER_TOOLS = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
TOOL_DIRS = ("/usr/bin", "/bin")
FIRMWARE_DIRS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
_FORBIDDEN_TOPS = ("/proc", "/sys", "/dev")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


def triplet() -> str:
    return {"aarch64": "aarch64-linux-gnu"}.get(platform.machine(), "x86_64-linux-gnu")


def library_dirs(arch: str | None = None) -> tuple[str, ...]:
    """glibc's default search directories on Debian/Ubuntu and Fedora/RHEL builds,
    multiarch first: where a driver root keeps its libraries, and where a container's
    libc.so.6 is looked for."""
    t = arch or triplet()
    return (f"/lib/{t}", f"/usr/lib/{t}", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


@dataclass(frozen=True, order=True)
class DriverFile:
    """One addition: a read-only bind mount of a host file, or a symlink.

    bind: `source` is a path inside the host directory `source_root` (resolved there,
    never following a symlink out of it). symlink: `source` is the link's target."""

    path: str
    kind: str
    source: str
    source_root: str = "/"


@dataclass
class DriverSet:
    """What one mount brings: the files, the linker folders, the env, and the hooks
    a spec named that the agent does not do (reported, never run)."""

    binds: list[DriverFile] = field(default_factory=list)
    links: list[DriverFile] = field(default_factory=list)
    ld_folders: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ignored_hooks: list[str] = field(default_factory=list)
    ignored_mounts: list[str] = field(default_factory=list)
    origin: str = ""


def container_path(path: Any, what: str) -> str:
    """A plain absolute path in the container, outside /proc, /sys and /dev."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise DriverUnavailable(f"{what} {path!r} is not an absolute path")
    if posixpath.normpath(path) != path or path == "/" or "\0" in path:
        raise DriverUnavailable(f"{what} {path!r} is not a plain path")
    if any(path == top or path.startswith(top + "/") for top in _FORBIDDEN_TOPS):
        raise DriverUnavailable(f"{what} {path} is under /proc, /sys or /dev")
    return path


def from_cdi_edits(edits: list[dict[str, Any]], origin: str) -> DriverSet:
    """Mounts, hooks and env of CDI containerEdits (spec-level first, then the device's)."""
    found = DriverSet(origin=origin)
    for edit in edits:
        for mount in edit.get("mounts") or []:
            bind = _cdi_mount(mount)
            if is_driver_bind(bind):
                found.binds.append(bind)
            else:
                found.ignored_mounts.append(f"{bind.source} -> {bind.path}")
        for hook in edit.get("hooks") or []:
            _cdi_hook(hook, found)
        for entry in edit.get("env") or []:
            name, sep, value = str(entry).partition("=")
            if sep and name:
                found.env[name] = value
    found.binds = _dedupe(found.binds)
    found.links = _dedupe(found.links)
    return found


def _cdi_mount(mount: Any) -> DriverFile:
    if not isinstance(mount, dict):
        raise DriverUnavailable("a CDI mount is not a mapping")
    options = mount.get("options") or []
    kind = mount.get("type") or "bind"
    if kind != "bind" and "bind" not in options and "rbind" not in options:
        raise DriverUnavailable(f"CDI mount of type {kind!r}: only bind mounts are placed")
    host = mount.get("hostPath")
    if not isinstance(host, str) or not host.startswith("/"):
        raise DriverUnavailable(f"CDI mount hostPath {host!r} is not an absolute path")
    target = container_path(mount.get("containerPath"), "CDI mount containerPath")
    return DriverFile(target, BIND, posixpath.normpath(host))


def is_firmware(path: str) -> bool:
    """Under NVIDIA's firmware directories: the only place a directory may be bound."""
    return any(path.startswith(top + "/") for top in FIRMWARE_DIRS)


def is_driver_bind(file: DriverFile) -> bool:
    """The allow-list for a CDI spec's mounts: only what a driver brings is bound.

    Any CDI device's spec is read, and a spec may mount what its own runtime needs (a
    daemon's socket directory, /run/...): bound, a tenant could reach it. So a mount is
    bound only as a library (`lib*.so*` directly in a linker default directory), a tool
    (`nvidia*` in /usr/bin or /bin) or firmware (under lib/firmware/nvidia), and only
    from the same path on the host, under some root (`/`, a driver root); everything
    else is left out and reported."""
    directory, name = posixpath.split(file.path)
    if not file.source.endswith(file.path):
        return False
    if is_firmware(file.path):
        return True
    if directory in library_dirs():
        return name.startswith("lib") and ".so" in name
    return directory in TOOL_DIRS and name.startswith("nvidia")


def _cdi_hook(hook: Any, found: DriverSet) -> None:
    args = [str(a) for a in (hook.get("args") or [])] if isinstance(hook, dict) else []
    name = hook.get("path", "?") if isinstance(hook, dict) else "?"
    if "create-symlinks" in args:
        for value in _option_values(args, "--link"):
            target, sep, link = value.partition("::")
            if not sep or not target:
                raise DriverUnavailable(f"create-symlinks --link {value!r} is not target::link")
            found.links.append(DriverFile(container_path(link, "symlink"), SYMLINK, target))
    elif "update-ldcache" in args:
        for folder in _option_values(args, "--folder"):
            found.ld_folders.append(container_path(folder, "update-ldcache --folder"))
    else:
        verb = next((a for a in args[1:] if not a.startswith("-") and a != "hook"), name)
        found.ignored_hooks.append(verb)


def _option_values(args: list[str], option: str) -> list[str]:
    values = []
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(option + "="):
            values.append(arg.partition("=")[2])
    return values


def version_of(names: list[str], nvml_version: str | None) -> str:
    """The driver version: NVML's, else the one libnvidia-ml.so.<v> / libcuda.so.<v> carry."""
    if nvml_version and _VERSION.match(nvml_version):
        return nvml_version
    for stem in ("libnvidia-ml.so.", "libcuda.so."):
        versions = sorted(
            {n[len(stem) :] for n in names if n.startswith(stem) and _VERSION.match(n[len(stem) :])}
        )
        if len(versions) == 1:
            return versions[0]
        if len(versions) > 1:
            raise DriverUnavailable(
                f"the driver root holds several driver versions ({', '.join(versions)}) "
                "and NVML named none of them"
            )
    raise DriverUnavailable("no libnvidia-ml.so.<version> nor libcuda.so.<version> found")


def from_driver_root(
    root: str, listing: dict[str, list[str]], firmware: list[str], nvml_version: str | None
) -> DriverSet:
    """The toolkit's files from `root`: `listing` maps each of `library_dirs()` and
    `TOOL_DIRS` that exists there to its entry names; `firmware` the versions under
    lib/firmware/nvidia. Files keep their path relative to the root, as the toolkit's."""
    every = [n for d in library_dirs() for n in listing.get(d, [])]
    version = version_of(every, nvml_version)
    found = DriverSet(origin=f"driver root {root} (version {version})")
    taken: set[str] = set()
    for directory in library_dirs():
        for library in DRIVER_LIBRARIES:
            name = f"{library}.{version}"
            if name in listing.get(directory, []) and name not in taken:
                taken.add(name)
                path = f"{directory}/{name}"
                found.binds.append(DriverFile(path, BIND, path, root))
    if not any(f.path.endswith(f"/libcuda.so.{version}") for f in found.binds) and not any(
        f.path.endswith(f"/libnvidia-ml.so.{version}") for f in found.binds
    ):
        raise DriverUnavailable(f"driver root {root}: no library of version {version}")
    for directory in TOOL_DIRS:
        for tool in DRIVER_TOOLS:
            if tool in listing.get(directory, []) and tool not in taken:
                taken.add(tool)
                found.binds.append(
                    DriverFile(f"{directory}/{tool}", BIND, f"{directory}/{tool}", root)
                )
    if version in firmware:
        path = f"/lib/firmware/nvidia/{version}"
        found.binds.append(DriverFile(path, BIND, path, root))
    return found


def soname_links(
    binds: list[DriverFile], sonames: dict[str, str], libc_dir: str | None, taken: set[str]
) -> list[DriverFile]:
    """What ldconfig would add for the new libraries, made by us: `<dir>/<soname> ->
    <library>` in `libc_dir` (searched by the container's linker by default), or beside
    the library when the container has no libc of its own. `taken`: link paths a spec's
    create-symlinks already makes."""
    links = []
    for bind in binds:
        name = sonames.get(bind.path)
        if not name or "/" in name or name == posixpath.basename(bind.path):
            continue
        directory = libc_dir or posixpath.dirname(bind.path)
        path = f"{directory}/{name}"
        if path in taken or path == bind.path:
            continue
        target = name_or_path(bind.path, directory)
        links.append(DriverFile(path, SYMLINK, target))
        taken.add(path)
    return links


def name_or_path(path: str, directory: str) -> str:
    """A link target: the bare name beside it, else the absolute path in the container."""
    return posixpath.basename(path) if posixpath.dirname(path) == directory else path


def library_env(
    binds: list[DriverFile], libc_dir: str | None, folders: list[str]
) -> dict[str, str]:
    """LD_LIBRARY_PATH only when the container has no libc directory we could link into:
    then nothing else tells its linker where the libraries are."""
    if libc_dir is not None:
        return {}
    dirs = list(
        dict.fromkeys([*folders, *(posixpath.dirname(b.path) for b in binds if ".so" in b.path)])
    )
    return {"LD_LIBRARY_PATH": ":".join(dirs)} if dirs else {}


def _dedupe(files: list[DriverFile]) -> list[DriverFile]:
    by_path: dict[str, DriverFile] = {}
    for f in files:
        previous = by_path.get(f.path)
        if previous is not None and previous != f:
            raise DriverUnavailable(f"{f.path} is wanted twice, as two different files")
        by_path[f.path] = f
    return list(by_path.values())


def has_soname(present: set[str], cache: bytes | None, name: str = "libcuda.so.1") -> bool:
    """`auto`'s question: would the container's linker find `name` already? In one of its
    default directories (`present`: paths found there), or in its own ld.so.cache."""
    if any(posixpath.basename(p) == name for p in present):
        return True
    return cache is not None and (name.encode() + b"\0") in cache
