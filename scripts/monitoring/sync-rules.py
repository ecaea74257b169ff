#!/usr/bin/env python3
"""Keeps ivory's monitoring files in step with their one source each (Python 3, standard library).

    python3 scripts/monitoring/sync-rules.py            writes the generated files
    python3 scripts/monitoring/sync-rules.py --check    exits 1 naming each stale file or problem
    python3 scripts/monitoring/sync-rules.py --dashboard-rules FILE
                                                        writes the dashboard's queries as recording
                                                        rules, for `promtool check rules` to parse
    python3 scripts/monitoring/sync-rules.py --extract-rules RENDERED FILE
                                                        writes the rules of the PrometheusRule that
                                                        `helm template`/`kustomize build` rendered

Sources: deploy/monitoring/ivory-alerts.rules.yaml (the alerts) and
deploy/monitoring/ivory-dashboard.json (the dashboard). Generated from them:

* deploy/monitoring/prometheusrule.yaml: the same groups in a PrometheusRule (kustomize);
* deploy/helm/ivory/files/ivory-alerts.rules.yaml: the chart's copy (Helm reads only files
  inside the chart; templates/prometheusrule.yaml wraps it);
* deploy/monitoring/queries.json: every PromQL expression of the panels and the alerts, with an
  id, the metrics it reads and which of those ivory does not export yet.

--check also holds the sources to what the generated files and the runbooks rely on: every alert
has a severity, a summary, a description and a runbook_url whose anchor is a section of
docs/runbooks.md; every panel queries the `${datasource}` variable; every `ivory_` metric named is
one ivory exports (IVORY_METRICS, read from crates/ivory-server/src/metrics.rs) or one listed as
proposed (PROPOSED_METRICS).

The rules file is read line by line, not by a YAML library (none in the standard library): the
text is copied as is, and only `- alert:`, `expr:` and `severity:`/`runbook_url:` lines are
interpreted. `promtool check rules` parses it properly (scripts/monitoring-check.sh).
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = "deploy/monitoring/ivory-alerts.rules.yaml"
PROMETHEUS_RULE = "deploy/monitoring/prometheusrule.yaml"
CHART_RULES = "deploy/helm/ivory/files/ivory-alerts.rules.yaml"
CHART_DASHBOARD = "deploy/helm/ivory/files/ivory-dashboard.json"
DASHBOARD = "deploy/monitoring/ivory-dashboard.json"
QUERIES = "deploy/monitoring/queries.json"
RUNBOOKS = "docs/runbooks.md"

# What ivory serves on /metrics (OpenMetrics: counters carry `_total`, histograms `_bucket`,
# `_sum` and `_count`). Kept by hand from crates/ivory-server/src/metrics.rs and
# metrics/trust_root.rs: a query naming anything else is a typo or a metric still to add.
IVORY_METRICS = {
    "ivory_admission_duration_seconds_bucket",
    "ivory_admission_duration_seconds_sum",
    "ivory_admission_duration_seconds_count",
    "ivory_admission_in_flight",
    "ivory_admission_panics_total",
    "ivory_deadline_expiries_total",
    "ivory_policy_load_errors",
    "ivory_policy_load_failures_total",
    "ivory_policies_loaded",
    "ivory_registry_requests_total",
    "ivory_registry_errors_total",
    "ivory_registry_throttled_total",
    "ivory_policy_results_total",
    "ivory_reports_written_total",
    "ivory_reports_dropped_total",
    "ivory_http_connections_refused_total",
    "ivory_http_requests_refused_total",
    "ivory_verify_cache_hits_total",
    "ivory_verify_cache_negative_hits_total",
    "ivory_verify_cache_misses_total",
    "ivory_verify_cache_coalesced_total",
    "ivory_l2_events_total",
    "ivory_l2_calls_total",
    "ivory_l2_call_seconds_total",
    "ivory_revocation_crl_age_seconds",
    "ivory_revocation_crl_next_update_seconds",
    "ivory_revocation_fetches_total",
    "ivory_trust_root_age_seconds",
    "ivory_trust_root_last_refresh_success_timestamp_seconds",
    "ivory_trust_root_refreshes_total",
    "ivory_resource_watch_objects",
    "ivory_resource_watch_bytes",
    "ivory_resource_watch_synced",
    "ivory_resource_watch_emptied_by_total_budget",
    "ivory_log_lines_dropped_total",
    "ivory_tls_certificate_expiry_timestamp_seconds",
    "ivory_http_connections_open",
    # The standard process collector's, unprefixed (crates/ivory-server/src/metrics/process.rs).
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
}

# Used by a panel or an alert, not exported yet (each needs a change in ivory-server).
PROPOSED_METRICS = {
}

# Label values a panel shows that ivory does not export yet (none now: the admission outcomes
# failed_closed, failed_open and warned are exported since issue 45).
PROPOSED_LABEL_VALUES = {}

# Read from other exporters, as a Kubernetes Prometheus stack scrapes them.
EXTERNAL_METRICS = {
    "up": "Prometheus (one per scrape target)",
    "kube_deployment_status_replicas_available": "kube-state-metrics",
    "kube_pod_container_resource_limits": "kube-state-metrics",
    "container_memory_working_set_bytes": "cAdvisor (kubelet)",
    "container_cpu_usage_seconds_total": "cAdvisor (kubelet)",
}

# Values the dashboard's variables take in queries.json's `promql`: every series of a bare
# `ivory serve` scrape matches (=~".*" also matches a missing label).
VARIABLE_VALUES = {
    "namespace": ".*",
    "job": ".*",
    "webhook_timeout": "10",
    "__rate_interval": "5m",
}

GENERATED_NOTE = (
    "# GENERATED from {source}\n"
    "# by scripts/monitoring/sync-rules.py: edit the source and run the script\n"
    "# (scripts/monitoring-check.sh fails while this copy differs).\n"
)


def read(rel):
    return (ROOT / rel).read_text(encoding="utf-8")


def rules_body(text):
    """The rules file from its `groups:` line on (its header comment names it the source)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("groups:"):
            return "".join(lines[i:])
    raise SystemExit(f"{RULES}: no top-level `groups:` line")


def prometheus_rule(text):
    body = "".join(
        ("  " + line) if line.strip() else line for line in rules_body(text).splitlines(keepends=True)
    )
    return (
        GENERATED_NOTE.format(source=RULES)
        + "# The alerts as a prometheus-operator PrometheusRule, for the kustomize component\n"
        + "# deploy/monitoring (the chart renders its own from the same rules).\n"
        + "apiVersion: monitoring.coreos.com/v1\n"
        + "kind: PrometheusRule\n"
        + "metadata:\n"
        + "  name: ivory\n"
        + "  namespace: ivory-system\n"
        + "  labels:\n"
        + "    app.kubernetes.io/name: ivory\n"
        + "    app.kubernetes.io/component: monitoring\n"
        + "spec:\n"
        + body
    )


def chart_rules(text):
    return GENERATED_NOTE.format(source=RULES) + rules_body(text)


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def block_after(lines, i):
    """The value of the key on lines[i]: inline, or the block scalar (`|`, `>-`, ...) below it."""
    key_line = lines[i]
    value = key_line.split(":", 1)[1].strip()
    if value and value[0] not in "|>":
        return value.strip("'\""), i + 1
    folded = value.startswith(">")
    base = indent_of(key_line)
    block = []
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or indent_of(lines[j]) > base):
        block.append(lines[j])
        j += 1
    while block and not block[-1].strip():
        block.pop()
    width = min(indent_of(l) for l in block if l.strip())
    text = [l[width:] for l in block]
    if folded:
        return " ".join(t.strip() for t in text), j
    return "\n".join(t.rstrip() for t in text), j


def alerts(text):
    """[(name, fields)] for every `- alert:` rule; fields: expr, severity, summary, description,
    runbook_url (those present)."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)- alert:\s*(\S+)\s*$", lines[i])
        if not m:
            i += 1
            continue
        rule_indent = len(m.group(1))
        fields = {}
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or indent_of(lines[j]) > rule_indent):
            key = re.match(r"^\s*(expr|severity|summary|description|runbook_url):", lines[j])
            if key and not lines[j].lstrip().startswith("#"):
                fields[key.group(1)], j = block_after(lines, j)
            else:
                j += 1
        found.append((m.group(2), fields))
        i = j
    return found


def substitute(expr):
    def value(m):
        name = m.group(1) or m.group(2)
        if name not in VARIABLE_VALUES:
            raise SystemExit(f"{DASHBOARD}: variable ${name} has no value in VARIABLE_VALUES")
        return VARIABLE_VALUES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}


def metric_names(promql):
    """Metric names a PromQL expression reads: identifiers outside strings, label matchers,
    ranges and grouping clauses that are neither functions nor keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return sorted(names)


def proposed_label_values(promql):
    """`label="value"` for each proposed label value a matcher of `promql` names."""
    found = []
    for label, values in PROPOSED_LABEL_VALUES.items():
        for matcher in re.findall(rf'\b{label}\s*=~?\s*"([^"]*)"', promql):
            found += [f'{label}="{v}"' for v in values if re.search(rf"\b{v}\b", matcher)]
    return found


def dashboard_queries(dashboard):
    """[(id, expr)] of every panel target, rows' nested panels included."""
    out = []

    def walk(panels):
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                out.append((f"panel: {panel['title']} / {target['refId']}", target["expr"]))

    walk(dashboard["panels"])
    return out


def alert_queries(text):
    names = [name for name, _ in alerts(text)]
    out = []
    for name, fields in alerts(text):
        ident = f"alert: {name}"
        if names.count(name) > 1:
            ident += f" ({fields.get('severity', '?')})"
        out.append((ident, fields.get("expr", "")))
    return out


def queries_json(rules_text, dashboard):
    entries = []
    for source, pairs in ((DASHBOARD, dashboard_queries(dashboard)), (RULES, alert_queries(rules_text))):
        for ident, expr in pairs:
            promql = substitute(expr)
            metrics = metric_names(promql)
            entries.append(
                {
                    "id": ident,
                    "source": source,
                    "expr": expr,
                    "promql": promql,
                    "metrics": metrics,
                    "not_exported_yet": [m for m in metrics if m in PROPOSED_METRICS]
                    + proposed_label_values(promql),
                    "external": [m for m in metrics if m in EXTERNAL_METRICS],
                }
            )
    doc = {
        "description": (
            "Every PromQL expression of deploy/monitoring/ivory-dashboard.json and "
            "deploy/monitoring/ivory-alerts.rules.yaml. GENERATED by scripts/monitoring/sync-rules.py. "
            "expr: as written (Grafana variables); promql: with the variables below substituted, "
            "ready for /api/v1/query; not_exported_yet: metrics (or label values) ivory does not "
            "serve yet (the query, or that part of it, is empty until it does); external: metrics of "
            "other exporters."
        ),
        "variables": VARIABLE_VALUES,
        "proposed_metrics": PROPOSED_METRICS,
        "proposed_label_values": {k: list(v) for k, v in PROPOSED_LABEL_VALUES.items()},
        "external_metrics": EXTERNAL_METRICS,
        "queries": entries,
    }
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def generated():
    rules_text = read(RULES)
    dashboard = json.loads(read(DASHBOARD))
    return {
        PROMETHEUS_RULE: prometheus_rule(rules_text),
        CHART_RULES: chart_rules(rules_text),
        # The chart's copy for its Grafana ConfigMap, byte for byte (JSON holds no comment).
        CHART_DASHBOARD: read(DASHBOARD),
        QUERIES: queries_json(rules_text, dashboard),
    }


def prometheus_rule_spec(rendered):
    """The `spec:` of the one PrometheusRule in a stream of YAML documents, dedented into a rules
    file. Both renderers write `spec:` at column 0 and its body indented by two spaces."""
    docs = re.split(r"^---\s*$", rendered, flags=re.M)
    rules = [d for d in docs if re.search(r"^kind: PrometheusRule\s*$", d, re.M)]
    if len(rules) != 1:
        raise SystemExit(f"expected one PrometheusRule, found {len(rules)}")
    lines = rules[0].splitlines()
    start = lines.index("spec:") + 1
    body = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("  "):
            break
        body.append(line[2:])
    return "\n".join(body) + "\n"


def github_anchor(heading):
    """GitHub's anchor for a Markdown heading: lower case, spaces to hyphens, punctuation dropped."""
    anchor = heading.strip().lower()
    anchor = re.sub(r"[^\w\- ]", "", anchor)
    return anchor.replace(" ", "-")


def problems():
    """What the sources get wrong, one line each."""
    found = []
    rules_text = read(RULES)
    runbook_text = read(RUNBOOKS)
    anchors = {github_anchor(h) for h in re.findall(r"^#{1,6}\s+(.+)$", runbook_text, re.M)}
    rules = alerts(rules_text)
    if not rules:
        found.append(f"{RULES}: no alerts found")
    for name, fields in rules:
        for key in ("expr", "severity", "summary", "description", "runbook_url"):
            if key not in fields:
                found.append(f"{RULES}: {name} has no {key}")
        if fields.get("severity") not in (None, "warning", "critical"):
            found.append(f"{RULES}: {name}: severity {fields['severity']} is neither warning nor critical")
        url = fields.get("runbook_url", "")
        expected = f"{RUNBOOKS}#{name.lower()}"
        if url and url != expected:
            found.append(f"{RULES}: {name}: runbook_url is {url}, expected {expected}")
        if name.lower() not in anchors:
            found.append(f"{RUNBOOKS}: no section `## {name}` (the anchor its runbook_url names)")
    for section in re.findall(r"^## (Ivory\w+)$", runbook_text, re.M):
        if section not in {name for name, _ in rules}:
            found.append(f"{RUNBOOKS}: section {section} names no alert")

    dashboard = json.loads(read(DASHBOARD))
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource":
        found.append(f"{DASHBOARD}: no `datasource` variable of type datasource")
    ids = set()

    def walk(panels):
        for panel in panels:
            if panel["id"] in ids:
                found.append(f"{DASHBOARD}: panel id {panel['id']} used twice")
            ids.add(panel["id"])
            walk(panel.get("panels", []))
            if panel["type"] == "row":
                continue
            if panel.get("datasource", {}).get("uid") != "${datasource}":
                found.append(f"{DASHBOARD}: panel {panel['title']!r} does not use ${{datasource}}")
            if not panel.get("targets"):
                found.append(f"{DASHBOARD}: panel {panel['title']!r} has no query")
            for target in panel.get("targets", []):
                if target.get("datasource", {}).get("uid") != "${datasource}":
                    found.append(f"{DASHBOARD}: {panel['title']!r} {target['refId']} does not use ${{datasource}}")

    walk(dashboard["panels"])

    for ident, expr in dashboard_queries(dashboard) + alert_queries(rules_text):
        for metric in metric_names(substitute(expr)):
            known = metric in IVORY_METRICS or metric in PROPOSED_METRICS or metric in EXTERNAL_METRICS
            if not known:
                found.append(f"{ident}: metric {metric} is neither exported by ivory, proposed, nor external")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when stale or wrong")
    parser.add_argument("--dashboard-rules", metavar="FILE", help="write the dashboard queries as a rules file")
    parser.add_argument(
        "--extract-rules",
        nargs=2,
        metavar=("RENDERED", "FILE"),
        help="write the spec of the PrometheusRule in RENDERED (helm template or kustomize build output) as a rules file",
    )
    args = parser.parse_args()

    if args.extract_rules:
        rendered, out = args.extract_rules
        Path(out).write_text(prometheus_rule_spec(Path(rendered).read_text(encoding="utf-8")), encoding="utf-8")
        return 0

    if args.dashboard_rules:
        dashboard = json.loads(read(DASHBOARD))
        lines = ["groups:", "  - name: ivory-dashboard-queries", "    rules:"]
        for n, (ident, expr) in enumerate(dashboard_queries(dashboard)):
            lines.append(f"      # {ident}")
            lines.append(f"      - record: ivory_dashboard:query_{n}")
            lines.append(f"        expr: {json.dumps(substitute(expr))}")
        Path(args.dashboard_rules).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return 0

    files = generated()
    if not args.check:
        for rel, text in files.items():
            path = ROOT / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {rel}")
        found = problems()
    else:
        found = [
            f"{rel} is stale: run python3 scripts/monitoring/sync-rules.py"
            for rel, text in files.items()
            if not (ROOT / rel).exists() or (ROOT / rel).read_text(encoding="utf-8") != text
        ] + problems()
    for line in found:
        print(f"sync-rules: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
