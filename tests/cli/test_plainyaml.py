"""cli/plainyaml.py reads what `yaml.safe_load` reads, or declines (NOT_PLAIN).

Kubeconfigs as kubectl, kubeadm and the tests write them must be read without PyYAML
(that is the point); anything it reads must equal PyYAML's reading, and text PyYAML
refuses must be declined (so that PyYAML's error is the one shown).
"""

from __future__ import annotations

import string
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.plainyaml import NOT_PLAIN, load

KUBEADM = """apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUM=
    server: https://10.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    namespace: ml-team
    user: kubernetes-admin
  name: kubernetes-admin@kubernetes
current-context: kubernetes-admin@kubernetes
kind: Config
preferences: {}
users:
- name: kubernetes-admin
  user:
    client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUQ=
    client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlF
"""

# What kubectl config set-* writes: sequence items indented, quotes, a bool, an empty value.
KUBECTL = """apiVersion: v1
kind: Config
clusters:
  - name: "dev"
    cluster:
      server: 'https://dev.example.com'
      insecure-skip-tls-verify: true
contexts:
  -   name: dev
      context:
        cluster: dev
        user: ""
        namespace:
current-context: dev
users: []
"""


@pytest.mark.parametrize("text", [KUBEADM, KUBECTL])
def test_kubeconfigs_are_read_without_pyyaml(text: str) -> None:
    assert load(text) is not NOT_PLAIN
    assert load(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\n",  # a number
        "a: 2024-01-01\n",  # a date
        "a: ~\n",
        "a: b # a comment\n",
        "a: {b: c}\n",
        "a: [b]\n",
        "a: &x b\nc: *x\n",
        "a: !!str b\n",
        "a: |\n  b\n",
        "a: 'it''s'\n",
        'a: "t\\tb"\n',
        "a: b\n  c\n",  # a multi-line plain scalar
        "---\na: b\n",
        "- a\n",  # not a mapping
        "a: b\r\n",
        "a:\tb\n",
        "on: b\n",  # a bool key
        "a: b\na: c\n",  # a repeated key
        "a: b: c\n",
        "a:\n- - b\n",
        "",
        '{"a": "b"}\n',
    ],
)
def test_the_rest_is_left_to_pyyaml(text: str) -> None:
    assert load(text) is NOT_PLAIN


KEYS = st.sampled_from(
    ["name", "server", "user", "on", "yes", "null", "a.b", "x-y", "_k", "1", "k/v", "e\u00e9"]
)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.just({}),
    st.just([]),
    st.text(
        alphabet=string.ascii_letters + string.digits + " :#'\"-_/.@~=+,%\\\t{}[]&*!|>", max_size=12
    ),
    st.sampled_from(["true", "Off", "NULL", "y", "n", "0x1f", "1e3", ".inf", "a b", "https://h:1"]),
)
DOCS = st.dictionaries(
    KEYS,
    st.recursive(
        LEAVES,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
        max_leaves=8,
    ),
    min_size=1,
    max_size=4,
)


def pyyaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return NOT_PLAIN


@settings(max_examples=400, deadline=None)
@given(DOCS, st.sampled_from([False, True]))
def test_what_it_reads_pyyaml_reads_alike(doc: dict[str, Any], indent: bool) -> None:
    dumper = yaml.SafeDumper
    text = yaml.dump(doc, Dumper=dumper, default_flow_style=False, indent=4 if indent else 2)
    mine = load(text)
    assert mine is NOT_PLAIN or mine == yaml.safe_load(text), text


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(KUBEADM.splitlines() + KUBECTL.splitlines() + [
    "  - x", "- y", "a:", "  b: c", "    d:", "k: 'q'", 'k: "q"', "-", "  -", "x: null",
]), min_size=1, max_size=12))  # fmt: skip
def test_stitched_lines_are_read_alike_or_declined(lines: list[str]) -> None:
    """Lines of real kubeconfigs in any order and nesting: many are not YAML at all."""
    text = "\n".join(lines) + "\n"
    mine = load(text)
    assert mine is NOT_PLAIN or mine == pyyaml(text), text
