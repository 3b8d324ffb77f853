// Checks the Grafana dashboard: well-formed JSON with the fields Grafana needs to import it, the
// panels hisparse's operators expect, every PromQL query parsed by Prometheus' own grammar
// (@prometheus-io/lezer-promql), and every metric of the list below shown.
//
// Usage: node check-grafana.mjs DASHBOARD.json   Exit status 0 clean, 1 problems (printed).
import { readFileSync } from "node:fs";
import { parser } from "@prometheus-io/lezer-promql";

// The series the dashboard must show (a histogram's _bucket), and the only ones it may query.
// Whether hisparsed exports each of them is checked against a running daemon, not here: ctest's
// MonitoringQueriesUseExportedMetrics (deploy/validate/check_metric_names.py).
const METRICS = [
  "hisparse_host_pool_bytes",
  "hisparse_sessions",
  "hisparse_requests",
  "hisparse_admissions_total",
  "hisparse_rejections_total",
  "hisparse_evictions_total",
  "hisparse_rpc_duration_seconds_bucket",
  "hisparse_resolve_hits_total",
  "hisparse_resolve_misses_total",
  "hisparse_resolve_fetched_bytes_total",
  "hisparse_serving",
  "hisparse_config_last_reload_successful",
  "hisparse_build_info",
  "hisparse_parked_requests",
  "hisparse_importing_requests",
  "hisparse_orphaned_requests",
  "hisparse_host_pool_fragmentation_ratio",
  "process_open_fds",
  "process_max_fds",
  "process_resident_memory_bytes",
  "process_cpu_seconds_total",
];

// Panels that must exist (by title) and a metric each must query.
const EXPECTED_PANELS = [
  ["Host pool bytes by state", "hisparse_host_pool_bytes"],
  ["Sessions and requests", "hisparse_sessions"],
  ["Admissions, rejections and evictions", "hisparse_rejections_total"],
  ["RPC latency p50 / p99", "hisparse_rpc_duration_seconds_bucket"],
  ["RESOLVE hit rate per session and GPU", "hisparse_resolve_misses_total"],
  ["RESOLVE fetch bandwidth per session and GPU", "hisparse_resolve_fetched_bytes_total"],
  ["Serving", "hisparse_serving"],
  ["Last config reload applied", "hisparse_config_last_reload_successful"],
  ["Descriptors used (share of RLIMIT_NOFILE)", "process_open_fds"],
  ["Daemon resident memory", "process_resident_memory_bytes"],
];

const file = process.argv[2];
if (!file) {
  console.error("usage: node check-grafana.mjs DASHBOARD.json");
  process.exit(2);
}
const problems = [];
const fail = (m) => problems.push(m);

let dash;
try {
  dash = JSON.parse(readFileSync(file, "utf8"));
} catch (e) {
  console.error(`FAIL ${file}: not valid JSON: ${e.message}`);
  process.exit(1);
}

for (const [key, type] of [["title", "string"], ["uid", "string"], ["schemaVersion", "number"], ["panels", "object"]]) {
  if (typeof dash[key] !== type) fail(`dashboard.${key} is missing or not a ${type}`);
}
if (!Array.isArray(dash.panels)) {
  console.error(`FAIL ${file}: dashboard.panels is not an array`);
  process.exit(1);
}
const vars = new Map((dash.templating?.list ?? []).map((v) => [v.name, v]));
if (vars.get("datasource")?.type !== "datasource" || vars.get("datasource")?.query !== "prometheus") {
  fail('no "datasource" variable of Prometheus data sources');
}

// Grafana variables -> something PromQL parses, before parsing.
const substitute = (expr) =>
  expr
    .replace(/\$__rate_interval|\$__interval|\$\{__rate_interval\}/g, "5m")
    .replace(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g, (m, name) => (vars.has(name) ? ".*" : m));

// Parses one PromQL expression; returns the metric names it selects, or null after recording why.
function parsePromql(expr, where) {
  const text = substitute(expr);
  const tree = parser.parse(text);
  const names = new Set();
  let error = null;
  tree.iterate({
    enter(node) {
      if (node.type.isError && error === null) error = node.from;
      if (node.name === "Identifier" && node.node.parent?.name === "VectorSelector") names.add(text.slice(node.from, node.to));
    },
  });
  if (error !== null) {
    fail(`${where}: PromQL does not parse at column ${error + 1}: ${text}`);
    return null;
  }
  return names;
}

const ids = new Set();
const used = new Set();
const titles = new Map();
const walk = (list) => {
  for (const p of list) {
    const where = `panel ${p.id} "${p.title}"`;
    if (typeof p.id !== "number" || ids.has(p.id)) fail(`${where}: id missing or repeated`);
    ids.add(p.id);
    const g = p.gridPos ?? {};
    if (![g.x, g.y, g.w, g.h].every(Number.isInteger) || g.x + g.w > 24) fail(`${where}: bad gridPos`);
    if (p.type === "row") {
      walk(p.panels ?? []);
      continue;
    }
    if (!["timeseries", "stat", "gauge", "bargauge", "table"].includes(p.type)) fail(`${where}: unexpected panel type ${p.type}`);
    if (p.datasource?.uid !== "${datasource}") fail(`${where}: datasource is not the \${datasource} variable`);
    const targets = p.targets ?? [];
    if (targets.length === 0) fail(`${where}: no queries`);
    const metrics = new Set();
    for (const t of targets) {
      if (typeof t.expr !== "string" || !t.expr) {
        fail(`${where}: target ${t.refId} has no expr`);
        continue;
      }
      const names = parsePromql(t.expr, `${where} ${t.refId}`);
      for (const n of names ?? []) {
        metrics.add(n);
        used.add(n);
        if (!METRICS.includes(n)) fail(`${where}: ${n} is not a hisparse metric`);
      }
      if (/histogram_quantile/.test(t.expr) && !/\ble\b/.test(t.expr)) fail(`${where}: histogram_quantile without le`);
    }
    titles.set(p.title, metrics);
  }
};
walk(dash.panels);

for (const [title, metric] of EXPECTED_PANELS) {
  if (!titles.has(title)) fail(`no panel "${title}"`);
  else if (!titles.get(title).has(metric)) fail(`panel "${title}" does not query ${metric}`);
}
for (const m of METRICS) if (!used.has(m)) fail(`no panel shows ${m}`);

if (problems.length) {
  for (const p of problems) console.error(`FAIL ${file}: ${p}`);
  console.error(`check-grafana: ${problems.length} problem(s)`);
  process.exit(1);
}
console.log(`check-grafana: ${file}: ${ids.size} panels, ${METRICS.length} hisparse metrics, every query parses: OK`);
