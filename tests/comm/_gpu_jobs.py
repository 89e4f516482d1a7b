"""The launches of the GPU comm tests, run side by side on the GPUs they need (used by test_gpu_comm.py).

A launch is one ``mpiexec -n N`` job: either ``gpu_batch.py`` running several scenarios (scripts of this
folder with their arguments and environment) in one process a rank, each with a verdict of its own, or one
plain script (the faults: gpu_timeout.py, which stalls or kills a rank).  The :class:`Scheduler` starts the
launches the selected tests need, in its list's order, on a background thread:

* a launch that *reserves* its GPUs (every batch of device collectives) gets the ``N`` least-held visible GPUs,
  named in its ``CUDA_VISIBLE_DEVICES``, when each is held by fewer than ``share`` reserving launches
  (``MPIML_TEST_GPU_SHARE``, default 2): the disjoint placements first (two 2-rank launches at once on GPUs
  0,1 and 2,3, a 1-rank one beside a 3-rank one), then a second launch on a GPU rather than an idle wait.
  Two jobs on one GPU take turns on it (CUDA time-slices the contexts of two processes): each job's ranks
  stay on GPUs of their own, so no result changes, and a collective waits at most a time slice more;
  ``share=1`` keeps every reserving launch on GPUs of its own;
* an *overlay* launch runs on GPUs that others may hold, at most ``lanes`` at a time: those whose GPU work is
  light, so sharing costs the others little and changes no result (the peer-failure launches, idle but for
  a few seconds of a survivor's kernel waiting out ``MPIML_TIMEOUT``; ranks sharing one GPU, which stage
  through host memory).

Every launch ends by ``deadline`` seconds after the first start (``MPIML_TEST_GPU_BUDGET``, default 220 s):
one still running then is killed, and its unfinished scenarios fail saying so.  Outputs go to temporary
files (no pipe fills up), and with ``MPIML_TEST_JOBS_DIR`` set, each launch's output and a timeline are
copied there.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Launch:
    """One ``mpiexec`` job: ``scenarios`` (a batch; list of dicts for gpu_batch.py) or ``argv`` (a plain
    script and its arguments); ``reserve``: whether it holds its GPUs alone; ``ngpus``: how many visible GPUs
    it is given (ranks bind GPU ``local_rank % ngpus``)."""

    def __init__(self, name, n, *, scenarios=None, argv=None, env=None, reserve=True, ngpus=None, timeout=None,
                 expect_ok=True):
        self.name, self.n = name, n
        self.scenarios, self.argv = scenarios, argv
        self.env = dict(env or {})
        self.reserve = reserve
        self.ngpus = n if ngpus is None else ngpus
        self.timeout = timeout
        self.expect_ok = expect_ok
        self.proc = self.gpus = self.t0 = self.t1 = self.rc = None
        self.stdout = self.stderr = ""
        self.killed = None  # why it was killed
        self.done = threading.Event()
        self._files = None

    # ---------------------------------------------------------------- results
    def results(self):
        """``{scenario: (passed, seconds, failure lines)}`` from a batch's ``@@`` lines."""
        out, fails, cur = {}, {}, None
        for line in self.stdout.splitlines():
            if line.startswith("@@ begin "):
                cur = line[len("@@ begin "):].strip()
            elif line.startswith("@@ fail "):
                name = line[len("@@ fail "):].split(" rank ", 1)[0]
                fails.setdefault(name, []).append(line)
                cur = name
            elif line.startswith("@@ | ") and cur is not None:
                fails.setdefault(cur, []).append(line[5:])
            elif line.startswith("@@ end "):
                name, verdict, secs = line[len("@@ end "):].rsplit(" ", 2)
                out[name] = (verdict == "PASS", float(secs), fails.get(name, []))
        return out

    def started_scenario(self):
        """The last scenario that began (None before the first)."""
        last = None
        for line in self.stdout.splitlines():
            if line.startswith("@@ begin "):
                last = line[len("@@ begin "):].strip()
        return last

    def tail(self, chars=4000):
        return f"--- stdout (tail)\n{self.stdout[-chars:]}\n--- stderr (tail)\n{self.stderr[-chars:]}"

    def describe(self):
        where = f"GPUs {self.gpus}" if self.gpus is not None else "not started"
        took = f"{self.t1 - self.t0:.1f} s" if self.t0 is not None and self.t1 is not None else "-"
        killed = f", {self.killed}" if self.killed else ""
        return f"{self.name} ({self.n} rank(s), {where}, rc={self.rc}, {took}{killed})"


class Scheduler:
    """Runs ``launches`` (in this order of preference) on ``gpus`` (visible GPU ids, as strings)."""

    def __init__(self, launches, gpus, mpiexec_cmd, child_env, *, lanes=2, share=2, deadline=220.0, jobs_dir=None,
                 poll=0.05):
        self.launches = list(launches)
        self.by_name = {la.name: la for la in self.launches}
        self.gpus = list(gpus)
        self.mpiexec_cmd, self.child_env = mpiexec_cmd, child_env
        self.lanes, self.share, self.deadline, self.poll = lanes, max(1, share), deadline, poll
        self.jobs_dir = jobs_dir
        self.tmp = tempfile.mkdtemp(prefix="mpiml_gpu_jobs_")
        self.t0 = None
        self._stop = False
        self._thread = None
        self.log = []

    # ---------------------------------------------------------------- running
    def start(self):
        self.t0 = time.monotonic()
        if threading.current_thread() is threading.main_thread():
            # a test session ended by a signal (a step's `timeout`) takes its launches with it: they run in
            # sessions of their own, which the signal does not reach
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._thread = threading.Thread(target=self._loop, name="mpiml-gpu-jobs", daemon=True)
        self._thread.start()

    _previous = None

    def _on_sigterm(self, signum, frame):
        self.kill_all()
        previous = self._previous if callable(self._previous) else signal.SIG_DFL
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signum) if previous is signal.SIG_DFL else previous(signum, frame)

    def kill_all(self):
        for la in self.launches:
            if la.proc is not None and la.proc.poll() is None:
                try:
                    os.killpg(la.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def now(self):
        return time.monotonic() - self.t0

    def _note(self, what):
        self.log.append(f"[{self.now():6.1f} s] {what}")

    def _spawn(self, la, gpus):
        la.gpus = gpus
        env = self.child_env(la.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        if la.scenarios is not None:
            spec = os.path.join(self.tmp, f"{la.name}.json")
            with open(spec, "w") as fh:
                json.dump({"scenarios": la.scenarios}, fh)
            argv = [os.path.join(HERE, "gpu_batch.py"), spec]
        else:
            argv = list(la.argv)
        cmd = self.mpiexec_cmd(la.n) + [sys.executable, *map(str, argv)]
        out = open(os.path.join(self.tmp, f"{la.name}.out"), "w+")
        err = open(os.path.join(self.tmp, f"{la.name}.err"), "w+")
        la._files = (out, err)
        la.t0 = self.now()
        la.proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, start_new_session=True)
        self._note(f"start {la.name} on GPUs {','.join(gpus)}: {' '.join(cmd[-2:])}")

    def _finish(self, la, killed=None):
        if killed:
            la.killed = killed
            try:
                os.killpg(la.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        la.rc = la.proc.wait()
        la.t1 = self.now()
        out, err = la._files
        for fh, attr in ((out, "stdout"), (err, "stderr")):
            fh.flush()
            fh.seek(0)
            setattr(la, attr, fh.read())
            fh.close()
        self._note(f"end {la.describe()}")
        for name, (ok, secs, _) in la.results().items():
            self._note(f"    {name}: {'PASS' if ok else 'FAIL'} {secs:.1f} s")
        if self.jobs_dir:
            os.makedirs(self.jobs_dir, exist_ok=True)
            with open(os.path.join(self.jobs_dir, f"{la.name}.log"), "w") as fh:
                fh.write(f"{la.describe()}\n--- stdout\n{la.stdout}\n--- stderr\n{la.stderr}\n")
        la.done.set()

    def _loop(self):
        pending = [la for la in self.launches if la.ngpus <= len(self.gpus)]
        for la in self.launches:
            if la not in pending:
                la.killed = f"not started: needs {la.ngpus} GPUs, {len(self.gpus)} visible"
                la.done.set()
        running = []
        held = {g: 0 for g in self.gpus}  # reserving launches on each GPU
        try:
            while (pending or running) and not self._stop:
                for la in list(running):
                    limit = min(self.deadline, la.t0 + la.timeout if la.timeout else self.deadline)
                    if la.proc.poll() is not None:
                        running.remove(la)
                        self._finish(la)
                    elif self.now() > limit:
                        running.remove(la)
                        why = "killed at the deadline" if limit == self.deadline else f"killed after {la.timeout} s"
                        self._finish(la, killed=f"{why} ({self.now():.0f} s after the first start)")
                    else:
                        continue
                    if la.reserve:
                        for g in la.gpus:
                            held[g] -= 1
                overlays = sum(1 for la in running if not la.reserve)
                # two passes: on GPUs of their own first, then (share > 1) beside one other launch
                for la, cap in [(la, cap) for cap in sorted({1, self.share}) for la in list(pending)]:
                    if self.now() > self.deadline - 5:
                        break
                    if la not in pending:
                        continue
                    if la.reserve:
                        order = sorted(self.gpus, key=lambda g: (held[g], self.gpus.index(g)))[:la.ngpus]
                        if len(order) < la.ngpus or any(held[g] >= cap for g in order):
                            continue
                        gpus = sorted(order, key=self.gpus.index)
                        for g in gpus:
                            held[g] += 1
                    else:
                        if overlays >= self.lanes:
                            continue
                        overlays += 1
                        gpus = self.gpus[-la.ngpus:]  # (the last GPUs: a 1-GPU overlay beside a 3-rank launch's)
                    pending.remove(la)
                    try:
                        self._spawn(la, gpus)
                    except Exception as exc:  # noqa: BLE001 (its tests fail saying why)
                        la.killed = f"could not start: {type(exc).__name__}: {exc}"
                        self._note(f"{la.name}: {la.killed}")
                        if la.reserve:
                            for g in gpus:
                                held[g] -= 1
                        la.done.set()
                        continue
                    running.append(la)
                if self.now() > self.deadline and pending:
                    for la in pending:
                        la.killed = "not started before the deadline"
                        self._note(f"not started: {la.name}")
                        la.done.set()
                    pending = []
                time.sleep(self.poll)
        finally:
            for la in running:
                self._finish(la, killed="stopped with the test session")
            for la in pending:
                la.killed = la.killed or "not started (the test session stopped)"
                la.done.set()
            self._write_timeline()

    def _write_timeline(self):
        if self.jobs_dir:
            os.makedirs(self.jobs_dir, exist_ok=True)
            with open(os.path.join(self.jobs_dir, "timeline.txt"), "w") as fh:
                fh.write("\n".join(self.log) + "\n")

    def stop(self):
        self._stop = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.kill_all()
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    # ---------------------------------------------------------------- verdicts
    def wait(self, name):
        la = self.by_name[name]
        la.done.wait(timeout=max(1.0, self.deadline - self.now() + 30))
        return la

    def verdict(self, name, scenario):
        """``(passed, message)`` of one scenario of a batch launch."""
        la = self.wait(name)
        if not la.done.is_set():
            return False, f"{la.describe()}: no result in time"
        res = la.results().get(scenario)
        if res is not None:
            ok, secs, fails = res
            msg = f"{scenario} in {la.describe()}: {'PASS' if ok else 'FAIL'} after {secs:.1f} s"
            if not ok:
                msg += "\n" + "\n".join(fails)[-6000:] + "\n" + la.tail(3000)
            return ok, msg
        if la.proc is None:
            return False, f"{scenario}: {la.describe()}"
        running = la.started_scenario()
        why = f"{la.killed} during {running}" if la.killed else f"the launch ended (rc={la.rc}) during {running}"
        return False, f"{scenario} did not finish in {la.describe()}: {why}\n{la.tail()}"
