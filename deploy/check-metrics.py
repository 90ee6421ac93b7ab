#!/usr/bin/env python3
"""Every metric name the alert rules and the dashboard use is one a running server exports.

    deploy/check-metrics.py [FENCED_BIN]      # or FENCED_BIN=... deploy/check-metrics.py
    deploy/check-metrics.py --self-test       # only the checker's own negative controls

Starts the binary as a single server on a free loopback port with a temporary data
directory, does one lock acquire, one fenced-store write and one release over the
HTTP API, and scrapes GET /metrics; then starts a cluster of three on loopback
(--insecure-peers) and scrapes its leader, which alone exports the per-peer series
(fenced_raft_replication_lag_entries{peer}). Every metric name in the `expr`s of
deploy/prometheus/fenced-alerts.yml and in the dashboard's queries
(deploy/grafana/fenced-dashboard.json) must be the name of a sample one of those
scrapes carried: a histogram is used through its _bucket/_sum/_count series, which
are the sample names, so a bare histogram name is reported too. It also reports
rate()/increase() over a series that is not a counter's, and deriv()/predict_linear()
over a counter. Prometheus' own series (`up`, `scrape_*`) are skipped. Last, every
family the servers announce (# TYPE) must be named in docs/server.md's *Metrics* section.

The self-test runs first, every time: it feeds made-up names and misuses to the same
functions and fails unless each is reported (and a correct expression is not). The
servers are killed and the temporary directory removed on every path; the whole run
is bounded (DEADLINE_S).

Standard library only (CI's python3).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from checklib import Failure, free_ports, run

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "prometheus", "fenced-alerts.yml")
DASHBOARD = os.path.join(HERE, "grafana", "fenced-dashboard.json")
SERVER_DOC = os.path.join(os.path.dirname(HERE), "docs", "server.md")
DEADLINE_S = 30.0
START = time.monotonic()

# Series Prometheus makes itself at each scrape, not the server.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
             "scrape_samples_post_metric_relabeling", "scrape_series_added"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "atan2"}
COUNTER_FUNCS = {"rate", "irate", "increase", "resets"}
GAUGE_FUNCS = {"deriv", "predict_linear", "delta", "idelta"}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def left():
    return DEADLINE_S - (time.monotonic() - START)


# ---------------------------------------------------------------------------------
# Reading the rules file (YAML, without a YAML library) and the dashboard.

def rule_exprs(text):
    """[(rule name, expr, first line index, end line index)] of a Prometheus rules file.

    Handles `expr:` as a plain scalar (continued on more-indented lines), a quoted
    one-line scalar, or a block scalar (| or >). Fails on a rule with no or two exprs.
    """
    lines = text.splitlines()
    out, names = [], []
    current = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*(?:-\s+)?(alert|record):\s*(\S+)\s*$", line)
        if m:
            current = m.group(2).strip("'\"")
            names.append(current)
            i += 1
            continue
        m = re.match(r"^(\s*)(?:-\s+)?expr:\s*(.*)$", line)
        if not m:
            i += 1
            continue
        if current is None:
            raise Failure(f"line {i + 1}: expr before any alert or record")
        key_indent = len(m.group(1)) + (line.lstrip().startswith("-") and 2 or 0)
        first = m.group(2).rstrip()
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or
                                  len(lines[j]) - len(lines[j].lstrip()) > key_indent):
            j += 1
        while j > i + 1 and not lines[j - 1].strip():
            j -= 1
        body = lines[i + 1:j]
        if re.fullmatch(r"[|>][+-]?", first):
            expr = "\n".join(body)
        elif first[:1] in ("'", '"'):
            if body:
                raise Failure(f"line {i + 1}: a quoted expr over several lines is not read here")
            q = first[0]
            if not (len(first) >= 2 and first.endswith(q)):
                raise Failure(f"line {i + 1}: unterminated quoted expr")
            inner = first[1:-1]
            expr = inner.replace("''", "'") if q == "'" else json.loads(first)
        else:
            # A plain scalar: ' #' starts a YAML comment on each of its lines.
            parts = [re.sub(r"\s+#.*$", "", l.strip()) for l in [first] + body]
            expr = " ".join(p for p in parts if p)
        if not expr.strip():
            raise Failure(f"line {i + 1}: empty expr for {current}")
        out.append((current, expr, i, j))
        current = None
        i = j
    got = [n for n, _, _, _ in out]
    if sorted(got) != sorted(names):
        missing = sorted(set(names) - set(got))
        raise Failure(f"rules without exactly one expr: {missing or 'a rule has two'}")
    return out


def dashboard_exprs(doc):
    """Every query of a Grafana dashboard: each `expr` anywhere, and the templating
    variables' queries (label_values(METRIC, label) counts METRIC)."""
    out = []

    def walk(node, where):
        if isinstance(node, dict):
            title = node.get("title")
            where = f"{where}/{title}" if isinstance(title, str) and title else where
            for k, v in node.items():
                if k == "expr" and isinstance(v, str):
                    out.append((where, v))
                else:
                    walk(v, where)
        elif isinstance(node, list):
            for n in node:
                walk(n, where)

    walk(doc.get("panels", []), "panels")
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q, re.S)
        if m:
            out.append((f"variable {var.get('name')}", m.group(1)))
        elif re.fullmatch(r"\s*label_values\(\s*\w+\s*\)\s*", q):
            pass  # label_values(label): no metric
        elif q.strip():
            out.append((f"variable {var.get('name')}", q))
    return out


# ---------------------------------------------------------------------------------
# PromQL: the metric names an expression reads, and how it uses them.

TOKEN = re.compile(r"\d[\w.]*|[A-Za-z_:][\w:]*|\S")


def clean(expr):
    """The expression with strings, comments, Grafana variables, label matchers,
    ranges and grouping label lists blanked out."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"#[^\n]*", " ", s)
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " 0 ", s)
    if "__name__" in s:
        raise Failure(f"a selector by __name__ cannot be checked here: {expr!r}")
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\b(group_left|group_right)\b", " ", s)
    return s


def uses(expr):
    """[(metric name, the function directly applied to it or None)] in order."""
    toks = TOKEN.findall(clean(expr))
    out = []
    stack = []  # the function each open parenthesis belongs to
    pending_func = None
    for k, t in enumerate(toks):
        nxt = toks[k + 1] if k + 1 < len(toks) else ""
        if t == "(":
            stack.append(pending_func)
            pending_func = None
            continue
        if t == ")":
            if stack:
                stack.pop()
            continue
        pending_func = None
        if t[0].isdigit() or not re.match(r"[A-Za-z_:]", t):
            continue
        if nxt == "(":
            pending_func = t.lower()
            continue
        if t.lower() in KEYWORDS or t == '""':
            continue
        out.append((t, stack[-1] if stack else None))
    return out


def problems(exprs, samples, types):
    """The problems of the named expressions against a scrape: {where: [message]}.

    samples: the set of sample names exported; types: family name -> TYPE."""

    def family(name):
        if name in types:
            return name, types[name]
        for suf in HIST_SUFFIXES:
            if name.endswith(suf) and types.get(name[: -len(suf)]) in ("histogram", "summary"):
                return name[: -len(suf)], types[name[: -len(suf)]]
        return None, None

    found = {}
    for where, expr in exprs:
        for name, func in uses(expr):
            if name in SYNTHETIC or name.startswith("scrape_"):
                continue
            fam, typ = family(name)
            msg = None
            if name not in samples:
                if typ in ("histogram", "summary") and fam == name:
                    msg = f"{name}: a {typ}'s bare name has no samples; use {name}_bucket, _sum or _count"
                elif fam is not None:
                    msg = f"{name}: announced (# TYPE {fam} {typ}) but no sample was exported"
                else:
                    msg = f"{name}: not exported by the server"
            elif func in COUNTER_FUNCS and not (typ == "counter" or
                                                (fam != name and typ in ("histogram", "summary"))):
                msg = f"{name}: {func}() over a {typ or 'untyped'} series (counters only)"
            elif func in GAUGE_FUNCS and (typ == "counter" or (fam != name and typ)):
                msg = f"{name}: {func}() over a counter's series (gauges only)"
            if msg:
                found.setdefault(where, []).append(msg)
    return found


def undocumented(types, doc):
    """The families announced that the documentation never names (as `name`)."""
    named = set(re.findall(r"`([a-z_:][a-z0-9_:]*)(?:\{[^`]*\})?`", doc))
    return sorted(f for f in types if f not in named)


def parse_exposition(text):
    samples, types = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
        elif line and not line.startswith("#"):
            samples.add(re.match(r"[A-Za-z_:][\w:]*", line).group(0))
    return samples, types


# ---------------------------------------------------------------------------------
# The negative controls: the checker must report what it exists to report.

FIXTURE = """\
# TYPE fenced_grants_total counter
fenced_grants_total 3
# TYPE fenced_leases gauge
fenced_leases 1
# TYPE fenced_raft_replication_lag_entries gauge
# TYPE fenced_raft_log_commit_duration_seconds histogram
fenced_raft_log_commit_duration_seconds_bucket{le="+Inf"} 5
fenced_raft_log_commit_duration_seconds_sum 0.1
fenced_raft_log_commit_duration_seconds_count 5
"""

FIXTURE_RULES = """\
groups:
  - name: g
    rules:
      - alert: Block
        expr: |
          histogram_quantile(0.99, sum by (instance, le) (
            rate(fenced_raft_log_commit_duration_seconds_bucket{job="fenced"}[5m])))
            > 0.1   # seconds
        for: 1m
      - alert: Plain
        expr: fenced_leases > 1e3
          and on (instance) up{job="fenced"} == 1  # a comment
        labels: {severity: warning}
      - alert: Quoted
        expr: 'fenced_grants_total{instance=~"a|b"} > 0'
      - record: "job:grants:rate5m"
        expr: "sum by (job) (rate(fenced_grants_total[5m]))"
"""


def self_test():
    samples, types = parse_exposition(FIXTURE)
    rules = rule_exprs(FIXTURE_RULES)
    got = {n: e for n, e, _, _ in rules}
    names = {n: sorted(x for x, _ in uses(e)) for n, e in got.items()}
    want = {"Block": ["fenced_raft_log_commit_duration_seconds_bucket"],
            "Plain": ["fenced_leases", "up"],
            "Quoted": ["fenced_grants_total"],
            "job:grants:rate5m": ["fenced_grants_total"]}
    if names != want:
        raise Failure(f"self-test: names read from the fixture rules: {names}, want {want}")
    clean_exprs = [(n, e) for n, e in got.items()] + [
        ("grafana", 'sum by (instance) (rate(fenced_grants_total{job="$job",instance=~"$instance"}[$__rate_interval]))'),
        ("offset", "fenced_leases offset 5m - fenced_leases atan2 fenced_leases"),
        ("predict", "predict_linear(fenced_leases[6h], 24 * 3600) < bool 0x10"),
    ]
    p = problems(clean_exprs, samples, types)
    if p:
        raise Failure(f"self-test: correct expressions reported: {p}")
    bad = {
        "made-up": ("rate(fenced_made_up_total[5m]) > 0", "fenced_made_up_total: not exported"),
        "made-up-in-and": ('fenced_leases > 0 and on (instance) fenced_nonexistent_gauge{peer="2"}',
                           "fenced_nonexistent_gauge: not exported"),
        "declared-only": ("fenced_raft_replication_lag_entries > 0",
                          "fenced_raft_replication_lag_entries: announced"),
        "bare-histogram": ("rate(fenced_raft_log_commit_duration_seconds[5m])", "bare name"),
        "rate-of-gauge": ("rate(fenced_leases[5m])", "rate() over a gauge"),
        "deriv-of-counter": ("deriv(fenced_grants_total[5m])", "deriv() over a counter"),
    }
    for where, (expr, want_msg) in bad.items():
        p = problems([(where, expr)], samples, types)
        msgs = p.get(where, [])
        if not any(want_msg in m for m in msgs):
            raise Failure(f"self-test: {where} ({expr!r}) not reported as {want_msg!r}: got {msgs}")
    doc = "Counters: `fenced_grants_total`, `fenced_leases`; `fenced_raft_replication_lag_entries{peer=\"ID\"}`"
    if undocumented(types, doc) != ["fenced_raft_log_commit_duration_seconds"]:
        raise Failure(f"self-test: undocumented families of the fixture: {undocumented(types, doc)}")
    try:
        rule_exprs("groups:\n  - name: g\n    rules:\n      - alert: NoExpr\n        for: 1m\n")
    except Failure:
        pass
    else:
        raise Failure("self-test: a rule without an expr was not reported")
    try:
        clean('{__name__="fenced_leases"}')
    except Failure:
        pass
    else:
        raise Failure("self-test: a selector by __name__ was not refused")
    print(f"self-test: ok ({len(bad)} made-up names and misuses reported, "
          f"{len(clean_exprs)} correct expressions left alone)")


# ---------------------------------------------------------------------------------
# The servers.

def http(url, method="GET", body=None, headers=None, raw=None, timeout=2.0):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=max(0.1, min(timeout, left()))) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return None, str(e).encode()


def server_env(**extra):
    """This environment without FENCED_* settings (a server reads them as its
    configuration: an FENCED_AUTH_TOKEN_FILE here would change what is checked)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("FENCED_")}, **extra}


class Servers:
    """The processes started here: all killed, and the directory removed, on close."""

    def __init__(self, binary):
        self.binary = binary
        self.work = tempfile.mkdtemp(prefix="fenced-check-metrics.")
        self.procs = []

    def start(self, name, args):
        log = open(os.path.join(self.work, f"{name}.log"), "wb")
        p = subprocess.Popen([self.binary, "server", "--data-dir", os.path.join(self.work, name)] + args,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             env=server_env(FENCED_LOG="warn"))
        log.close()
        p.fenced_name = name
        self.procs.append(p)
        return p

    def log(self, name):
        try:
            with open(os.path.join(self.work, f"{name}.log"), "rb") as f:
                return f.read().decode(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, procs=None):
        procs = [p for p in (procs or self.procs) if p.poll() is None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        t = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(timeout=max(0.05, t - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self):
        signal.alarm(0)  # nothing interrupts the cleanup
        try:
            self.stop()
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            shutil.rmtree(self.work, ignore_errors=True)


def wait_ready(servers, proc, port, want=lambda v: True):
    while left() > 0:
        if proc.poll() is not None:
            raise Failure(f"{proc.fenced_name} exited with {proc.returncode}:\n{servers.log(proc.fenced_name)}")
        st, body = http(f"http://127.0.0.1:{port}/readyz", timeout=0.5)
        if st == 200 and want(json.loads(body)):
            return json.loads(body)
        time.sleep(0.05)
    raise Failure(f"{proc.fenced_name} not ready in time:\n{servers.log(proc.fenced_name)}")


def scrape(port):
    st, body = http(f"http://127.0.0.1:{port}/metrics")
    if st != 200:
        raise Failure(f"GET /metrics on {port}: {st} {body[:200]!r}")
    return body.decode()


def single(servers):
    (port,) = free_ports(1)
    p = servers.start("single", ["--listen", f"127.0.0.1:{port}"])
    wait_ready(servers, p, port, lambda v: v.get("leader"))
    base = f"http://127.0.0.1:{port}"
    st, body = http(f"{base}/v1/locks/check-metrics/acquire", "POST", {"ttl_ms": 10000})
    if st != 200:
        raise Failure(f"acquire: {st} {body!r}")
    grant = json.loads(body)
    st, body = http(f"{base}/v1/store/check-metrics", "PUT", raw=b"value",
                    headers={"Fencing-Token": str(grant["token"]), "content-type": "application/octet-stream"})
    if st != 200:
        raise Failure(f"store write: {st} {body!r}")
    st, body = http(f"{base}/v1/locks/check-metrics/release", "POST", {"lease_id": grant["lease_id"]})
    if st != 200:
        raise Failure(f"release: {st} {body!r}")
    text = scrape(port)
    samples, types = parse_exposition(text)
    values = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+) (\S+)$", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    for name in ("fenced_grants_total", "fenced_releases_total", "fenced_store_writes_accepted_total"):
        if values.get(name, 0) < 1:
            raise Failure(f"{name} is {values.get(name)} after the calls: the scrape does not show them")
    servers.stop([p])
    return samples, types


def cluster(servers):
    ports = free_ports(6)
    client, peer = ports[:3], ports[3:]
    peers = ",".join(f"{i + 1}=http://127.0.0.1:{peer[i]}" for i in range(3))
    procs = [servers.start(f"member{i + 1}",
                           ["--listen", f"127.0.0.1:{client[i]}", "--peer-listen", f"127.0.0.1:{peer[i]}",
                            "--node-id", str(i + 1), "--peers", peers, "--insecure-peers"])
             for i in range(3)]
    leader = None
    while leader is None and left() > 0:
        for i in range(3):
            v = wait_ready(servers, procs[i], client[i])
            if v.get("leader"):
                leader = i
                break
        else:
            time.sleep(0.05)
    if leader is None:
        raise Failure("the cluster elected no leader in time")
    # The leader exports a peer's lag once it has heard from it.
    while True:
        samples, types = set(), {}
        for i in range(3):
            s, t = parse_exposition(scrape(client[i]))
            samples |= s
            types.update(t)
        if "fenced_raft_replication_lag_entries" in samples:
            break
        if left() <= 0:
            raise Failure("the cluster's leader exports no fenced_raft_replication_lag_entries sample")
        time.sleep(0.1)
    servers.stop(procs)
    return samples, types


def on_alarm(signum, frame):
    raise Failure(f"over the deadline of {DEADLINE_S:.0f}s")


def on_term(signum, frame):
    raise Failure("terminated")


def main(argv):
    # A last bound for a call that would block past the deadline (the servers are
    # still stopped and the directory removed: the Failure unwinds through finally).
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(DEADLINE_S) + 5)
    # Stopped from outside (CI's timeout): still stop the servers and remove the directory.
    signal.signal(signal.SIGTERM, on_term)
    import argparse
    ap = argparse.ArgumentParser(description="Check the metric names of the alert rules and the dashboard against a running server.")
    ap.add_argument("binary", nargs="?", default=os.environ.get("FENCED_BIN"), help="the fenced binary (default: $FENCED_BIN)")
    ap.add_argument("--self-test", action="store_true", help="only the checker's negative controls, no server")
    ap.add_argument("--rules", default=RULES)
    ap.add_argument("--dashboard", default=DASHBOARD)
    args = ap.parse_args(argv[1:])
    self_test()
    if args.self_test:
        return 0
    if not args.binary:
        raise Failure("usage: check-metrics.py FENCED_BIN (or set FENCED_BIN)")
    binary = os.path.abspath(args.binary)
    if not os.access(binary, os.X_OK):
        raise Failure(f"{binary} is not an executable")
    with open(args.rules) as f:
        rules = rule_exprs(f.read())
    with open(args.dashboard) as f:
        dash = dashboard_exprs(json.load(f))
    exprs = [(f"{os.path.basename(args.rules)}: {n}", e) for n, e, _, _ in rules] + \
            [(f"{os.path.basename(args.dashboard)}: {w}", e) for w, e in dash]
    servers = Servers(binary)
    try:
        s1, t1 = single(servers)
        s3, t3 = cluster(servers)
    finally:
        servers.close()
    samples, types = s1 | s3, {**t3, **t1}
    found = problems(exprs, samples, types)
    used = {n for _, e in exprs for n, _ in uses(e)} - SYNTHETIC
    only_cluster = sorted(n for n in used if n in s3 and n not in s1)
    if os.path.exists(SERVER_DOC):
        with open(SERVER_DOC) as f:
            m = re.search(r"^## Metrics\n(.*?)(?=^## )", f.read(), re.M | re.S)
        if not m:
            found.setdefault("docs/server.md", []).append("no *Metrics* section")
        else:
            for fam in undocumented(types, m.group(1)):
                found.setdefault("docs/server.md", []).append(f"{fam}: exported but not named in *Metrics*")
    if found:
        for where, msgs in found.items():
            for m in msgs:
                print(f"FAIL {where}: {m}", file=sys.stderr)
        return 1
    print(f"ok: {len(used)} metric names in {len(rules)} rules and {len(dash)} dashboard queries, "
          f"all exported ({', '.join(only_cluster) or 'none'} by the cluster's leader only); "
          f"the {len(types)} families exported all named in docs/server.md, Metrics; "
          f"{time.monotonic() - START:.1f}s")
    return 0


if __name__ == "__main__":
    run(main)
