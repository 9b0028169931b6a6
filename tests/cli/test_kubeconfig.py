"""Kubeconfig resolution as kubectl does it: which file, which context, which namespace."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from cli.client import HotmountClient
from cli.transport.kubeconfig import KubeconfigError, context_namespace, load, resolve_path
from tests.cli.conftest import Cluster


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


def test_a_kubeconfig_is_parsed_once_and_again_when_it_changes(tmp_path: Path) -> None:
    """A command reads it twice (namespace, then client): parsed once. A notebook kernel
    keeps the process: an edit to the file is seen at the next read."""
    from cli.transport import kubeconfig

    config = str(write(tmp_path / "config"))
    assert context_namespace(config) == "ml"
    assert kubeconfig._read(config) is kubeconfig._read(config)  # not parsed again
    write(tmp_path / "config", contexts={"dev": "ai", "prod": None})  # the same size
    assert context_namespace(config) == "ai"
    assert load(config).namespace == "ai"


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
    from cli.transport.kubeconfig import authorization

    assert authorization(kube.configuration) == "Bearer t0ken"


# -- static kubeconfigs are read without the official client, and read as it reads them ---

PEM_CA = "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"


def _b64(text: str) -> str:
    return base64.standard_b64encode(text.encode()).decode()


def _variants(tmp_path: Path) -> dict[str, tuple[dict, dict]]:
    """name -> (cluster, user): what static kubeconfigs hold, files relative to theirs."""
    (tmp_path / "pki").mkdir()
    for name in ("ca.crt", "client.crt", "client.key"):
        (tmp_path / "pki" / name).write_text(f"-----BEGIN X-----\n{name}\n-----END X-----\n")
    (tmp_path / "pki" / "token").write_text("from-a-file\n")
    https = "https://10.0.0.1:6443/"
    return {
        "token": ({"server": https}, {"token": "t0ken"}),
        "token file, relative": ({"server": https}, {"tokenFile": "pki/token"}),
        "basic auth": ({"server": https}, {"username": "ann", "password": "s3:cret"}),
        "certificate files, relative": (
            {"server": https, "certificate-authority": "pki/ca.crt"},
            {"client-certificate": "pki/client.crt", "client-key": "pki/client.key"},
        ),
        "inline data": (
            {"server": https, "certificate-authority-data": _b64(PEM_CA)},
            {"client-certificate-data": _b64("cert\n"), "client-key-data": _b64("key\n")},
        ),
        "data wins over file": (
            {
                "server": https,
                "certificate-authority": "pki/ca.crt",
                "certificate-authority-data": _b64(PEM_CA),
            },
            {"token": "t"},
        ),
        "insecure, SNI, proxy": (
            {
                "server": https,
                "insecure-skip-tls-verify": True,
                "tls-server-name": "kube.internal",
                "proxy-url": "http://proxy:3128",
            },
            {},
        ),
        "plain http": ({"server": "http://127.0.0.1:8080"}, {"token": "t"}),
    }


def _kubeconfig(path: Path, cluster: dict, user: dict, name: str = "c") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": name, "cluster": cluster}],
                "users": [{"name": name, "user": user}],
                "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
                "current-context": name,
            }
        )
    )
    return path


def _pem(cfg: object, file_attr: str, data_attr: str) -> str | None:
    """A certificate as text, from a file the loader names or data it holds."""
    data = getattr(cfg, data_attr, None)
    if data:
        return data.decode() if isinstance(data, bytes) else data
    path = getattr(cfg, file_attr)
    return Path(path).read_text() if path else None


@pytest.mark.parametrize(
    "variant",
    [
        "token",
        "token file, relative",
        "basic auth",
        "certificate files, relative",
        "inline data",
        "data wins over file",
        "insecure, SNI, proxy",
        "plain http",
    ],
)
def test_static_kubeconfig_reads_as_the_official_loader(tmp_path: Path, variant: str) -> None:
    from cli.transport.kubeconfig import StaticConfiguration, _plugin_configuration, authorization

    cluster, user = _variants(tmp_path)[variant]
    path = str(_kubeconfig(tmp_path / "config", cluster, user))
    mine = load(path).configuration
    assert isinstance(mine, StaticConfiguration)  # the official client was not needed
    official = _plugin_configuration(path, "c")
    for attr in ("host", "verify_ssl", "tls_server_name", "proxy"):
        assert getattr(mine, attr) == getattr(official, attr, None), attr
    # A token read from a file is stripped of its newline, as kubectl does.
    expected = (authorization(official) or "").strip() or None
    assert authorization(mine) == expected
    assert _pem(mine, "ssl_ca_cert", "ca_data") == _pem(official, "ssl_ca_cert", "-")
    assert _pem(mine, "cert_file", "cert_data") == _pem(official, "cert_file", "-")
    assert _pem(mine, "key_file", "key_data") == _pem(official, "key_file", "-")


def test_merged_list_first_file_wins_as_the_official_loader(tmp_path: Path) -> None:
    """`KUBECONFIG=a:b`: a user, cluster or context named in both is a's."""
    from cli.transport.kubeconfig import _plugin_configuration, authorization

    first = _kubeconfig(tmp_path / "a", {"server": "https://a:6443"}, {"token": "from-a"})
    second = _kubeconfig(tmp_path / "b", {"server": "https://b:6443"}, {"token": "from-b"})
    path = f"{first}:{second}"
    mine, official = load(path).configuration, _plugin_configuration(path, "c")
    assert (mine.host, authorization(mine)) == ("https://a:6443", "Bearer from-a")
    assert (official.host, authorization(official)) == (mine.host, authorization(mine))


def test_a_missing_certificate_file_is_a_kubeconfig_error(tmp_path: Path) -> None:
    cluster = {"server": "https://10.0.0.1:6443", "certificate-authority": "nope.crt"}
    path = str(_kubeconfig(tmp_path / "config", cluster, {"token": "t"}))
    with pytest.raises(KubeconfigError, match=r"cannot use context 'c' .*nope\.crt"):
        load(path)


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1])
def test_insecure_skip_tls_verify_must_be_a_yaml_boolean(tmp_path: Path, value: object) -> None:
    """kubectl's field is a bool; the string "false" is truthy, and must not turn
    verification off (nor is any other non-bool guessed at)."""
    cluster = {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": value}
    path = str(_kubeconfig(tmp_path / "config", cluster, {"token": "t"}))
    with pytest.raises(KubeconfigError, match="insecure-skip-tls-verify must be true or false"):
        load(path)


@pytest.mark.parametrize(("value", "verify"), [(True, False), (False, True)])
def test_insecure_skip_tls_verify_as_a_boolean(tmp_path: Path, value: bool, verify: bool) -> None:
    cluster = {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": value}
    path = str(_kubeconfig(tmp_path / "config", cluster, {"token": "t"}))
    assert load(path).configuration.verify_ssl is verify


@pytest.mark.parametrize(
    "user", [{"token": "t0ken"}, {"username": "ann", "password": "s3cret"}], ids=["bearer", "basic"]
)
@pytest.mark.parametrize("server", ["http://10.0.0.1:8080", "http://kube.example", "http://[::2]"])
def test_credentials_never_go_to_a_plain_http_server_on_the_network(
    tmp_path: Path, user: dict, server: str
) -> None:
    path = str(_kubeconfig(tmp_path / "config", {"server": server}, user))
    with pytest.raises(KubeconfigError, match="clear text") as refused:
        load(path)
    assert "t0ken" not in str(refused.value) and "s3cret" not in str(refused.value)


def test_a_plugin_user_on_plain_http_is_refused_before_the_plugin_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    plugin = {"apiVersion": "client.authentication.k8s.io/v1", "command": "touch"}
    plugin["args"] = [str(ran)]
    path = _kubeconfig(tmp_path / "config", {"server": "http://10.0.0.1:8080"}, {"exec": plugin})
    with pytest.raises(KubeconfigError, match="clear text"):
        load(str(path))
    assert not ran.exists()


@pytest.mark.parametrize(
    "server", ["http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]"]
)
def test_plain_http_to_loopback_or_without_credentials_is_allowed(
    tmp_path: Path, server: str
) -> None:
    path = str(_kubeconfig(tmp_path / "config", {"server": server}, {"token": "t"}))
    assert load(path).server == server
    bare = str(_kubeconfig(tmp_path / "bare", {"server": "http://10.0.0.1:8080"}, {}))
    assert load(bare).server == "http://10.0.0.1:8080"


def test_user_paths_resolve_against_the_users_own_file(tmp_path: Path) -> None:
    """KUBECONFIG=a/config:b/config with the cluster in a and the user in b: the user's
    relative certificate paths are b's (kubectl), not a's."""
    a, b = tmp_path / "a", tmp_path / "b"
    for directory in (a, b):
        (directory / "pki").mkdir(parents=True)
        for name in ("client.crt", "client.key"):
            (directory / "pki" / name).write_text(f"{directory.name}'s {name}")
    first = a / "config"
    first.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    second = b / "config"
    user = {"client-certificate": "pki/client.crt", "client-key": "pki/client.key"}
    second.write_text(yaml.safe_dump({"users": [{"name": "u", "user": user}]}))

    cfg = load(f"{first}:{second}").configuration

    assert Path(cfg.cert_file).read_text() == "b's client.crt"
    assert Path(cfg.key_file).read_text() == "b's client.key"


def test_inline_credentials_reach_a_tls_api_server(cluster: Cluster) -> None:
    """certificate-authority-data and client-certificate-data/-key-data, used for real:
    the fake API server verifies the client certificate and maps it to dave."""
    dave = cluster.ca.issue_client("dave", groups=["ml-team"])
    config = cluster.kubeconfig("inline", namespace="ml", cert=dave)
    data = yaml.safe_load(config.read_text())
    ca = Path(data["clusters"][0]["cluster"].pop("certificate-authority"))
    data["clusters"][0]["cluster"]["certificate-authority-data"] = _b64(ca.read_text())
    user = data["users"][0]["user"]
    user["client-certificate-data"] = _b64(Path(user.pop("client-certificate")).read_text())
    user["client-key-data"] = _b64(Path(user.pop("client-key")).read_text())
    config.write_text(yaml.safe_dump(data))
    with HotmountClient.from_kubeconfig(str(config)) as hm:
        assert hm.status("ml", "nb-0").containers[0].container == "main"
    (req,) = cluster.agent.received
    assert req.header("x-remote-user") == "dave"
