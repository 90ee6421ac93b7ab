#!/usr/bin/env python3
"""What security costs per request (issue 26): `fenced bench` against one durable
server started in each of these configurations, the runs interleaved so that the
machine's noise falls on all of them alike, the median of --repeat runs each:

  open          no credential (the default)
  token         auth_token_file: one identity with every right
  identities    identities_file of 101 identities, the bench's found by its token and
                allowed `lock`, `store_read`, `store_write` on `bench/`
  audit         identities, and audit_log (every grant, release, store write)
  audit-all     identities, and audit_all (keepalives, checks and reads too)
  tls           identities over TLS (fenceds://), the token in AUTH
  tls-cert      TLS with client_ca: the identity found by its certificate's subject

For each: throughput, latency, and the server's CPU per operation (from
/proc/PID/stat around the run), and each figure as a ratio to `open`.

  scripts/bench-security-cost.py [--bin target/release/fenced] [--workloads
      uncontended,store] [--clients 16] [--duration 5s] [--repeat 3] [--configs LIST]
      [--json]

Needs `openssl` for the certificates. Every server listens on 127.0.0.1 and is stopped
at the end; data, certificates and the audit log go to a temporary directory.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = ["open", "token", "identities", "audit", "audit-all", "tls", "tls-cert"]
TOKEN = "bench-token-6b1f0e2d9c8a7b6a5f4e3d2c1b0a9f8e"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1 and a client certificate CN=bench."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=bench-ca", "-keyout", "ca.key", "-out", "ca.pem")
    for name, subj, ext in [
        ("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", "/CN=bench", "extendedKeyUsage=clientAuth"),
    ]:
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", subj,
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")


def write_identities(d):
    """101 identities: 100 others with their own prefixes, and the bench's."""
    lines = []
    for i in range(100):
        with open(os.path.join(d, f"other-{i}.token"), "w") as f:
            f.write(f"other-token-{i:04d}-{os.urandom(8).hex()}\n")
        lines += ["[[identity]]", f'name = "other-{i}"', f'token_file = "other-{i}.token"',
                  f'allow = [{{ prefix = "team-{i}/", ops = ["lock", "store_read", "store_write"] }}]', ""]
    with open(os.path.join(d, "bench.token"), "w") as f:
        f.write(TOKEN + "\n")
    ops = '["lock", "store_read", "store_write"]'
    lines += ["[[identity]]", 'name = "bench"', 'token_file = "bench.token"',
              f'allow = [{{ prefix = "bench/", ops = {ops} }}]', ""]
    with open(os.path.join(d, "identities.toml"), "w") as f:
        f.write("\n".join(lines))
    # The same, and the bench's identity by certificate (cert_subject needs client_ca).
    lines += ["[[identity]]", 'name = "bench-cert"', 'cert_subject = "CN=bench"',
              f'allow = [{{ prefix = "bench/", ops = {ops} }}]', ""]
    with open(os.path.join(d, "identities-cert.toml"), "w") as f:
        f.write("\n".join(lines))


def server_setup(config, d, run_dir):
    """The server's flags and environment, and the bench's environment and scheme."""
    flags, env, bench_env, scheme = [], {}, {}, "fenced"
    if config == "token":
        flags += ["--auth-token-file", os.path.join(d, "bench.token")]
        bench_env["FENCED_AUTH_TOKEN"] = TOKEN
    if config in ("identities", "audit", "audit-all", "tls"):
        flags += ["--identities-file", os.path.join(d, "identities.toml")]
        bench_env["FENCED_AUTH_TOKEN"] = TOKEN
    if config in ("audit", "audit-all"):
        flags += ["--audit-log", os.path.join(run_dir, "audit.log")]
        if config == "audit-all":
            env["FENCED_AUDIT_ALL"] = "true"
    if config in ("tls", "tls-cert"):
        flags += ["--tls-cert", os.path.join(d, "server.pem"), "--tls-key", os.path.join(d, "server.key")]
        bench_env["FENCED_CA_FILE"] = os.path.join(d, "ca.pem")
        scheme = "fenceds"
    if config == "tls-cert":
        flags += ["--identities-file", os.path.join(d, "identities-cert.toml"), "--client-ca", os.path.join(d, "ca.pem")]
        bench_env["FENCED_CLIENT_CERT"] = os.path.join(d, "client.pem")
        bench_env["FENCED_CLIENT_KEY"] = os.path.join(d, "client.key")
    return flags, env, bench_env, scheme


def one_run(a, config, workload, d, n):
    run_dir = tempfile.mkdtemp(prefix=f"{config}-{workload}-{n}-", dir=d)
    flags, env, bench_env, scheme = server_setup(config, d, run_dir)
    http, wire = free_port(), free_port()
    cmd = [a.bin, "server", "--listen", f"127.0.0.1:{http}", "--wire-listen", f"127.0.0.1:{wire}",
           "--data-dir", os.path.join(run_dir, "data"), *flags]
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("FENCED_")}
    server_env.update(env)
    log = open(os.path.join(run_dir, "server.log"), "w")
    server = subprocess.Popen(cmd, env=server_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", wire), timeout=0.2).close()
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    log.flush()
                    with open(log.name) as f:
                        sys.exit(f"{config}: the server did not start:\n{f.read()[-2000:]}")
                time.sleep(0.05)
        bench_env = {**{k: v for k, v in os.environ.items() if not k.startswith("FENCED_")}, **bench_env}
        before = cpu_seconds(server.pid)
        out = subprocess.run(
            [a.bin, "--json", "--endpoint", f"{scheme}://127.0.0.1:{wire}", "bench", "--workload", workload,
             "--clients", str(a.clients), "--duration", a.duration],
            env=bench_env, capture_output=True, text=True, timeout=300)
        cpu = cpu_seconds(server.pid) - before
        if out.returncode != 0:
            sys.exit(f"{config} {workload}: the bench failed: {out.stderr.strip()[-600:]}")
        r = json.loads(out.stdout)
        if r["errors"]:
            sys.exit(f"{config} {workload}: {r['errors']} errors, the first: {r['first_error']}")
        audited = 0
        if config.startswith("audit"):
            with open(os.path.join(run_dir, "audit.log")) as f:
                audited = sum(1 for _ in f)
            if audited == 0:
                sys.exit(f"{config}: the audit log is empty: nothing was measured")
        return {"ops_per_s": r["ops_per_s"], "p50_us": r["p50_us"], "p99_us": r["p99_us"],
                "cpu_us_per_op": cpu * 1e6 / max(r["ops"], 1), "audit_lines": audited}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="target/release/fenced")
    p.add_argument("--workloads", default="uncontended,store")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", default="5s")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    configs = a.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or "open" not in configs:
        sys.exit(f"--configs: from {', '.join(CONFIGS)}, with open (the baseline); not {unknown}")
    if not 1 <= a.repeat <= 9:
        sys.exit("--repeat: between 1 and 9")
    workloads = a.workloads.split(",")
    results = {(c, w): [] for c in configs for w in workloads}
    with tempfile.TemporaryDirectory(prefix="fenced-security-bench-") as d:
        make_pki(d)
        write_identities(d)
        total = a.repeat * len(configs) * len(workloads)
        done = 0
        for n in range(a.repeat):
            for w in workloads:
                for c in configs:
                    results[(c, w)].append(one_run(a, c, w, d, n))
                    done += 1
                    print(f"[{done}/{total}] {w} {c}: {results[(c, w)][-1]['ops_per_s']:.0f} ops/s",
                          file=sys.stderr)
    table = []
    for w in workloads:
        base = None
        for c in configs:
            runs = results[(c, w)]
            row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            row.update(config=c, workload=w, runs_ops_per_s=[round(r["ops_per_s"]) for r in runs])
            base = base or row
            row["ops_ratio"] = row["ops_per_s"] / base["ops_per_s"]
            row["cpu_extra_us"] = row["cpu_us_per_op"] - base["cpu_us_per_op"]
            table.append(row)
    if a.json:
        print(json.dumps(table, indent=2))
        return
    print(f"{a.clients} clients, closed loop, {a.duration} each, median of {a.repeat} interleaved runs")
    print(f"{'workload':12} {'config':11} {'ops/s':>8} {'× open':>7} {'p50 µs':>7} {'p99 µs':>7} "
          f"{'CPU µs/op':>10} {'+µs/op':>7}")
    for r in table:
        print(f"{r['workload']:12} {r['config']:11} {r['ops_per_s']:8.0f} {r['ops_ratio']:7.2f} "
              f"{r['p50_us']:7.0f} {r['p99_us']:7.0f} {r['cpu_us_per_op']:10.1f} {r['cpu_extra_us']:+7.1f}")


if __name__ == "__main__":
    main()
