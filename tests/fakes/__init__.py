"""Test doubles that speak the real wire formats: kube-apiserver, kubelet PodResources, PKI."""

from tests.fakes.kube_apiserver import (
    AccessRule,
    ApiError,
    Attributes,
    FakeKubeApiServer,
    FrontProxy,
    TokenInfo,
)
from tests.fakes.pki import CertificateAuthority, CertPaths
from tests.fakes.podresources_server import FakePodResourcesServer

__all__ = [
    "AccessRule",
    "ApiError",
    "Attributes",
    "CertPaths",
    "CertificateAuthority",
    "FakeKubeApiServer",
    "FakePodResourcesServer",
    "FrontProxy",
    "TokenInfo",
]
