"""kubectl apply's arithmetic: RFC 7386 merge patches, and what a spec changes in a pod."""

from __future__ import annotations

import pytest

from agent.node.desired import Difference, difference, merge_patch


@pytest.mark.parametrize(
    ("target", "patch", "merged"),
    [  # RFC 7386, appendix A (a selection)
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_follows_rfc_7386(target: object, patch: object, merged: object) -> None:
    assert merge_patch(target, patch) == merged


def test_a_spec_by_name_keeps_exactly_its_devices() -> None:
    assert difference(["a", "b"], None, named=["b", "c"], by_count=[]) == Difference(
        mount=["a"], mount_count=0, unmount=["c"]
    )
    assert difference(["a"], None, named=[], by_count=["a", "d"]) == Difference(
        mount=[], mount_count=0, unmount=["d"]
    )


def test_a_spec_by_count_keeps_the_oldest_count_mounts_and_no_named_ones() -> None:
    assert difference(None, 3, named=["x"], by_count=["a"]) == Difference(
        mount=[], mount_count=2, unmount=["x"]
    )
    assert difference(None, 1, named=[], by_count=["a", "b", "c"]) == Difference(
        mount=[], mount_count=0, unmount=["b", "c"]
    )
    assert difference(None, 2, named=[], by_count=["a", "b"]) == Difference([], 0, [])
