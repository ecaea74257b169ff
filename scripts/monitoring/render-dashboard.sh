#!/usr/bin/env bash
# Renders docs/monitoring-panels.png, the dashboard's panels as one picture, from the Prometheus of
# the integration test `monitoring` (a live `ivory serve` scraped by Debian's prometheus while
# admissions, a registry outage and a cache flush happen): scripts/monitoring/render-panels.py
# draws each panel's queries with matplotlib. Run it after changing the dashboard.
#
#   scripts/monitoring/render-dashboard.sh [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
needs_pkgs prometheus:prometheus redis-server:redis-server docker-registry:docker-registry
needs_done
# Debian's python3 with its matplotlib (a python3 earlier on PATH may lack it).
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || {
  echo "render-dashboard.sh: needs Debian's python3-matplotlib (apt-get install python3-matplotlib)" >&2
  exit 1
}
out="$(realpath -m "${1:-docs/monitoring-panels.png}")"
IVORY_MONITORING_PNG="$out" cargo test -p ivory --test integration --locked -- --exact \
  monitoring::a_real_prometheus_answers_every_query_and_the_outage_alert_fires
echo "render-dashboard.sh: wrote $out" >&2
