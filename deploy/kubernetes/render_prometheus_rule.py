"""Write base/prometheusrule.yaml from deploy/prometheus/alerts.yml, the one source of the alert rules.

Run `.venv/bin/python deploy/kubernetes/render_prometheus_rule.py` after changing alerts.yml;
tests/unit/test_kubernetes.py fails while the two differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parent / "prometheus" / "alerts.yml"
TARGET = HERE / "base" / "prometheusrule.yaml"
HEADER = """\
# Generated from deploy/prometheus/alerts.yml by deploy/kubernetes/render_prometheus_rule.py: do not edit.
# Regenerate with `.venv/bin/python deploy/kubernetes/render_prometheus_rule.py`.
"""


class _Dumper(yaml.SafeDumper):
    """Indents a list under its key, as alerts.yml and the other manifests do."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        """Never indentless."""
        super().increase_indent(flow, False)


def render() -> str:
    """The PrometheusRule manifest whose groups are the groups of alerts.yml."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "order-service", "labels": {"app.kubernetes.io/name": "order-service"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


def main() -> None:
    """Write the manifest next to the other base objects."""
    TARGET.write_text(render())


if __name__ == "__main__":
    main()
