#!/usr/bin/env python3
"""Holds every dashboard and alert query to the metric names a running hisparsed exports.

Starts the real daemon (on a temporary socket, /metrics on a port the kernel picks), scrapes
/metrics, and fails when any PromQL expression of a Grafana dashboard (targets[].expr) or of a
rules file (plain Prometheus `groups:` or a PrometheusRule manifest's `spec.groups`) selects a
series name the daemon does not export. Histograms count as NAME_bucket, NAME_sum and NAME_count,
summaries as NAME, NAME_sum and NAME_count, as Prometheus stores them. Names Prometheus makes
itself for each target (up, scrape_*) and the names recording rules in the given files define
are allowed too.

  check_metric_names.py --daemon build/bin/hisparsed FILE...   exit 0 clean, 1 problems
  check_metric_names.py --self-test                            the PromQL name extraction

ctest runs both (tests/CMakeLists.txt: MonitoringQueriesUseExportedMetrics and its self-test).
"""

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import yaml
except ImportError:  # reported where a rules file needs it
    yaml = None

# Series Prometheus itself adds for every scraped target, and the alerting series it keeps.
PROMETHEUS_SERIES = {
    "up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
    "scrape_series_added", "ALERTS", "ALERTS_FOR_STATE",
}
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile",
}
# Words followed by a parenthesised label list, not by an expression.
LABEL_LIST_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
OTHER_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
GRAFANA_INTERVALS = re.compile(r"\$__rate_interval|\$__interval|\$__range|\$\{__rate_interval\}|\$\{__interval\}")
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


class PromqlError(ValueError):
    pass


def _skip_string(text, i):
    """Returns the index after the string literal that starts at text[i]."""
    quote = text[i]
    i += 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    raise PromqlError(f"unterminated string at column {i}")


def _label_matchers(text, i, names):
    """Parses {...} from text[i] == '{'; adds a __name__="x" matcher's x to names. Returns the end."""
    i += 1
    while True:
        while i < len(text) and text[i] in " \t\n,":
            i += 1
        if i >= len(text):
            raise PromqlError("unterminated {")
        if text[i] == "}":
            return i + 1
        m = IDENT.match(text, i)
        if not m:
            raise PromqlError(f"label name expected at column {i + 1}")
        label = m.group(0)
        i = m.end()
        while i < len(text) and text[i] in " \t\n":
            i += 1
        op = re.compile(r"=~|!~|!=|=").match(text, i)
        if not op:
            raise PromqlError(f"label matcher operator expected at column {i + 1}")
        i = op.end()
        while i < len(text) and text[i] in " \t\n":
            i += 1
        if i >= len(text) or text[i] not in "\"'`":
            raise PromqlError(f"label value string expected at column {i + 1}")
        end = _skip_string(text, i)
        if label == "__name__":
            if op.group(0) != "=":
                raise PromqlError("a __name__ regex cannot be checked against the exported names")
            names.add(text[i + 1:end - 1])
        i = end


def _skip_parens(text, i):
    """Returns the index after the (...) that starts at text[i], skipping strings inside."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c in "\"'`":
            i = _skip_string(text, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise PromqlError("unbalanced (")


def metric_names(expr):
    """The series names a PromQL expression selects (Grafana's interval variables allowed)."""
    text = GRAFANA_INTERVALS.sub("5m", expr)
    names = set()
    depth = 0  # open parentheses
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif c == "#":
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl + 1
        elif c in "\"'`":
            i = _skip_string(text, i)
        elif c == "{":
            i = _label_matchers(text, i, names)
        elif c == "[":
            end = text.find("]", i)
            if end < 0:
                raise PromqlError("unterminated [")
            if not re.fullmatch(r"[0-9a-zA-Z:. ]+", text[i + 1:end]):
                raise PromqlError(f"not a range or subquery at column {i + 1}: {text[i:end + 1]}")
            i = end + 1
        elif c.isdigit() or (c == "." and i + 1 < len(text) and text[i + 1].isdigit()):
            m = re.compile(r"[0-9A-Za-z_.]+(?:[eE][+-][0-9]+)?").match(text, i)
            i = m.end()
        elif c == "$":
            raise PromqlError(f"a template variable outside a label value at column {i + 1}: {text[i:i + 20]}")
        elif IDENT.match(text, i):
            m = IDENT.match(text, i)
            word = m.group(0)
            i = m.end()
            j = i
            while j < len(text) and text[j].isspace():
                j += 1
            lower = word.lower()
            if lower in LABEL_LIST_WORDS:
                if j < len(text) and text[j] == "(":
                    i = _skip_parens(text, j)
            elif lower in AGGREGATIONS or lower in OTHER_KEYWORDS:
                pass
            elif j < len(text) and text[j] == "(":
                pass  # a function call: its arguments are read as the loop goes on
            else:
                names.add(word)
        else:
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth < 0:
                raise PromqlError(f"unbalanced ) at column {i + 1}")
            i += 1  # operators and punctuation
    if depth != 0:
        raise PromqlError("unbalanced (")
    return names


def exported_names(exposition):
    """Series names of a Prometheus text exposition: every # TYPE family, with its suffixes."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) != 4:
                continue
            family, kind = parts[2], parts[3]
            if kind == "histogram":
                names.update({family + "_bucket", family + "_sum", family + "_count"})
            elif kind == "summary":
                names.update({family, family + "_sum", family + "_count"})
            else:
                names.add(family)
        elif line and not line.startswith("#"):
            names.add(IDENT.match(line).group(0))
    return names


def queries_of(path):
    """(where, expr) of every query in a dashboard JSON or a rules YAML file, and recorded names."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out, recorded = [], set()
    if path.endswith(".json"):
        dash = json.loads(text)

        def walk(panels):
            for p in panels:
                walk(p.get("panels", []))
                for t in p.get("targets", []):
                    if t.get("expr"):
                        out.append((f'{path}: panel {p.get("id")} "{p.get("title")}" {t.get("refId")}', t["expr"]))

        walk(dash.get("panels", []))
        for v in dash.get("templating", {}).get("list", []):
            q = v.get("query")
            if v.get("type") == "query" and isinstance(q, dict):
                q = q.get("query")
            if v.get("type") == "query" and isinstance(q, str):
                m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*[A-Za-z_]+\s*\)\s*", q)
                if m and m.group(1):
                    out.append((f"{path}: variable {v.get('name')}", m.group(1)))
        return out, recorded
    if yaml is None:
        raise SystemExit("check_metric_names: python3-yaml is needed to read " + path)
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        groups = doc.get("spec", {}).get("groups") if doc.get("kind") == "PrometheusRule" else doc.get("groups")
        for g in groups or []:
            for r in g.get("rules", []):
                name = r.get("alert") or r.get("record")
                out.append((f"{path}: group {g.get('name')} rule {name}", str(r.get("expr", ""))))
                if r.get("record"):
                    recorded.add(r["record"])
    return out, recorded


def check(queries, exported):
    """Problems, one line each, of queries [(where, expr)] against the exported names."""
    problems = []
    for where, expr in queries:
        try:
            names = metric_names(expr)
        except PromqlError as e:
            problems.append(f"{where}: cannot read the query ({e}): {expr}")
            continue
        if not names:
            problems.append(f"{where}: selects no metric: {expr}")
        for n in sorted(names - exported):
            problems.append(f"{where}: {n} is not exported by hisparsed")
    return problems


def scrape_daemon(daemon):
    """Starts daemon on a temporary socket with metrics on a kernel-chosen port; returns /metrics."""
    with tempfile.TemporaryDirectory(prefix="hisparse-metric-names-") as tmp:
        sock = os.path.join(tmp, "hisparsed.sock")
        cmd = [daemon, "--listen", "unix:" + sock, "--host-pool-size", "64MiB", "--host-pool-slab-size", "16MiB",
               "--set", "host_pool.mlock=false", "--set", "host_pool.hugepages=off", "--device", "host",
               "--metrics-listen", "127.0.0.1:0"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log = []
        try:
            url = None
            deadline = time.monotonic() + 30
            while url is None and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stderr], [], [], 0.5)
                if not ready:
                    continue
                line = proc.stderr.readline()
                if not line:
                    break  # the daemon exited
                log.append(line)
                m = re.search(r"metrics on (http://\S+/metrics)", line)
                if m:
                    url = m.group(1)
            if url is None:
                raise SystemExit("check_metric_names: hisparsed did not serve /metrics:\n" + "".join(log))
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.read().decode("utf-8")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stderr.close()


def self_test():
    cases = {
        'sum by (instance, state) (hisparse_host_pool_bytes{instance=~"$instance"})': {"hisparse_host_pool_bytes"},
        "histogram_quantile(0.99, sum by (le, method) (rate(hisparse_rpc_duration_seconds_bucket[$__rate_interval])))":
            {"hisparse_rpc_duration_seconds_bucket"},
        "a / on(x) group_left(y) b offset 5m > bool 0.5 unless c": {"a", "b", "c"},
        '{__name__="hisparse_up", job=~"h.*"} == 0 or absent(up{job="hisparse"})': {"hisparse_up", "up"},
        'max_over_time(x:rate5m[1h:1m]) > 1e-3 and sum without(gpu)(y) # a comment naming z\n': {"x:rate5m", "y"},
        'label_replace(m, "dst", "$1", "src", "(.*)")': {"m"},
        "topk(3, sum(rate(m_total[5m])) by (reason))": {"m_total"},
        "count(m) == 0 and time() - process_start_time_seconds > 60": {"m", "process_start_time_seconds"},
    }
    bad = 0
    for expr, want in cases.items():
        got = metric_names(expr)
        if got != want:
            print(f"FAIL metric_names({expr!r}) = {sorted(got)}, want {sorted(want)}")
            bad += 1
    for expr in ['m{a="x}', "rate(m[5m]", "m{a}", "rate(m[$interval])"]:
        try:
            metric_names(expr)
            print(f"FAIL metric_names({expr!r}) did not refuse it")
            bad += 1
        except PromqlError:
            pass
    exported = exported_names(
        "# TYPE h histogram\nh_bucket{le=\"1\"} 0\n# TYPE c_total counter\n# TYPE s summary\ns{quantile=\"0.5\"} 1\n")
    if exported != {"h_bucket", "h_sum", "h_count", "c_total", "s", "s_sum", "s_count"}:
        print(f"FAIL exported_names: {sorted(exported)}")
        bad += 1
    problems = check([("q", "rate(c_total[5m]) + h_bucket + rate(bytes_fetched_total[5m]) + h")], exported)
    if [p.split(": ", 1)[1] for p in problems] != ["bytes_fetched_total is not exported by hisparsed",
                                                   "h is not exported by hisparsed"]:
        print(f"FAIL check did not name exactly the unexported names: {problems}")
        bad += 1
    print(f"check_metric_names self-test: {len(cases) + 7} cases, {bad} failed")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daemon", help="the hisparsed binary to start and scrape")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("files", nargs="*", help="Grafana dashboards (.json) and rules files (.yaml)")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.daemon or not args.files:
        ap.error("--daemon and at least one file are needed")
    queries, recorded = [], set()
    for path in args.files:
        q, r = queries_of(path)
        if not q:
            print(f"FAIL {path}: no queries found")
            return 1
        queries += q
        recorded |= r
    exposition = scrape_daemon(args.daemon)
    exported = exported_names(exposition)
    problems = check(queries, exported | recorded | PROMETHEUS_SERIES)
    for p in problems:
        print("FAIL " + p)
    ours = sorted(n for n in exported if n.startswith(("hisparse_", "process_")))
    print(f"check_metric_names: {len(queries)} queries in {len(args.files)} files against {len(ours)} series "
          f"names hisparsed exports: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
