"""Kubeconfig resolution as kubectl does it: which file, which context, which namespace."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.kubeconfig import KubeconfigError, context_namespace, load, resolve_path


def write(path: Path, current: str = "dev", contexts: dict[str, str | None] | None = None) -> Path:
    contexts = contexts if contexts is not None else {"dev": "ml", "prod": None}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [
                    {
                        "name": name,
                        "context": {
                            "cluster": "c",
                            "user": "u",
                            **({"namespace": ns} if ns else {}),
                        },
                    }
                    for name, ns in contexts.items()
                ],
                "current-context": current,
            }
        )
    )
    return path


def test_the_file_flag_then_env_then_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/from/env")
    assert resolve_path("/from/flag") == "/from/flag"
    assert resolve_path(None) == "/from/env"
    monkeypatch.delenv("KUBECONFIG")
    assert resolve_path(None) == "~/.kube/config"


def test_namespace_comes_from_the_context(tmp_path: Path) -> None:
    config = str(write(tmp_path / "config"))
    assert context_namespace(config) == "ml"
    assert context_namespace(config, "prod") == "default"
    with pytest.raises(KubeconfigError, match="'nope' not found"):
        context_namespace(config, "nope")


def test_kubeconfig_env_list_is_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write(tmp_path / "a", current="dev", contexts={"dev": "team-a"})
    second = write(tmp_path / "b", current="other", contexts={"other": "team-b"})
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert context_namespace() == "team-a"
    assert context_namespace(context="other") == "team-b"


def test_no_kubeconfig_means_default_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert context_namespace() == "default"
    with pytest.raises(KubeconfigError, match="no kubeconfig"):
        load()
    with pytest.raises(KubeconfigError, match="not found"):
        context_namespace(str(tmp_path / "missing"))


def test_load_resolves_server_and_token(tmp_path: Path) -> None:
    kube = load(str(write(tmp_path / "config")), "prod")
    assert (kube.context, kube.namespace, kube.server) == (
        "prod",
        "default",
        "https://10.0.0.1:6443",
    )
    from cli.kubeconfig import authorization

    assert authorization(kube.configuration) == "Bearer t0ken"
