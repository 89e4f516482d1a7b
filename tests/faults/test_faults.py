"""Faults under ``mpiexec``: mismatched collectives, a stalled rank, a killed rank.

Each case asserts, from every rank's own record (``fault_script.py``), that no
call returned data, that every rank that is still alive raised the same clear
error within ``MPIML_TIMEOUT`` + 5 s, and what the communicator does afterwards.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, TESTS, mpiexec_cmd, run_group

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "fault_script.py")


def run_fault(scenario, n, *, timeout_s, limit, launcher_args=(), expect_ok=True, keep_survivors=False):
    """Launch ``fault_script.py scenario`` on ``n`` ranks; return ``{rank: records}`` of the ranks that wrote.

    ``keep_survivors``: every rank runs under ``keep_survivors.py``, so the launcher does not end
    the job when the last rank is killed (``limit=None``: MPIML_TIMEOUT unset).
    """
    out = tempfile.mkdtemp(prefix=f"mpiml_fault_{scenario}_")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), TESTS, env.get("PYTHONPATH", "")])
    env.update(MPIML_FAULT_OUT=out, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPIML_ABORT_ON_EXCEPTION="1")
    if limit is None:  # the default (600 s)
        env.pop("MPIML_TIMEOUT", None)
    else:
        env["MPIML_TIMEOUT"] = str(limit)
    env.pop("MPIML_CHECK", None)
    cmd = mpiexec_cmd(n)
    wrap = [sys.executable, os.path.join(HERE, "keep_survivors.py"), out, str(n - 1)] if keep_survivors else []
    cmd = cmd[:1] + list(launcher_args) + cmd[1:] + wrap + [sys.executable, SCRIPT, scenario]
    try:
        proc = run_group(cmd, timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{scenario} on {n} ranks hung past {timeout_s} s\n{exc.stdout}\n{exc.stderr}")
    records = {}
    for k in range(n):
        path = os.path.join(out, f"rank{k}.json")
        if os.path.exists(path):
            with open(path) as f:
                records[k] = json.load(f)
            os.unlink(path)
    for name in os.listdir(out):  # (the victim's pid file)
        os.unlink(os.path.join(out, name))
    os.rmdir(out)
    if expect_ok:
        assert proc.returncode == 0 and len(records) == n, \
            f"exit {proc.returncode}, records from {sorted(records)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return records, proc


def by_name(records):
    """``{name: {rank: record}}`` (names may repeat with another MPIML_CHECK: keyed by (name, check))."""
    table = {}
    for rank, recs in records.items():
        for rec in recs:
            table.setdefault((rec["name"], rec.get("check", "")), {})[rank] = rec
    return table


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_mismatch_is_the_same_error_on_every_rank(n):
    limit = 10
    records, _ = run_fault("mismatch", n, timeout_s=900, limit=limit)
    table = by_name(records)
    assert len(table) >= 30, sorted(table)
    problems = []
    for (name, check), per_rank in sorted(table.items()):
        what = f"{name} (MPIML_CHECK={check or 'unset'}, {n} ranks)"
        texts = {rec["error"] for rec in per_rank.values()}
        if any(rec["returned"] for rec in per_rank.values()):
            problems.append(f"{what}: a call returned data: {[(k, v['value']) for k, v in per_rank.items()]}")
            continue
        if {rec["type"] for rec in per_rank.values()} != {"CollectiveMismatchError"} or len(texts) != 1:
            problems.append(f"{what}: not one CollectiveMismatchError everywhere: "
                            f"{[(k, v['type'], v['error']) for k, v in per_rank.items()]}")
            continue
        text = texts.pop()
        missing = [w for w in per_rank[0]["words"] if w not in text]
        if missing:
            problems.append(f"{what}: message {text!r} lacks {missing}")
        slow = [k for k, v in per_rank.items() if v["seconds"] > limit + 5]
        if slow:
            problems.append(f"{what}: ranks {slow} took more than MPIML_TIMEOUT + 5 s")
        # after the error: the same state everywhere; with MPIML_CHECK=1 nothing moved, so usable
        afters = {json.dumps(v["after"], sort_keys=True) for v in per_rank.values()}
        if len(afters) != 1:
            problems.append(f"{what}: ranks disagree on the communicator's state afterwards: {afters}")
            continue
        after = per_rank[0]["after"]
        if check == "1" and after != {"allreduce": "usable"}:
            problems.append(f"{what}: strict checking moved data, the communicator is {after}")
        if after != {"allreduce": "usable"} and set(after.values()) != {"CommAbortedError"}:
            problems.append(f"{what}: after the mismatch: {after}")
    assert not problems, "\n".join(problems)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_stalled_rank_is_a_timeout_then_the_communicator_stays_dead(n):
    limit = 2
    records, _ = run_fault("stall", n, timeout_s=600, limit=limit)
    problems = []
    for (name, _), per_rank in sorted(by_name(records).items()):
        for k, rec in per_rank.items():
            who = f"{name}, rank {k}{' (stalled)' if rec['stalled'] else ''}, {n} ranks"
            if rec["returned"]:
                # the late rank may complete the call from the parts the others posted before they
                # gave up (then the result is right); no waiting rank may return
                if not (rec["stalled"] and rec["right"]):
                    problems.append(f"{who}: returned {rec['value']}")
            elif rec["type"] != "CommTimeoutError":
                problems.append(f"{who}: {rec['type']}: {rec['error']}")
            elif rec["seconds"] > limit + 5 or (not rec["stalled"] and rec["seconds"] < limit * 0.9):
                problems.append(f"{who}: timed out after {rec['seconds']:.1f} s with MPIML_TIMEOUT={limit}")
            # every later call, splits too, is refused (the late rank hears that the others gave up)
            if set(rec["after"].values()) != {"CommAbortedError"} or "split" not in rec["after"]:
                problems.append(f"{who}: later calls on the communicator: {rec['after']}")
        # the same error (class, op, limit) everywhere; whom a rank was still waiting for is its own
        texts = {rec["error"].split(" waiting for")[0] for rec in per_rank.values() if not rec["returned"]}
        if len(texts) != 1:
            problems.append(f"{name}: the ranks raised different errors: {texts}")
    assert not problems, "\n".join(problems)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_rank_gone_mid_collective_is_a_timeout_on_every_survivor(n):
    """The last rank stops inside a ring allreduce (to its peers, gone: what a killed rank is when the
    launcher lets the job go on); the survivors raise within MPIML_TIMEOUT + 5 s, then refuse."""
    limit = 3
    records, proc = run_fault("freeze", n, timeout_s=300, limit=limit, expect_ok=False)
    assert sorted(records) == list(range(n - 1)), (sorted(records), proc.stdout[-2000:], proc.stderr[-4000:])
    texts = set()
    for k, recs in records.items():
        (rec,) = recs
        assert not rec["returned"], f"rank {k} got data from a collective whose peer is gone: {rec}"
        assert rec["type"] == "CommTimeoutError", (k, rec)
        assert rec["seconds"] <= limit + 5, (k, rec["seconds"])
        assert set(rec["after"].values()) == {"CommAbortedError"} and "split" in rec["after"], (k, rec["after"])
        texts.add(rec["error"].split(" waiting for")[0])
    assert len(texts) == 1, texts


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_a_killed_rank_ends_or_fails_the_job_without_a_hang(n):
    """SIGKILL inside a collective: MPICH's launcher ends the whole job at once; a launcher that
    lets the survivors run gets the survivors' timeouts (checked as above). Either way, no hang
    and no data."""
    limit = 3
    t0 = time.monotonic()
    records, proc = run_fault("kill", n, timeout_s=300, limit=limit, expect_ok=False)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    for k, recs in records.items():
        (rec,) = recs
        # a timeout, or (first) the dead peer's process found gone, naming it
        assert not rec["returned"] and (rec["type"] == "CommTimeoutError" or (
            rec["type"] == "CommAbortedError" and f"rank {n - 1} is dead" in rec["error"])), (k, rec)
        assert rec["seconds"] <= limit + 5, (k, rec["seconds"])
    assert took < 120, f"the job took {took:.0f} s to end after a rank was killed"


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_a_killed_rank_is_found_dead_on_every_survivor_without_a_timeout(n):
    """SIGKILL between calls, the launcher lets the job go on (keep_survivors.py), MPIML_TIMEOUT unset: every
    survivor's next wait finds the peer's process gone and raises CommAbortedError naming it,
    within 5 s; later calls are refused."""
    records, proc = run_fault("dead_peer", n, timeout_s=300, limit=None, expect_ok=False, keep_survivors=True)
    assert sorted(records) == list(range(n - 1)), (sorted(records), proc.stdout[-2000:], proc.stderr[-4000:])
    for k, recs in records.items():
        assert [rec["name"] for rec in recs] == ["inline", "ring"], recs
        for rec in recs:
            assert not rec["returned"] and rec["type"] == "CommAbortedError", (k, rec)
            assert f"rank {n - 1} is dead" in rec["error"], (k, rec["error"])
            assert rec["seconds"] <= 5, (k, rec["name"], rec["seconds"])
            assert set(rec["after"].values()) == {"CommAbortedError"}, (k, rec["after"])
