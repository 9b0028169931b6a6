"""kubectl apply's arithmetic: RFC 7386 merge patches, and what a spec changes in a pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.node.desired import (
    DesiredMount,
    DesiredMounts,
    Difference,
    difference,
    merge_patch,
)


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


def _spec(namespace: str, pod: str, uid: str = "u1") -> DesiredMount:
    return DesiredMount(namespace=namespace, pod=pod, uid=uid, spec={"count": 1},
                        annotations={}, created="2026-01-01T00:00:00+00:00")  # fmt: skip


def test_specs_of_the_longest_names_are_kept_read_and_deleted(tmp_path: Path) -> None:
    store = DesiredMounts(tmp_path)
    namespace, pod = "n" * 63, "p" * 253  # the longest namespace and pod names
    store.put(_spec(namespace, pod))
    assert store.get(namespace, pod, "u1") == _spec(namespace, pod)
    assert [len(p.name) for p in store.directory.iterdir()] == [69]
    store.delete(namespace, pod)
    assert store.get(namespace, pod) is None and store.all() == []


def test_files_of_the_old_names_are_renamed_once_and_read_as_before(tmp_path: Path) -> None:
    old = tmp_path / "desired" / "ml_nb_0123456789abcdef.json"
    old.parent.mkdir()
    old.write_text(_spec("ml", "nb").model_dump_json())
    (tmp_path / "desired" / "ml_broken_0123456789abcdef.json").write_text("{")
    store = DesiredMounts(tmp_path)
    assert store.get("ml", "nb", "u1") == _spec("ml", "nb")
    assert not old.exists()
    assert store.all() == [_spec("ml", "nb")]  # one file per pod, the broken one unread
    store.delete("ml", "nb")
    assert store.all() == []
