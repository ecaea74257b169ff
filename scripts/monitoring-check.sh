#!/usr/bin/env bash
# Checks ivory's monitoring files (deploy/monitoring, the chart's ServiceMonitor and PrometheusRule,
# docs/runbooks.md) with a real Prometheus: Debian's `prometheus` package and its promtool.
#
#   scripts/monitoring-check.sh
#
# 1. scripts/monitoring/sync-rules.py --check: the PrometheusRule, the chart's copy of the rules
#    and queries.json are what the rules file and the dashboard generate; every alert has a
#    severity, a summary, a description and a runbook section; every metric named exists (or is
#    listed as proposed); every panel uses the ${datasource} variable.
# 2. promtool check rules: the rules file, the dashboard's queries (as recording rules), and the
#    PrometheusRules `helm template` and `kustomize build deploy/overlays/monitoring` render.
# 3. promtool test rules deploy/monitoring/tests/*.yaml: every alert fires when it should and
#    stays quiet when it should not.
#
# Exits non-zero on the first failure. Seconds once the tools are there.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
needs_pkgs promtool:prometheus python3:python3
needs_tools helm kustomize
needs_done

TOOLS="$PWD/.tools/bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { echo "monitoring-check: $*" >&2; }

step "generated files and references (sync-rules.py --check)"
python3 scripts/monitoring/sync-rules.py --check

step "promtool check rules: the rules file"
promtool check rules deploy/monitoring/ivory-alerts.rules.yaml

step "promtool check rules: the dashboard's queries"
python3 scripts/monitoring/sync-rules.py --dashboard-rules "$work/dashboard-rules.yaml"
promtool check rules "$work/dashboard-rules.yaml"

step "promtool check rules: the chart's PrometheusRule"
"$TOOLS/helm" template ivory deploy/helm/ivory --namespace ivory-system \
  --set monitoring.prometheusRule.enabled=true \
  --set monitoring.prometheusRule.runbookBaseURL=https://example.invalid/ivory/blob/main \
  --show-only templates/prometheusrule.yaml >"$work/helm.yaml"
python3 scripts/monitoring/sync-rules.py --extract-rules "$work/helm.yaml" "$work/helm-rules.yaml"
promtool check rules "$work/helm-rules.yaml"

step "promtool check rules: the kustomize component's PrometheusRule"
"$TOOLS/kustomize" build deploy/overlays/monitoring >"$work/kustomize.yaml"
python3 scripts/monitoring/sync-rules.py --extract-rules "$work/kustomize.yaml" "$work/kustomize-rules.yaml"
promtool check rules "$work/kustomize-rules.yaml"

step "promtool test rules: every alert fires and stays quiet"
promtool test rules deploy/monitoring/tests/*.yaml

step "all checks passed"
