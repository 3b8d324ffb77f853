#!/usr/bin/env bash
# The alert rules: `promtool check rules` and `promtool test rules` pass on
# deploy/prometheus/hisparse-alerts.yaml, and the PrometheusRule in deploy/kubernetes/base holds
# exactly the same groups (checked by promtool too). Skips (exit 77) without promtool (Debian:
# prometheus, which tools/install-deps.sh installs).
#   alert_rules_test.sh SOURCE_DIR PYTHON
set -euo pipefail
src="$1"
python="$2"
if ! command -v promtool >/dev/null; then
  echo "SKIP: promtool not installed (Debian: prometheus); the alert rules were not checked"
  exit 77
fi
rules="$src/deploy/prometheus/hisparse-alerts.yaml"
operator="$src/deploy/kubernetes/base/prometheusrule.yaml"
work="$(mktemp -d /tmp/hisparse-alerts.XXXXXX)"
trap 'rm -rf "$work"' EXIT

promtool check rules "$rules"
# promtool test rules reads rule_files relative to the test file.
promtool test rules "$src/deploy/prometheus/hisparse-alerts.test.yaml"
# The PrometheusRule's spec, as a plain rules file, must be the plain file's groups.
"$python" - "$rules" "$operator" "$work/operator-rules.yaml" <<'PY'
import sys
import yaml
plain = yaml.safe_load(open(sys.argv[1]))
doc = yaml.safe_load(open(sys.argv[2]))
if doc.get("kind") != "PrometheusRule":
    sys.exit(f"{sys.argv[2]}: kind {doc.get('kind')}, want PrometheusRule")
if doc["spec"] != plain:
    sys.exit(f"{sys.argv[2]}: spec.groups differs from {sys.argv[1]}: edit both")
yaml.safe_dump(doc["spec"], open(sys.argv[3], "w"))
print(f"PrometheusRule spec equals {sys.argv[1]}: {sum(len(g['rules']) for g in plain['groups'])} rules")
PY
promtool check rules "$work/operator-rules.yaml"
