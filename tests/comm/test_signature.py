"""The signature check's parts that need no second rank: hashing, messages, guards, slot sizes."""

import os
import subprocess
import sys

import numpy as np
import pytest

from mpiml import CollectiveMismatchError, CommAbortedError, CommTimeoutError
from mpiml.comm import _request
from mpiml.comm._signature import describe, mismatch_text, signature_base, slot_bytes

SPEC = ("allreduce", np.dtype("float64"), 12, 0, "sum", (3, 4), "host", None)


def test_signature_base_is_the_same_in_every_process():
    """Ranks compare hashes: nothing in them may depend on the process (str hashing is salted)."""
    code = ("import numpy as np; from mpiml.comm._signature import signature_base as s; "
            "print(s('allreduce', np.dtype('float32'), 7, 1, 'max', (7,), 'device', 'nccl/ring', True), "
            "s('bcast_obj', None, 0, 2, None, (), 'host', None))")
    outs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "..", "src"),
                                             env.get("PYTHONPATH", "")])
        outs.add(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                check=True, timeout=120).stdout)
    assert len(outs) == 1, outs


def test_every_field_changes_the_signature():
    base = signature_base(*SPEC)
    variants = [("bcast",) + SPEC[1:], SPEC[:1] + (np.dtype("float32"),) + SPEC[2:], SPEC[:2] + (13,) + SPEC[3:],
                SPEC[:3] + (1,) + SPEC[4:], SPEC[:4] + ("max",) + SPEC[5:], SPEC[:5] + ((4, 3),) + SPEC[6:],
                SPEC[:6] + ("device",) + SPEC[7:], SPEC[:7] + ("ring",)]
    hashes = {signature_base(*v) for v in variants}
    assert base not in hashes and len(hashes) == len(variants)
    assert signature_base(*SPEC, error=True) != base
    assert hash((base, 1)) != hash((base, 2))  # the call number is mixed in per call


def test_mismatch_text_names_ranks_and_values_in_a_fixed_order():
    def details(*specs, errors=None):
        return [(describe(s, seq), (errors or {}).get(r)) for r, (s, seq) in enumerate(specs)]

    other = ("bcast",) + SPEC[1:]
    assert mismatch_text("allreduce", details((SPEC, 5), (other, 5), (SPEC, 5))) == \
        "ranks called different collectives (mismatched collective): allreduce on ranks [0, 2]; bcast on ranks [1]"
    text = mismatch_text("allreduce", details((SPEC, 5), (SPEC, 6)))
    assert "mismatched call number" in text and "5 on ranks [0]; 6 on ranks [1]" in text
    rooted = SPEC[:3] + (1,) + SPEC[4:]
    # a wrong root comes before the local error it causes (a "root" without data)
    assert "mismatched root" in mismatch_text("allreduce", details((SPEC, 1), (rooted, 1), errors={1: "no x"}))
    assert mismatch_text("allreduce", details((SPEC, 1), (SPEC, 1), errors={1: "bad"})) == \
        "allreduce is invalid on rank(s) [1]: rank 1: bad"
    counted = SPEC[:2] + (13,) + SPEC[3:]
    assert mismatch_text("allreduce", details((SPEC, 1), (counted, 1))) == \
        "allreduce called with mismatched count across ranks: 12 on ranks [0]; 13 on ranks [1]"
    v = ("allgatherv",) + SPEC[1:5] + ((3,),) + SPEC[6:]
    w = ("allgatherv",) + SPEC[1:5] + ((4,),) + SPEC[6:]
    assert "mismatched trailing shape" in mismatch_text("allgatherv", details((v, 1), (w, 1)))


def test_slot_shrinks_with_the_group_and_keeps_room_for_scatter_metadata():
    assert slot_bytes(2) == slot_bytes(4) == 4096
    assert slot_bytes(8) == 2048 and slot_bytes(64) == 256
    assert slot_bytes(10**6) == 128  # scatter's 14 words of metadata still fit
    assert all(slot_bytes(p) % 8 == 0 for p in range(1, 300))


def test_a_peers_error_is_raised_with_its_class_and_text():
    from mpiml.comm._agreement import _error_like

    t = _error_like("CommTimeoutError", "allreduce timed out after 3 s waiting for all")
    assert isinstance(t, CommTimeoutError) and str(t) == "allreduce timed out after 3 s waiting for all"
    m = _error_like("CollectiveMismatchError", "x")
    assert type(m) is CollectiveMismatchError and str(m) == "x"
    assert type(_error_like("Weird", "y")).__name__ == "CommError"


def test_a_guard_ends_a_wait_and_the_request_is_abandoned(monkeypatch):
    abandoned = []

    def guard():
        raise CollectiveMismatchError("the round says so")

    req = _request.Request(lambda: False, op="allreduce", peer="all", cancel=lambda: abandoned.append(1))
    prev = _request.set_guard(guard)
    try:
        with pytest.raises(CollectiveMismatchError):
            req.wait(timeout=5)
    finally:
        _request.set_guard(*prev)
    assert abandoned == [1]
    assert _request.set_guard(None) == (None, None)  # restored


def test_watch_runs_only_once_a_wait_outlasts_its_spin(monkeypatch):
    calls = []

    def watch():
        calls.append(1)
        if len(calls) == 3:
            raise CommAbortedError("a peer aborted it")

    monkeypatch.setenv("MPIML_SPIN_US", "0")
    with pytest.raises(CommAbortedError):
        _request.poll_until(lambda: False, op="recv", peer=1, timeout=5, watch=watch)
    assert len(calls) == 3
    calls.clear()
    state = {"n": 0}

    def quick():  # completes on the second test: no watch at all
        state["n"] += 1
        return state["n"] > 1

    monkeypatch.setenv("MPIML_SPIN_US", "100000")
    _request.poll_until(quick, op="recv", peer=1, timeout=5, watch=watch)
    assert calls == []
