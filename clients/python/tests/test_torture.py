"""The proof that this client is honest, not only that it works: ``fenced torture --target
python`` runs the counter workload in worker processes written with this client
(``fenced._torture_worker``) against a real server, and freezes workers with SIGSTOP past
their lease. With fencing: nothing lost, no zombie write, and every write a frozen holder
began after someone else's grant found ``lock.lost`` already set. Without the token (the
control): updates lost. A worker that lies about its signal (the negative control) is
caught by the same check. These are the short variants; RELIABILITY.md has the long ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, Optional, Tuple

from support import fenced_bin

# Short leases and a short run: several pauses, each past the lease.
SHORT = ["--faults", "pause", "--duration", "12s", "--ttl", "1s", "--workers", "3", "--work", "100ms"]


def torture(target: str, env: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, Any], str]:
    p = subprocess.run(
        [str(fenced_bin()), "--json", "torture", "--target", target, "--python", sys.executable, *SHORT],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )
    assert p.stdout.strip(), f"no report from fenced torture: {p.stderr[-2000:]}"
    return p.returncode, json.loads(p.stdout), p.stderr


def test_fenced_python_workers_lose_nothing_and_signal_every_loss_in_time() -> None:
    code, r, err = torture("python")
    assert code == 0, err
    assert r["safe"] is True, r["proofs"]
    assert r["pauses_injected"] >= 2, r
    assert r["acknowledged"] >= 20, r
    assert (r["lost_updates"], r["zombie_writes"]) == (0, 0), r["proofs"]
    assert r["overlapping_holders"] == 0 and r["duplicate_tokens"] == 0, r["proofs"]
    # The signal was judged (the workers recorded it), and never came late.
    assert r["late_lost_signals"] == 0, r["proofs"]
    # A frozen holder's late write reached the store with its old token and was refused.
    assert r["stale_writes_rejected"] >= 1, r
    assert r["final_value"] == r["acknowledged"], r


def test_without_the_token_the_same_workers_lose_updates() -> None:
    code, r, err = torture("python-unfenced")
    # Unsafe without fencing is the expected result of the control, not a failure.
    assert code == 0, err
    assert r["fencing"] is False and r["safe"] is False, r
    assert r["pauses_injected"] >= 2, r
    assert r["lost_updates"] + r["zombie_writes"] >= 1, r


def test_a_worker_whose_signal_never_comes_is_caught() -> None:
    code, r, _ = torture("python", {"FENCED_WORKER_BREAK": "lost-never"})
    assert code == 1, "fencing on and unsafe must fail the run"
    assert r["late_lost_signals"] >= 1, r
    assert any(p.startswith("late lost signal") for p in r["proofs"]), r["proofs"]
    # The store still refused the late writes: the token, not the signal, kept it safe.
    assert (r["lost_updates"], r["zombie_writes"]) == (0, 0), r["proofs"]
