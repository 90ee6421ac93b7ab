#!/usr/bin/env python3
"""The alert rules' unit tests test something: promtool, then two mutants per alert.

    deploy/check-alert-tests.py [PROMTOOL]    # default: promtool on the PATH

1. `promtool check rules` and `promtool test rules` of deploy/prometheus pass.
2. Every alert has an evaluation in fenced-alerts.test.yml that expects it to fire
   and one that expects nothing (exp_alerts: []).
3. The dashboard's queries parse as PromQL (promtool check rules of recording rules
   made of them, Grafana's $__rate_interval and friends given a value).
4. Every alert has a severity label, a summary, a description and a runbook_url
   docs/operations.md#ANCHOR whose heading exists there (GitHub's anchors).
5. For each alert, two copies of the rules with only that alert's expr replaced, each
   tested against the test groups that name the alert, must fail on that alert:
   - "never": `vector(1) == 0`, which never fires: fails unless a test needs it to fire;
   - "always": one alert per label set of the expected alerts (e.g. per job and
     instance) that has any series the real expr reads, `for` kept: fails unless a test
     has series of those metrics that must not fire it (the negative cases).
The mutants are this script's negative control: a test file that asserts nothing
fails them. Standard library only; reads the rules with check-metrics.py's reader.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
PROM = os.path.join(HERE, "prometheus")
RULES = os.path.join(PROM, "fenced-alerts.yml")
TESTS = os.path.join(PROM, "fenced-alerts.test.yml")
RUNBOOK = os.path.join(os.path.dirname(HERE), "docs", "operations.md")
DASHBOARD = os.path.join(HERE, "grafana", "fenced-dashboard.json")

sys.dont_write_bytecode = True  # no __pycache__ left in deploy/
spec = importlib.util.spec_from_file_location("check_metrics", os.path.join(HERE, "check-metrics.py"))
cm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cm)


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def run(promtool, *args, cwd=None):
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_groups(text):
    """(head up to and including `tests:`, [group text]) of a promtool test file whose
    groups are list items at two spaces under a top-level `tests:`, each with a name."""
    m = re.search(r"^tests:\s*\n", text, re.M)
    if not m:
        fail(f"{TESTS}: no top-level tests:")
    head, body = text[: m.end()], text[m.end():]
    groups = [g for g in re.split(r"\n(?=  - )", "\n" + body) if g.strip()]
    for g in groups:
        if not re.match(r"\s*  - name: ", g):
            fail(f"{TESTS}: a test group does not start with '  - name:' at two spaces: {g.strip()[:60]!r}")
    return head, groups


def evaluations(group):
    """[(alertname, expects an alert: bool, [label names of the expected alerts])]."""
    out = []
    for m in re.finditer(r"alertname:\s*(\S+)\s*\n\s*exp_alerts:(.*?)(?=\n\s*- eval_time:|\Z)", group, re.S):
        name, rest = m.group(1), m.group(2)
        if rest.strip().startswith("[]"):
            out.append((name, False, []))
            continue
        labels = re.findall(r"exp_labels:\s*\{([^}]*)\}", rest)
        if not labels:
            fail(f"{TESTS}: {name}: expected alerts without exp_labels in flow style ({{...}})")
        keys = sorted({k.strip() for l in labels for k in re.findall(r"(\w+)\s*:", l)} - {"severity", "alertname"})
        out.append((name, True, keys))
    return out


def drop_key(lines, key):
    """The lines without each `key:` entry and the more-indented lines under it."""
    out, skip = [], None
    for line in lines:
        ind = len(line) - len(line.lstrip())
        if skip is not None:
            if not line.strip() or ind > skip:
                continue
            skip = None
        m = re.match(rf"^(\s*)(- )?{key}:", line)
        if m:
            if m.group(2):  # `- key:` opens a list item: keep the dash for what follows
                raise ValueError(f"{key} as the first key of a list item is not handled")
            skip = ind
            continue
        out.append(line)
    return out


def without_annotations(rules_lines, i, j, suite, name):
    """The rules with the annotations of the alert whose expr spans lines i..j removed,
    and the suite with the expected annotations of that alert's evaluations removed:
    a mutant is then told apart by which alerts fire, not by its $value."""
    start = max(k for k in range(i + 1) if re.match(r"^\s*- alert:", rules_lines[k]))
    end = next((k for k in range(j, len(rules_lines)) if re.match(r"^\s*- (alert|record|name):", rules_lines[k])),
               len(rules_lines))
    rules = rules_lines[:start] + drop_key(rules_lines[start:end], "annotations") + rules_lines[end:]
    chunks = re.split(r"(?m)^(?=\s*- eval_time:)", suite)

    def strip(c):
        body = c.rstrip("\n")
        return "\n".join(drop_key(body.split("\n"), "exp_annotations")) + c[len(body):]

    suite = "".join(strip(c) if re.search(rf"alertname:\s*{re.escape(name)}\s*$", c, re.M) else c
                    for c in chunks)
    return rules, start, suite


def anchors(markdown):
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            out.add(slug)
    return out


def check_annotations(rules_text, names):
    with open(RUNBOOK) as f:
        have = anchors(f.read())
    if "fencednoleader" not in have or "not-built-yet" not in have or "made-up-anchor" in have:
        fail("self-test: the anchors read from docs/operations.md are not GitHub's")
    blocks = re.split(r"(?m)^\s*- alert:\s*", rules_text)[1:]
    if [b.split()[0] for b in blocks] != names:
        fail("the alerts' blocks do not match the rules read")
    for b in blocks:
        name = b.split()[0]
        for key in (r"severity:\s*(critical|warning|info)\b", r"summary:", r"description:"):
            if not re.search(r"^\s+" + key, b, re.M):
                fail(f"{name}: no {key.split(':')[0]}")
        m = re.search(r"^\s+runbook_url:\s*[\"']?docs/operations\.md#([\w-]+)[\"']?\s*$", b, re.M)
        if not m:
            fail(f"{name}: no runbook_url docs/operations.md#ANCHOR")
        if m.group(1) not in have:
            fail(f"{name}: runbook_url #{m.group(1)} is no heading of docs/operations.md")


def dashboard_parses(promtool, work):
    """Fails unless every dashboard query parses; a broken one must be refused."""
    import json
    with open(DASHBOARD) as f:
        exprs = cm.dashboard_exprs(json.load(f))

    def rules(items):
        out = ["groups:", "  - name: dashboard", "    rules:"]
        for k, (_, e) in enumerate(items):
            e = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", e)
            e = re.sub(r"\$\{?(\w+)\}?", r"\1", e)  # $job in a matcher's string
            out.append(f"      - record: dashboard:q{k}")
            out.append("        expr: " + json.dumps(e))
        return "\n".join(out) + "\n"

    for name, items, want in (("broken", [("x", "rate(fenced_grants_total[$__rate_interval]")], False),
                              ("dashboard", exprs, True)):
        path = os.path.join(work, f"{name}.rules.yml")
        with open(path, "w") as f:
            f.write(rules(items))
        r = run(promtool, "check", "rules", path)
        if (r.returncode == 0) != want:
            fail(f"promtool check rules of the {name} queries: status {r.returncode}, "
                 f"expected {'success' if want else 'a refusal'}:\n{r.stdout}{r.stderr}")
    return len(exprs)


def main(argv):
    promtool = argv[1] if len(argv) > 1 else shutil.which("promtool")
    if not promtool:
        fail("promtool not found (Debian: apt-get install prometheus)")
    for args in (("check", "rules", RULES), ("test", "rules", TESTS)):
        r = run(promtool, *args)
        if r.returncode != 0:
            fail(f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}")
    print("promtool check rules and test rules: ok", flush=True)

    with open(RULES) as f:
        rules_text = f.read()
    with open(TESTS) as f:
        tests_text = f.read()
    alerts = [(n, e, i, j) for n, e, i, j in cm.rule_exprs(rules_text)]
    check_annotations(rules_text, [n for n, _, _, _ in alerts])
    head, groups = test_groups(tests_text)
    if not re.search(r"^rule_files:\s*\[\s*fenced-alerts\.yml\s*\]\s*$", head, re.M):
        fail(f"{TESTS}: expected `rule_files: [fenced-alerts.yml]` (the mutants replace that file)")
    evals = {g: evaluations(g) for g in groups}
    lines = rules_text.splitlines()
    jobs = []
    for name, expr, i, j in alerts:
        mine = [e for g in groups for e in evals[g] if e[0] == name]
        if not any(pos for _, pos, _ in mine):
            fail(f"{name}: no test expects it to fire")
        if not any(not pos for _, pos, _ in mine):
            fail(f"{name}: no test expects it quiet (exp_alerts: [])")
        keys = sorted({k for _, pos, ks in mine if pos for k in ks})
        metrics = sorted({m for m, _ in cm.uses(expr)})
        indent = re.match(r"^(\s*)", lines[i]).group(1)
        always = f'group by ({", ".join(keys)}) ({{__name__=~"{"|".join(metrics)}"}})'
        suite = head + "".join(g if g.endswith("\n") else g + "\n"
                               for g in groups if any(e[0] == name for e in evals[g]))
        plain, start, suite = without_annotations(lines, i, j, suite, name)
        # The expr's lines in `plain`: the annotations come after it, or before.
        k = plain.index(lines[i], start)
        for kind, mutant in (("never", "vector(1) == 0"), ("always", always)):
            text = "\n".join(plain[:k] + [f"{indent}expr: '{mutant}'"] + plain[k + (j - i):]) + "\n"
            jobs.append((name, kind, mutant, text, suite))

    work = tempfile.mkdtemp(prefix="fenced-alert-mutants.")
    try:
        n_dash = dashboard_parses(promtool, work)
        print(f"the dashboard's {n_dash} queries parse (a broken one is refused)", flush=True)
        def one(k_job):
            k, (name, kind, mutant, text, suite) = k_job
            d = os.path.join(work, str(k))
            os.mkdir(d)
            with open(os.path.join(d, "fenced-alerts.yml"), "w") as f:
                f.write(text)
            with open(os.path.join(d, "t.yml"), "w") as f:
                f.write(suite)
            r = run(promtool, "test", "rules", "t.yml", cwd=d)
            out = r.stdout + r.stderr
            if r.returncode == 0:
                return f"{name}: the tests pass with its expr replaced by {mutant!r} ({kind})"
            if f"alertname: {name}," not in out:
                return f"{name} ({kind} mutant): promtool failed, but not on {name}:\n{out[-1500:]}"
            return None

        with ThreadPoolExecutor(max_workers=2) as ex:
            errors = [e for e in ex.map(one, enumerate(jobs)) if e]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if errors:
        for e in errors:
            print(f"FAIL {e}", file=sys.stderr)
        return 1
    print(f"ok: {len(alerts)} alerts, each with a severity, a summary, a description, a runbook "
          f"section in docs/operations.md, a firing and a quiet case; "
          f"all {len(jobs)} mutants (never fires, fires on any series) caught")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
