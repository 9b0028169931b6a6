"""`hotmount-agent --help` reads like an ordinary command, and its flags still parse."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.config import AgentSettings, load_settings

REPO = Path(__file__).resolve().parents[2]


def help_text() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "agent.main", "--help"],
        capture_output=True, text=True, timeout=240, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def option_lines(text: str) -> dict[str, str]:
    """`--flag[, --no-flag] [METAVAR]` -> the rest of its entry (help, wrapped lines joined)."""
    options: dict[str, str] = {}
    current = None
    for line in text.split("options:", 1)[1].split("\n\n", 1)[0].splitlines():
        if re.match(r"  -", line):
            head, _, rest = line.strip().partition("  ")
            assert head not in options, f"{head} appears twice"
            current = head
            options[head] = rest.strip()
        elif current:
            options[current] += " " + line.strip()
    return options


def test_help_is_one_line_per_option_with_metavars_and_defaults() -> None:
    text = help_text()
    assert text.startswith("usage: hotmount-agent ")
    assert not re.search(r"list\[|\bstr\b|\bPath\b|\bfloat\b|\bint\b|\bNone\b", text), text
    options = option_lines(text)
    flags = [h.split()[0].rstrip(",") for h in options]
    assert len(flags) == len(set(flags)), "an option is listed twice"
    for name in AgentSettings.model_fields:
        flag = "--" + name.replace("_", "-")
        [entry] = [h for h in options if h.split()[0].rstrip(",") == flag]
        assert options[entry], f"{flag} has no help"
        words = entry.replace(",", "").split()
        metavars = [w for w in words if not w.startswith("-")]
        assert all(re.fullmatch(r"[A-Z]+", m) for m in metavars), entry
    assert options["--listen ADDRESS"].startswith("HOST:PORT or unix:PATH")
    assert "(repeatable; default: 127.0.0.1:8080)" in options["--listen ADDRESS"]
    assert "(default: /run/gpu-hotmount/state)" in options["--state-dir DIR"]  # not split
    assert "(default: 10)" in options["--stop-grace SECONDS"]
    assert "--use-nvml, --no-use-nvml" in options
    assert "HOTMOUNT_RECONCILE_INTERVAL=5" in text  # the environment twins are explained


def test_flags_parse_and_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTMOUNT_STOP_GRACE", "7")
    monkeypatch.setenv("HOTMOUNT_RECONCILE_INTERVAL", "9")
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    settings = load_settings(
        ["--listen=0.0.0.0:8443", "--listen", "unix:/run/a.sock", "--no-use-nvml",
         "--stop-grace", "2", "--cdi-dir", "/x", "--state-dir=/tmp/s"]
    )  # fmt: skip
    assert settings.listen == ["0.0.0.0:8443", "unix:/run/a.sock"]
    assert settings.use_nvml is False and settings.kubernetes is True
    assert settings.stop_grace == 2.0  # the flag over HOTMOUNT_STOP_GRACE
    assert settings.reconcile_interval == 9.0  # the environment where no flag is given
    assert settings.node_name == "gpu-node-1" and settings.cdi_dir == ["/x"]
    assert settings.state_dir == Path("/tmp/s")


def test_a_bad_flag_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_:
        load_settings(["--no-such-flag"])
    assert exit_.value.code == 2


def test_rdma_resources_are_checked_at_start() -> None:
    settings = load_settings(
        ["--rdma-resource", "nvidia.com/sriov_rdma_vf",
         "--rdma-shared-resource", "rdma/hca_shared_devices_a=ens1f0,ens2f0"]
    )  # fmt: skip
    assert settings.rdma_resource == ["nvidia.com/sriov_rdma_vf"]
    assert settings.rdma_shared_resource == ["rdma/hca_shared_devices_a=ens1f0,ens2f0"]
    for bad in (["--rdma-resource", "sriov"], ["--rdma-shared-resource", "rdma/a=,"]):
        with pytest.raises(ValidationError):
            load_settings(bad)


def test_netdev_address_cidrs_are_networks_checked_at_start() -> None:
    """Repeatable, none by default; a host address (bits past the prefix) is no CIDR."""
    assert load_settings([]).netdev_address_cidr == []
    given = ["--netdev-address-cidr", "10.10.0.0/24", "--netdev-address-cidr=fd10::/64"]
    settings = load_settings(given)
    assert [str(n) for n in settings.netdev_address_cidr] == ["10.10.0.0/24", "fd10::/64"]
    for bad in ("10.10.0.5/24", "10.10.0.0/33", "eth0"):
        with pytest.raises(ValidationError, match="netdev_address_cidr"):
            load_settings(["--netdev-address-cidr", bad])


def test_the_dra_drivers_names_are_settings_checked_at_start() -> None:
    """Another DRA driver than NVIDIA's is named by flags alone; a name that the API
    would refuse (and that could change the pin claim's CEL) stops the agent at start."""
    from agent.books.dra import NVIDIA_NAMES, DraNames

    assert DraNames.of(load_settings([])) == NVIDIA_NAMES
    given = ["--dra-driver", "gpu.example.com", "--dra-gpu-class", "gpu.example.com",
             "--dra-uuid-attribute", "serial"]  # fmt: skip
    assert DraNames.of(load_settings(given)) == DraNames(
        "gpu.example.com", "gpu.example.com", "mig.nvidia.com", "serial"
    )
    for bad in (
        ["--dra-driver", 'gpu.example.com"].uuid'],
        ["--dra-gpu-class", "GPU class"],
        ["--dra-mig-class", ""],
        ["--dra-uuid-attribute", "uuid || true"],
    ):
        with pytest.raises(ValidationError, match="dra_"):
            load_settings(bad)
