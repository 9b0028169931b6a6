"""The agent image: deploy/Dockerfile, and scripts/build-image.sh without Docker.

The Dockerfile is read for what it must say; its install steps are run for real: build
the wheel from a copy of the build context, install it with deploy/install-agent.sh
(the script the Dockerfile runs) into a new venv, start `hotmount-agent` from there and
ask the image's HEALTHCHECK script whether it is healthy.

scripts/build-image.sh really builds the image (root, network to Debian's mirror and
the package index; a few minutes, the base rootfs cached): its OCI archive is read for
the Dockerfile's settings, imported into a real containerd with `ctr images import`,
and run: `hotmount-agent --help`, the agent answering its healthcheck, and the
engine's inventory from NVML (the fake libnvidia-ml) inside the container. Where it
cannot build (not root, offline) these skip, saying why; under CI they fail instead.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import http.server
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.support import DEPLOY, REPO
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu
from tests.support import containerd as ctrd
from tests.support.image import AgentImage, CannotBuild, build_agent_image
from tests.support.ports import free_port
from tests.support.runc import make_rootfs
from tests.unit.hosttree import build_host

DOCKERFILE = DEPLOY / "Dockerfile"
HEALTHCHECK = DEPLOY / "healthcheck.py"
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [s for s in DOCKERFILE.read_text().splitlines() if not s.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    result = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def ignore_patterns() -> list[str]:
    text = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    return [s.strip() for s in text if s.strip() and not s.startswith("#")]


def ignored(relative: str) -> bool:
    parts = relative.split("/")
    for pattern in ignore_patterns():
        bare = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or any(fnmatch.fnmatch(p, bare) for p in parts):
            return True
    return False


def test_dockerfile_says_what_the_image_needs():
    steps = instructions()
    froms = [args for word, args in steps if word == "FROM"]
    args = dict(a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a)
    assert args["PYTHON_IMAGE"].startswith("python:3.") and "-slim" in args["PYTHON_IMAGE"]
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)
    env = " ".join(a for word, a in steps if word == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env
    assert [a for word, a in steps if word == "USER"] in ([], ["0"], ["root"])
    health = [a for word, a in steps if word == "HEALTHCHECK"]
    assert len(health) == 1 and "healthcheck.py" in health[0]
    assert [a for word, a in steps if word == "ENTRYPOINT"] == ['["hotmount-agent"]']
    run = " ".join(a for word, a in steps if word == "RUN")
    assert "install-agent.sh" in run and "hotmount-agent --help" in run


def test_dockerfile_copies_only_what_a_clone_has():
    for word, args in instructions():
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _destination = shlex.split(args)
        for source in sources:
            if source != ".":
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
                assert not ignored(source), f"COPY {source}: excluded by the .dockerignore"
    for needed in ("pyproject.toml", "hotmount/engine/core.py", "agent/config.py", "cli"):
        assert not ignored(needed), f"the .dockerignore drops {needed}"
    assert ignored(".venv/bin/python") and ignored(".git/HEAD")


def context_files() -> list[str]:
    """The build context as a fresh clone (plus files not yet committed) gives it."""
    listing = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [f for f in listing.split("\0") if f and not ignored(f) and (REPO / f).is_file()]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0 and any(m in done.stdout + done.stderr for m in OFFLINE):
        cannot(f"no package index reachable for {argv[0]}: {done.stderr[-300:]}")
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


def test_image_install_steps_give_a_working_agent(tmp_path: Path):
    if shutil.which("git") is None:
        cannot("git is needed to list the build context")
    context = tmp_path / "context"
    for name in context_files():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, context / name)
    wheels, prefix = tmp_path / "wheels", tmp_path / "opt"
    python = sys.executable
    # The Dockerfile's two steps: `pip wheel --no-deps`, then install-agent.sh.
    run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), str(context)])
    env = {**os.environ, "PYTHON": python}
    run(["sh", str(DEPLOY / "install-agent.sh"), str(wheels), str(prefix)], env=env)
    agent = prefix / "bin" / "hotmount-agent"

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("hotmount-agent") == "agent.main:main", scripts
    assert "--listen" in run([str(agent), "--help"]).stdout

    port = free_port()
    argv = [str(agent), "--no-kubernetes", "--anonymous", "--listen", f"127.0.0.1:{port}"]
    argv += ["--state-dir", str(tmp_path / "state"), "--no-use-nvml"]
    log = (tmp_path / "agent.log").open("w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        check_env = {**os.environ, "HOTMOUNT_HEALTHCHECK_URL": f"http://127.0.0.1:{port}/healthz"}
        deadline = time.monotonic() + 30
        while True:
            healthy = subprocess.run(
                [str(prefix / "bin" / "python"), str(HEALTHCHECK)],
                env=check_env,
                capture_output=True,
                check=False,
            )
            if healthy.returncode == 0:
                break
            assert process.poll() is None, (
                f"the agent exited: {(tmp_path / 'agent.log').read_text()}"
            )
            assert time.monotonic() < deadline, healthy.stderr.decode()
            time.sleep(0.3)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(("status", "code"), [(200, 0), (503, 1)])
def test_healthcheck_script(status: int, code: int):
    handler = type("Handler", (_Health,), {"status": status})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
            done = subprocess.run(
                [sys.executable, str(HEALTHCHECK)],
                env={**os.environ, "HOTMOUNT_HEALTHCHECK_URL": url},
                capture_output=True,
                check=False,
            )
        finally:
            server.shutdown()
            thread.join()
    assert done.returncode == code


def test_healthcheck_fails_when_nothing_listens():
    url = f"https://127.0.0.1:{free_port()}/healthz"
    done = subprocess.run(
        [sys.executable, str(HEALTHCHECK)],
        env={**os.environ, "HOTMOUNT_HEALTHCHECK_URL": url},
        capture_output=True,
        check=False,
    )
    assert done.returncode == 1


# ---- scripts/build-image.sh: the image without Docker --------------------------

PACKER = REPO / "scripts" / "oci_archive.py"
NVML_GPUS = (
    FakeGpu("GPU-1mage000-0000-4000-8000-000000000001", "0000:41:00.0", 3),
    FakeGpu("GPU-1mage000-0000-4000-8000-000000000002", "0000:42:00.0", 4),
)


def cannot(why: str) -> None:
    """Skip, saying why; under CI, where everything needed is installed, fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but this cannot run: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> AgentImage:
    if os.geteuid() != 0:
        cannot("building the image needs root (mmdebstrap, chroot)")
    try:
        built = build_agent_image(tmp_path_factory.mktemp("image"))
    except CannotBuild as why:
        cannot(f"scripts/build-image.sh cannot build here: {why}")
    print(f"\nscripts/build-image.sh: {built.seconds:.0f} s")
    return built


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ctrd.Containerd]:
    why = ctrd.missing_requirements()
    if why is not None:
        cannot(why)
    (tmp_path / "containerd").mkdir()
    started = ctrd.Containerd(tmp_path / "containerd")
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(tmp_path / "containerd", ignore_errors=True)


def archive_json(archive: tarfile.TarFile, name: str) -> dict:
    member = archive.extractfile(name)
    assert member is not None, name
    return json.loads(member.read())


def blob(archive: tarfile.TarFile, digest: str) -> bytes:
    member = archive.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    assert member is not None, digest
    data = member.read()
    assert f"sha256:{hashlib.sha256(data).hexdigest()}" == digest, "a blob is not its digest"
    return data


def read_image(path: Path) -> tuple[dict, dict, dict, bytes]:
    """index.json's one entry, the manifest, the config and the uncompressed layer,
    every blob checked against its digest and size."""
    with tarfile.open(path) as archive:
        assert archive_json(archive, "oci-layout") == {"imageLayoutVersion": "1.0.0"}
        (entry,) = archive_json(archive, "index.json")["manifests"]
        manifest_data = blob(archive, entry["digest"])
        assert len(manifest_data) == entry["size"]
        manifest = json.loads(manifest_data)
        config_data = blob(archive, manifest["config"]["digest"])
        assert len(config_data) == manifest["config"]["size"]
        (layer,) = manifest["layers"]
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        compressed = blob(archive, layer["digest"])
        assert len(compressed) == layer["size"]
    config = json.loads(config_data)
    plain = gzip.decompress(compressed)
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(plain).hexdigest()}"]
    return entry, manifest, config, plain


def layer_members(plain: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(plain)) as layer:
        return {m.name: m for m in layer.getmembers()}


def pack(rootfs: Path, out: Path, name: str, epoch: int, config: dict) -> str:
    config_file = out.with_suffix(".config.json")
    config_file.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, str(PACKER), "--rootfs", str(rootfs), "--name", name,
         "--config", str(config_file), "--epoch", str(epoch), "--arch", "amd64",
         "--out", str(out)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_packer_is_reproducible_and_leaves_runtime_directories_empty(tmp_path: Path):
    rootfs = tmp_path / "rootfs"
    for directory in ("bin", "dev", "proc", "tmp", "etc"):
        (rootfs / directory).mkdir(parents=True)
    (rootfs / "bin" / "tool").write_text("#!/bin/sh\n")
    (rootfs / "bin" / "tool").chmod(0o755)
    os.link(rootfs / "bin" / "tool", rootfs / "bin" / "same-tool")
    (rootfs / "bin" / "alias").symlink_to("tool")
    (rootfs / "dev" / "leftover").write_text("x")
    (rootfs / "tmp" / "wheel.whl").write_text("x")
    (rootfs / "etc" / "late").write_text("x")
    os.utime(rootfs / "etc" / "late", (2_000_000_000, 2_000_000_000))
    epoch = 1_700_000_000
    first = pack(rootfs, tmp_path / "a.tar", "example/tool:1", epoch, {"User": "0"})
    second = pack(rootfs, tmp_path / "b.tar", "example/tool:1", epoch, {"User": "0"})
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    entry, _, config, plain = read_image(tmp_path / "a.tar")
    assert entry["annotations"] == {
        "io.containerd.image.name": "docker.io/example/tool:1",
        "org.opencontainers.image.ref.name": "1",
    }
    assert config["config"] == {"User": "0"}
    members = layer_members(plain)
    assert sorted(members) == [
        "bin", "bin/alias", "bin/same-tool", "bin/tool", "dev", "etc", "etc/late", "proc", "tmp",
    ]  # fmt: skip
    assert members["bin/same-tool"].islnk() or members["bin/tool"].islnk()
    assert members["bin/alias"].issym() and members["bin/alias"].linkname == "tool"
    assert max(m.mtime for m in members.values()) == epoch  # clamped, never later


def test_containerd_imports_what_the_packer_writes(tmp_path: Path, daemon: ctrd.Containerd):
    """Fast and offline: a busybox rootfs packed, imported and run by a real containerd."""
    rootfs = make_rootfs(tmp_path)
    config = {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/echo"], "Cmd": ["packed"]}
    pack(rootfs, tmp_path / "busybox.tar", "hotmount-test/busybox:1", 1_700_000_000, config)
    imported = daemon.ctr("images", "import", str(tmp_path / "busybox.tar"), timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert "docker.io/hotmount-test/busybox:1" in daemon.ctr("images", "ls", "-q").stdout.split()
    ran = run_in_image(daemon, "docker.io/hotmount-test/busybox:1")
    assert ran.stdout.strip() == "packed", ran.stderr


def run_in_image(
    daemon: ctrd.Containerd, reference: str, *argv: str, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`ctr run --rm` of the image: its own entrypoint, or `argv` instead."""
    return daemon.ctr(
        "run", "--rm", "--runtime", "io.containerd.runc.v2",
        "--runc-root", str(daemon.runc_root), "--fifo-dir", str(daemon.fifo_dir),
        *flags, reference, ctrd.new_id(), *argv,
        timeout=120,
    )  # fmt: skip


def test_build_script_exit_codes_say_why_it_cannot_build(tmp_path: Path):
    """The codes callers (this file, tests/k8s) skip on: 3 where it cannot build, 2 for
    bad usage, and nothing written either way."""
    script = ["bash", str(REPO / "scripts" / "build-image.sh")]
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    as_user = drop if os.geteuid() == 0 else []
    if as_user and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run the script as another user")
    out = tmp_path / "agent.oci.tar"
    tmp_path.chmod(0o777)
    done = subprocess.run(
        [*as_user, *script, str(out)], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout) == (3, ""), done.stderr
    assert "root" in done.stderr
    done = subprocess.run([*script, "a", "b"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert "usage" in done.stderr
    assert not out.exists()


def test_built_image_carries_the_dockerfiles_settings(image: AgentImage):
    entry, _, config, _ = read_image(image.archive)
    assert entry["annotations"]["io.containerd.image.name"] == image.containerd_name
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == image.tag
    assert entry["platform"] == {"architecture": config["architecture"], "os": "linux"}
    steps = instructions()
    settings = config["config"]
    entrypoint = next(a for word, a in steps if word == "ENTRYPOINT")
    assert settings["Entrypoint"] == json.loads(entrypoint)
    assert settings["User"] == next(a for word, a in steps if word == "USER")
    env = dict(e.split("=", 1) for e in settings["Env"])
    for word, args in steps:
        if word == "ENV":
            for assignment in shlex.split(args):
                name, _, value = assignment.partition("=")
                if name == "PATH":
                    assert env["PATH"].startswith(value.removesuffix(":$PATH") + ":")
                else:
                    assert env[name] == value, name
        elif word == "EXPOSE":
            assert f"{args}/tcp" in settings["ExposedPorts"]


def not_for_an_image(name: str) -> bool:
    """Build leftovers and bulk a runtime image does without."""
    if name.startswith(("var/lib/apt/lists/", "usr/share/man/", "usr/share/info/")):
        return not name.endswith(("/lock", "/partial"))
    if name.startswith("usr/share/doc/") and name.count("/") > 3:
        return name.count("/") > 4 or not name.endswith("/copyright")
    runtime = ("tmp/", "dev/", "proc/", "sys/", "root/.cache/", "var/cache/pip")
    return name.startswith(runtime) or name in ("etc/resolv.conf", "etc/hostname")


def test_built_image_is_lean_and_holds_what_the_agent_needs(image: AgentImage):
    _, _, _, plain = read_image(image.archive)
    members = layer_members(plain)
    print(f"\nimage: {len(plain) / 2**20:.0f} MiB uncompressed, {len(members)} entries")
    for needed in (
        "opt/gpu-hotmount/bin/hotmount-agent",
        "opt/gpu-hotmount/bin/hotmount-engine",
        "usr/local/lib/gpu-hotmount/install-agent.sh",
        "usr/local/lib/gpu-hotmount/healthcheck.py",
        "usr/bin/nsenter",
        "usr/bin/python3",
    ):
        assert needed in members, f"{needed} is missing"
    leftovers = [name for name in members if not_for_an_image(name)]
    assert leftovers == []
    wheels = [n for n in members if n.endswith(".whl") and "/gpu_hotmount-" in n]
    assert wheels == [], "the project's wheel stayed in the image"


def test_containerd_imports_and_runs_the_built_agent_image(
    image: AgentImage, daemon: ctrd.Containerd, tmp_path: Path
):
    imported = daemon.ctr("images", "import", str(image.archive), timeout=300)
    assert imported.returncode == 0, imported.stderr
    assert image.containerd_name in daemon.ctr("images", "ls", "-q").stdout.split()

    helped = run_in_image(daemon, image.containerd_name, "hotmount-agent", "--help")
    assert helped.returncode == 0 and "--listen" in helped.stdout, helped.stderr

    # The engine's inventory, from NVML as on a GPU node: pynvml in the image loads the
    # fake libnvidia-ml.so.1 from a host directory, as a DaemonSet's hostPath gives it.
    if fake_nvml.gcc() is None:
        cannot("gcc is needed to build the fake libnvidia-ml.so.1")
    nvml = fake_nvml.build(tmp_path / "nvml")
    fake_nvml.write_config(nvml / "gpus.conf", NVML_GPUS)
    host = build_host(tmp_path / "host")
    listed = run_in_image(
        daemon, image.containerd_name,
        "hotmount-engine", "devices", "-o", "json", "--host-root", "/host",
        "--state-dir", "/tmp/state",
        flags=(
            "--mount", f"type=bind,src={host},dst=/host,options=rbind:ro",
            "--mount", f"type=bind,src={nvml},dst=/nvml,options=rbind:ro",
            "--env", "LD_LIBRARY_PATH=/nvml", "--env", "FAKE_NVML_CONFIG=/nvml/gpus.conf",
        ),
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    gpus = [d["uuid"] for d in json.loads(listed.stdout) if d["kind"] == "gpu"]
    assert gpus == [gpu.uuid for gpu in NVML_GPUS]


def test_the_built_image_serves_its_healthcheck(
    image: AgentImage, daemon: ctrd.Containerd, tmp_path: Path
):
    """The agent started in the image, with the host's cgroup tree mounted as the
    DaemonSet mounts it (read-only here): it comes up, and the image's own healthcheck
    script (as docker/podman run it) says it is healthy."""
    imported = daemon.ctr("images", "import", str(image.archive), timeout=300)
    assert imported.returncode == 0, imported.stderr
    port, container, log = free_port(), ctrd.new_id(), tmp_path / "agent.log"
    argv = ["hotmount-agent", "--no-kubernetes", "--anonymous", "--listen", f"127.0.0.1:{port}"]
    argv += ["--state-dir", "/tmp/state", "--no-use-nvml"]
    started = daemon.ctr(
        "run", "--detach", "--log-uri", f"file://{log}", "--net-host",
        "--mount", "type=bind,src=/sys/fs/cgroup,dst=/sys/fs/cgroup,options=rbind:ro",
        "--runtime", "io.containerd.runc.v2",
        "--runc-root", str(daemon.runc_root), "--fifo-dir", str(daemon.fifo_dir),
        image.containerd_name, container, *argv,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    url = f"http://127.0.0.1:{port}/healthz"
    check = ["env", f"HOTMOUNT_HEALTHCHECK_URL={url}", "/opt/gpu-hotmount/bin/python"]
    check += ["/usr/local/lib/gpu-hotmount/healthcheck.py"]
    deadline = time.monotonic() + 60
    for attempt in range(10_000):
        healthy = daemon.ctr(
            "task", "exec", "--exec-id", f"health-{attempt}", "--fifo-dir",
            str(daemon.fifo_dir), container, *check,
        )  # fmt: skip
        if healthy.returncode == 0:
            break
        running = daemon.tasks().get(container, (0, "GONE"))[1] == "RUNNING"
        assert running, f"the agent exited: {log.read_text()[-3000:] if log.exists() else ''}"
        assert time.monotonic() < deadline, healthy.stderr
        time.sleep(0.5)
