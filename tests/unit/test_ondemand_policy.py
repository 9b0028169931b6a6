"""A pod's on-demand annotations (agent/ondemand/policy.py): what they ask for, and a
clear line naming the annotation for anything else."""

from __future__ import annotations

import pytest

from agent.ondemand.policy import OnDemand, on_demand_of

ON = "hotmount.io/gpu-on-demand"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, None),
        ({ON: "true"}, OnDemand()),
        ({ON: "1"}, OnDemand()),
        ({ON: " 2 "}, OnDemand(count=2)),
        ({ON: "count=2,model=NVIDIA A100-SXM4-80GB"}, OnDemand(2, "NVIDIA A100-SXM4-80GB")),
        ({ON: "model=NVIDIA L4"}, OnDemand(1, "NVIDIA L4")),
        (
            {ON: "1", f"{ON}-idle": "20s", f"{ON}-priority": "10"},
            OnDemand(1, None, 20.0, 10),
        ),
    ],
)
def test_what_a_pod_asks_for(annotations: dict[str, str], expected: OnDemand | None) -> None:
    assert on_demand_of(annotations) == expected


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({ON: "yes please"}, "hotmount.io/gpu-on-demand: 'yes please' is not an on-demand"),
        ({ON: "0"}, "is not a whole number from 1 to 8"),
        ({ON: "count=9"}, "is not a whole number from 1 to 8"),
        ({ON: "count=1,colour=red"}, "write a count"),
        ({ON: "model="}, "write a count"),
        ({ON: "1", f"{ON}-idle": "20"}, "hotmount.io/gpu-on-demand-idle: '20' is not a duration"),
        ({ON: "1", f"{ON}-priority": "-1"}, "gpu-on-demand-priority: '-1' is not a whole"),
    ],
)
def test_a_bad_annotation_is_a_clear_error_naming_it(
    annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        on_demand_of(annotations)
