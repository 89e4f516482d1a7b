"""A model of the IPC collectives' synchronisation (``kernels/comm/ipc_common.cuh``), run on the CPU.

Each rank has a workspace (the epoch word, ack[r], barrier flags [slot][peer],
two staging buffers, LL slots [parity][source]), CUDA streams (FIFOs of kernel
launches, event records and event waits) and a host that issues a program of
collectives, graph captures and replays, and stream waits.  Kernels follow the
header's protocol step by step (one block: the protocol is the same for every
block): ``begin`` reads the epoch E and waits until every ack has reached E - 1;
the LL kernels store (flag E + 1, data) lines into slots [E % 2][me] and spin on
their own slots until the flag is E + 1; barriers store 2E + s + 1 and spin until
each peer's value has reached it; ``end`` stores E + 1 into the epoch word and
into every peer's ack[me].  A scheduler interleaves every actor (hosts, stream
heads, each running kernel's next step) in a random or scripted order; memory is
sequentially consistent here (the model checks the protocol's logic, not its
fences).  Every piece of data carries the logical call that wrote it, so a
kernel that consumes another call's data is caught, and a run that cannot go on
is reported as the GPU reports it: (rank, call E, the peer waited for, whether
the epoch word moved under the wait).

The host's launch path is :class:`mpiml.comm.backends.ipc.StreamOrder` itself,
over model streams: the order holds the stream of the latest eager launch, so a
stream the program lets go ("destroy") is destroyed only once the order lets go
of it too, as a CuPy ``Stream`` is; streams named ``ext...`` stand for streams
whose owner destroys them at once (CuPy's ``ExternalStream``), and any touch of
a destroyed stream fails the run.
"""

import random
from collections import deque

import pytest

from mpiml.comm.backends.ipc import StreamOrder


# ---------------------------------------------------------------- the device
class Workspace:
    def __init__(self, nranks, epoch):
        self.epoch = epoch
        self.ack = [epoch] * nranks
        past = 2 * (epoch - 1) + 1 if epoch else 0  # barrier values of the last call done
        self.flag = {(s, t): past + s if epoch else 0 for s in (0, 1) for t in range(nranks)}
        self.buf = [{}, {}]
        self.ll = [[(0, None, [0] * nranks)] * nranks for _ in (0, 1)]  # (flag, call, value)
        self.llr = [{}, {}]  # the LL slots of a parity as one region of lines (lltwoshot): line -> (flag, call, value)
        self.pipe = {}  # the pipelined kernels' flags (no parity): (row, step) -> value


class Model:
    """The ranks' workspaces, streams and running kernels; ``run`` interleaves them."""

    def __init__(self, nranks, epoch=0, ordered=True, seed=0, first=None, drop=()):
        self.P = nranks
        self.drop = set(drop)  # rules of the protocol left out (to show that each one is needed)
        self.ws = [Workspace(nranks, epoch) for _ in range(nranks)]
        self.streams = [{} for _ in range(nranks)]  # name -> deque of ops
        self.running = {}                            # (rank, stream) -> [generator, pending yield, info]
        self.capturing = [set() for _ in range(nranks)]
        self.released = [set() for _ in range(nranks)]  # streams the program let go (their work still runs)
        self.drains = 0                              # host waits for the device (StreamOrder's drain)
        self._drain_pending = [False] * nranks
        self.graphs = [{} for _ in range(nranks)]
        self.event_tok = [None] * nranks             # each rank's StreamOrder event: the latest record
        self.orders = [StreamOrder(self._capturing(r), self._record(r), self._wait(r), owned=self._owned,
                                   drain=self._drain(r)) for r in range(nranks)]
        self.ordered = ordered
        self.rng = random.Random(seed)
        self.first = first                           # ranks whose actors go first (a scripted schedule)
        self.results, self.errors, self.epochs = {}, [], {}
        self.calls = [0] * nranks                    # logical calls issued per rank

    # -- host-side hooks of StreamOrder (a destroyed stream must never be touched again)
    @staticmethod
    def _owned(s):
        return not s.startswith("ext")

    def _destroyed(self, r, s):
        """A stream let go by the program is gone unless the order holds it (and can: not an ext stream)."""
        return s in self.released[r] and (not self._owned(s) or self.orders[r].last != s)

    def _live(self, r, s):
        if self._destroyed(r, s):
            raise AssertionError(f"rank {r}: stream {s!r} touched after it was destroyed")
        return s

    def _drain(self, r):
        def drain(s):
            self._live(r, s)
            self.drains += 1
            self._drain_pending[r] = True  # the host waits until the device is idle (see _host_step)
        return drain

    def _capturing(self, r):
        return lambda s: self._live(r, s) in self.capturing[r]

    def _record(self, r):
        def record(s):
            tok = {"done": False}
            self.event_tok[r] = tok
            self._queue(r, self._live(r, s)).append(("record", tok))
        return record

    def _wait(self, r):
        return lambda s: self._queue(r, self._live(r, s)).append(("wait", self.event_tok[r]))

    def _queue(self, r, s):
        return self.streams[r].setdefault(s, deque())

    def launch(self, r, s, spec):
        """The host's launch of one kernel, as ipc.IPCTransport._launch: ordered on a stream switch (or not at
        all), then captured or enqueued; after it, a record only while the order is eager."""
        order = self.orders[r]
        if self.ordered and s is not order.last:
            order.before(s)
        if self._drain_pending[r]:  # the launch happens after the host's wait for the device
            self._drain_pending[r] = False
            return ("drained", spec, s)
        self.enqueue(r, s, spec)
        return None

    def enqueue(self, r, s, spec):
        order = self.orders[r]
        if s in self.capturing[r]:
            self.graphs[r][self._capture_id[r]].append(spec)
        else:
            self._queue(r, s).append(("kernel", self._numbered(r, spec)))
        if self.ordered and order.eager:
            order.after(s)

    def _numbered(self, r, spec):
        j = self.calls[r]
        self.calls[r] += 1
        return dict(spec, call=j)

    # -- kernels (generators: yield ("step",) or ("wait", peer, predicate))
    def kernel(self, r, spec):
        ws, P, me = self.ws, self.P, r
        j = spec["call"]
        E = ws[me].epoch
        self.epochs[(me, j)] = E
        if E >= 2 and "ack wait" not in self.drop:
            for t in range(P):
                yield ("wait", t, lambda t=t: ws[me].ack[t] >= E - 1)
        p = 0 if "parity" in self.drop else E % 2
        flag = 1 if "call flag" in self.drop else E + 1
        x = [self.value(j, me, q) for q in range(P)]  # rank me's input, in P parts
        op, algo, root = spec["op"], spec["algo"], spec.get("root", 0)

        def got(tag, want_call, what):
            if tag != want_call:
                self.errors.append(f"rank {me} call {j} (E={E}) read {what} of call {tag}")

        def load(owner, key, empty):
            """(call, data) in rank owner's buffer of parity p at key; never written: (None, empty)."""
            return ws[owner].buf[p].get(key, (None, empty))

        def barrier(s):
            if "two slots" in self.drop:
                s = 0
            val = 2 * E + s + 1
            for t in range(P):
                ws[t].flag[(s, me)] = val
                yield ("step",)
            for t in range(P):
                yield ("wait", t, lambda t=t: ws[me].flag[(s, t)] >= val)

        def ll_read(src):
            yield ("wait", src, lambda: ws[me].ll[p][src][0] == flag)
            _, tag, v = ws[me].ll[p][src]
            got(tag, j, f"rank {src}'s LL line")
            return v

        def ll128_line(k):
            """(call, data) of the LL128 lines at [k] of this rank's staging buffer, data None until they carry this
            call's flag (the pushed kernels' copies live there too: a stale word, another call's lines or a barrier
            kernel's data, never carries it)."""
            tag, v = load(me, ("src", k), None)
            return (tag, v[1]) if isinstance(v, tuple) and v[0] == flag else (tag, None)

        if algo == "ll" and op == "reduce_scatter":  # part d's lines into rank d's LL slot [me], its own included
            # (reduce.cu's mpiml_reduce_scatter_ll: k = 1..P); each reduces the slots of its part in rank order
            for k in range(1, P + 1):
                d = (me + k) % P
                ws[d].ll[p][me] = (flag, j, x[d])
                yield ("step",)
            acc = 0
            for src in range(P):
                acc += yield from ll_read(src)
            self.results[(me, j)] = acc
        elif algo == "oneshot" and op == "reduce_scatter":  # part d into rank d's buffer at [me], barrier, reduce own
            for k in range(1, P + 1):
                d = (me + k) % P
                ws[d].buf[p][("rs", me)] = (j, x[d])
                yield ("step",)
            yield from barrier(0)
            acc = 0
            for src in range(P):
                tag, v = load(me, ("rs", src), 0)
                got(tag, j, f"rank {src}'s copy of part {me}")
                acc += v
            self.results[(me, j)] = acc
        elif algo == "ll":  # a rank's own line never goes through its own slot
            dests = {"allreduce": [(me + k) % P for k in range(1, P)],
                     "bcast": [(me + k) % P for k in range(1, P)] if me == root else [],
                     "reduce": [root] if me != root else []}[op]
            for d in dests:
                ws[d].ll[p][me] = (flag, j, x)
                yield ("step",)
            if op == "allreduce" or (op == "reduce" and me == root):
                acc = [0] * P
                for src in range(P):
                    v = x if src == me else (yield from ll_read(src))
                    acc = [a + b for a, b in zip(acc, v)]
                self.results[(me, j)] = acc
            elif op == "bcast":
                self.results[(me, j)] = (yield from ll_read(root)) if me != root else x
        elif algo == "ll128" and op == "reduce_scatter":  # every rank's part d, as LL128 lines, into rank d's staging
            # buffer at [(me - d - 1) % P]; rank d reduces its part's copies with its own as they arrive
            for k in range(1, P):
                d = (me + k) % P
                ws[d].buf[p][("src", (me - d - 1) % P)] = (j, (flag, x[d]))
                yield ("step",)
            acc = x[me]
            for src in range(P):
                if src != me:
                    k = (src - me - 1) % P
                    yield ("wait", src, lambda k=k: ll128_line(k)[1] is not None)
                    tag, v = ll128_line(k)
                    got(tag, j, f"rank {src}'s LL128 lines of part {me}")
                    acc += v
            self.results[(me, j)] = acc
        elif algo == "ll128direct":  # reduce: the LL reduce's protocol in LL128 lines in the staging buffer, source s's
            # lines at [(s - root - 1) % P]
            line = ll128_line
            if me != root:
                ws[root].buf[p][("src", (me - root - 1) % P)] = (j, (flag, x))
                yield ("step",)
            else:
                acc = [0] * P
                for src in range(P):
                    v = x
                    if src != me:
                        k = (src - root - 1) % P
                        yield ("wait", src, lambda k=k: line(k)[1] is not None)
                        tag, v = line(k)
                        got(tag, j, f"rank {src}'s LL128 lines")
                    acc = [a + b for a, b in zip(acc, v)]
                self.results[(me, j)] = acc
        elif algo == "oneshot":  # allreduce: copy in, barrier, read every rank's buffer
            ws[me].buf[p]["own"] = (j, x)
            yield from barrier(0)
            acc = [0] * P
            for src in range(P):
                tag, v = load(src, "own", [0] * P)
                got(tag, j, f"rank {src}'s buffer")
                acc = [a + b for a, b in zip(acc, v)]
                yield ("step",)
            self.results[(me, j)] = acc
        elif algo == "pull":  # bcast: the root copies in, barrier, the others read its buffer
            if me == root:
                ws[me].buf[p]["own"] = (j, x)
            yield from barrier(0)
            if me != root:
                tag, v = load(root, "own", [0] * P)
                got(tag, j, "the root's buffer")
                x = v
            self.results[(me, j)] = x
        elif algo == "twoshot":  # allreduce / reduce: push parts, barrier, reduce own part, push it, barrier
            for k in range(1, P + 1):
                d = (me + k) % P
                ws[d].buf[p][("src", me)] = (j, x[d])
                yield ("step",)
            yield from barrier(0)
            v = 0
            for src in range(P):
                tag, part = load(me, ("src", src), 0)
                got(tag, j, f"rank {src}'s part")
                v += part
            res = {me: v}
            for d in range(P) if op == "allreduce" else [root]:
                if d != me:
                    ws[d].buf[p][("red", me)] = (j, v)
                    yield ("step",)
            yield from barrier(1)
            if op == "allreduce" or me == root:
                for src in range(P):
                    if src != me:
                        tag, part = load(me, ("red", src), 0)
                        got(tag, j, f"rank {src}'s reduced part")
                        res[src] = part
                self.results[(me, j)] = [res[q] for q in range(P)]
        elif algo == "lltwoshot":  # the lines are the P values of x; one grid index per line of a part, in order
            L = P

            def line(k, src):
                yield ("wait", src, lambda: ws[me].llr[p].get(k, (0,))[0] == flag)
                _, tag, v = ws[me].llr[p][k]
                got(tag, j, f"line {k} from rank {src}")
                return v

            if op == "bcast":  # the root scatters nranks - 1 parts; each owner forwards its part to the rest
                q = P - 1
                part = -(-L // q)

                def owner(jj):
                    return (root + 1 + jj) % P

                out = list(x)
                jm = (me - root - 1) % P
                for i in range(part):
                    if me == root:
                        for jj in range(q):
                            if jj * part + i < L:
                                ws[owner(jj)].llr[p][jj * part + i] = (flag, j, x[jj * part + i])
                                yield ("step",)
                        continue
                    g = jm * part + i
                    if g < L:
                        out[g] = yield from line(g, root)
                        for k in range(1, q):
                            ws[owner((jm + k) % q)].llr[p][g] = (flag, j, out[g])
                            yield ("step",)
                    for k in range(1, q):
                        jj = (jm + k) % q
                        if jj * part + i < L:
                            out[jj * part + i] = yield from line(jj * part + i, owner(jj))
                self.results[(me, j)] = out
            else:  # (all)reduce: reduce-scatter into every rank's region, then the reduced parts to the root's / all
                part = -(-L // P)
                res = [None] * L
                for i in range(part):
                    for k in range(1, P + 1):
                        r = (me + k) % P
                        if r * part + i < L:
                            ws[r].llr[p][me * part + i] = (flag, j, x[r * part + i])
                            yield ("step",)
                    g = me * part + i
                    if g < L:
                        v = 0
                        for src in range(P):
                            v += yield from line(src * part + i, src)
                        for d in range(P) if op == "allreduce" else [root]:
                            if d != me:
                                ws[d].llr[p][P * part + g] = (flag, j, v)
                                yield ("step",)
                        res[g] = v
                    if me == root or op == "allreduce":
                        for k in range(1, P):
                            r = (me + k) % P
                            if r * part + i < L:
                                res[r * part + i] = yield from line(P * part + r * part + i, r)
                if me == root or op == "allreduce":
                    self.results[(me, j)] = res
        elif algo == "llrelay":  # reduce, the lltwoshot kernel's relay (mpiml_ll_relay_reduce): one line a value
            L, q = P, P - 1
            part = -(-L // q)
            regions = [ws[r].llr[p] for r in range(P)]

            def owner(jj):
                return (root + 1 + jj) % P

            def line(k, src):
                yield ("wait", src, lambda: regions[me].get(k, (0,))[0] == flag)
                _, tag, v = regions[me][k]
                got(tag, j, f"line {k} from rank {src}")
                return v

            jm = None if me == root else (me - root - 1) % P
            res = [None] * L
            for i in range(part):
                for d in range(1, q + 1):  # the other owners' parts, into the owner's region at [k * part + i]
                    jj = d - 1 if jm is None else (jm + d) % q
                    if jj != jm and jj * part + i < L:
                        o = owner(jj)
                        regions[o][((me - o - 1) % P) * part + i] = (flag, j, x[jj * part + i])
                        yield ("step",)
                if jm is not None:
                    if jm * part + i < L:
                        v = 0
                        for src in range(P):
                            v += x[jm * part + i] if src == me else (
                                yield from line(((src - me - 1) % P) * part + i, src))
                        regions[root][jm * part + i] = (flag, j, v)
                        yield ("step",)
                else:
                    for jj in range(q):
                        if jj * part + i < L:
                            res[jj * part + i] = yield from line(jj * part + i, owner(jj))
            if me == root:
                self.results[(me, j)] = res
        elif algo == "pipe":  # one value a step; parts owned by every rank (allreduce) or the non-roots
            yield from self._pipe(me, j, E, p, flag, x, op, root, got, load)
        else:
            raise ValueError(algo)
        ws[me].epoch = E + 1
        for t in range(P):
            ws[t].ack[me] = E + 1
            yield ("step",)

    def _pipe(self, me, j, E, p, flag, x, op, root, got, load):
        """mpiml_pipe (ipc_common.cuh), one value a step: A for every step first (sources store step k of part jj
        into its owner's buffer and set their flag [me][k] there), then step by step B (the owner waits for the
        sources' flags of step k, reduces, stores the result into every other receiver's buffer and sets its flag
        [MAX + me][k] there) and C one step behind (a receiver waits for the owners' flags of the step and copies
        the other parts out)."""
        ws, P, M = self.ws, self.P, 8
        L = P
        q = P if op == "allreduce" else P - 1
        part = -(-L // q)

        def owner(jj):
            return jj if op == "allreduce" else (root + 1 + jj) % P

        def receives(r):
            return op == "allreduce" or (r == root if op == "reduce" else r != root)

        jm = me if op == "allreduce" else (None if me == root else (me - root - 1) % P)
        out = list(x) if op == "bcast" and me == root else [None] * L
        if op != "bcast" or me == root:  # A
            for k in range(part):
                for jj in (range(q) if jm is None else [(jm + d) % q for d in range(1, q + 1)]):
                    o, g = owner(jj), jj * part + k
                    if o != me and g < L:
                        ws[o].buf[p][("pa", me, k)] = (j, x[g])
                        yield ("step",)
                for jj in range(q):
                    if owner(jj) != me:
                        ws[owner(jj)].pipe[(me, k)] = flag
                        yield ("step",)

        def gather(k):  # C
            for jj in range(q):
                if jj != jm:
                    row = M + owner(jj)
                    yield ("wait", owner(jj), lambda row=row: ws[me].pipe.get((row, k), 0) >= flag)
            for jj in range(q):
                g = jj * part + k
                if jj != jm and g < L:
                    tag, v = load(me, ("pg", g), 0)
                    got(tag, j, f"part {jj}'s step {k}")
                    out[g] = v

        behind = None
        for k in range(part):
            if jm is not None:  # B
                for t in range(P):
                    if t != me and (op != "bcast" or t == root):
                        yield ("wait", t, lambda t=t: ws[me].pipe.get((t, k), 0) >= flag)
                g = jm * part + k
                if g < L:
                    if op == "bcast":
                        tag, v = load(me, ("pa", root, k), 0)
                        got(tag, j, f"the root's step {k}")
                    else:
                        v = 0
                        for r in range(P):
                            if r == me:
                                v += x[g]
                            else:
                                tag, w = load(me, ("pa", r, k), 0)
                                got(tag, j, f"rank {r}'s step {k}")
                                v += w
                    for r in range(P):
                        if r != me and receives(r):
                            ws[r].buf[p][("pg", g)] = (j, v)
                            yield ("step",)
                    out[g] = v
                for t in range(P):
                    if t != me and receives(t):
                        ws[t].pipe[(M + me, k)] = flag
                        yield ("step",)
            if receives(me):
                if behind is not None:
                    yield from gather(behind)
                behind = k
        if behind is not None:
            yield from gather(behind)
        if receives(me) or (op == "bcast" and me == root):
            self.results[(me, j)] = out

    @staticmethod
    def value(j, r, q):
        return 1000 * j + 10 * r + q

    def expected(self, spec, r):
        j, P, root = spec["call"], self.P, spec.get("root", 0)
        if spec["op"] == "bcast":
            return [self.value(j, root, q) for q in range(P)]
        if spec["op"] == "reduce" and r != root:
            return None
        if spec["op"] == "reduce_scatter":
            return sum(self.value(j, s, r) for s in range(P))
        return [sum(self.value(j, s, q) for s in range(P)) for q in range(P)]

    # -- the scheduler
    def run(self, programs, max_steps=200_000):
        """Run every rank's host program; returns None when all finished, else the stuck kernels."""
        self._capture_id = [None] * self.P
        hosts = self._hosts = [deque(p) for p in programs]
        issued = [[] for _ in range(self.P)]  # kernels as numbered, to check their results
        for _ in range(max_steps):
            actors = []
            for r in range(self.P):
                if hosts[r] and self._host_ready(r, hosts[r][0]):
                    actors.append((r, "host", None))
                for s, q in self.streams[r].items():
                    run = self.running.get((r, s))
                    if run is not None:
                        if run[1][0] == "step" or run[1][2]():
                            actors.append((r, "kernel", s))
                    elif q and (q[0][0] != "wait" or q[0][1] is None or q[0][1]["done"]):
                        actors.append((r, "head", s))
            if not actors:
                break
            if self.first is not None and any(a[0] in self.first for a in actors):
                actors = [a for a in actors if a[0] in self.first]
            r, kind, s = self.rng.choice(actors)
            if kind == "host":
                self._host_step(r, hosts[r].popleft(), issued[r])
            elif kind == "head":
                op = self.streams[r][s][0]
                if op[0] == "kernel":
                    gen = self.kernel(r, op[1])
                    self._advance(r, s, gen, op[1])
                else:
                    if op[0] == "record":
                        op[1]["done"] = True
                    self.streams[r][s].popleft()
            else:
                gen, _, spec = self.running[(r, s)]
                self._advance(r, s, gen, spec)
        else:
            raise AssertionError("the model ran past max_steps")
        stuck = {}
        for (r, s), (gen, pending, spec) in self.running.items():
            E = self.epochs[(r, spec["call"])]
            stuck.setdefault(r, []).append((E, pending[1] if pending[0] == "wait" else None,
                                            self.ws[r].epoch != E))
        if stuck or any(hosts):
            return stuck
        for r in range(self.P):
            for spec in issued[r]:
                want = self.expected(spec, r)
                if want is not None and self.results.get((r, spec["call"])) != want:
                    self.errors.append(f"rank {r} call {spec['call']}: {self.results.get((r, spec['call']))} "
                                       f"!= {want}")
        return None

    def _advance(self, r, s, gen, spec):
        try:
            pending = next(gen)
        except StopIteration:
            self.running.pop((r, s), None)
            self.streams[r][s].popleft()
            return
        self.running[(r, s)] = [gen, pending, spec]

    def _host_ready(self, r, action):
        if action[0] == "sync":  # the host waits until the stream has run dry
            return not self.streams[r].get(action[1]) and (r, action[1]) not in self.running
        if action[0] == "drained":  # cudaDeviceSynchronize: every stream of this rank has run dry
            return not any(self.streams[r].values()) and not any(k[0] == r for k in self.running)
        return True

    def _host_step(self, r, action, issued):
        kind = action[0]
        if kind in ("call", "drained"):
            _, spec, s = action
            n = self.calls[r]
            if kind == "call":
                rest = self.launch(r, s, spec)
                if rest is not None:
                    self._hosts[r].appendleft(rest)
                    return
            else:
                self.enqueue(r, s, spec)
            if s not in self.capturing[r]:
                issued.append(dict(spec, call=n))
        elif kind == "begin_capture":
            _, gid, s = action
            self.capturing[r].add(s)
            self.graphs[r][gid] = []
            self._capture_id[r] = gid
        elif kind == "end_capture":
            self.capturing[r].discard(action[2])
        elif kind == "replay":  # a graph launch: its kernels read the epoch word when they run
            _, gid, s = action
            for spec in self.graphs[r][gid]:
                numbered = self._numbered(r, spec)
                issued.append(numbered)
                self._queue(r, s).append(("kernel", numbered))
        elif kind == "order":  # the caller orders stream b after stream a (a graph launch's neighbours)
            _, a, b = action
            tok = {"done": False}
            self._queue(r, a).append(("record", tok))
            self._queue(r, b).append(("wait", tok))
        elif kind == "destroy":  # the program lets the stream go (destroyed unless held): its work still runs
            self.released[r].add(action[1])
        elif kind == "sync":
            pass
        else:
            raise ValueError(kind)


def call(op, algo, s, root=0):
    return ("call", {"op": op, "algo": algo, "root": root}, s)


# ---------------------------------------------------------------- the 4-GPU hang, replayed
def _wave3(ordered, seed=0):
    """Calls 722 and 723 of gpu_collectives.py --graph on 4 ranks.

    722: run_big's last two-shot reduce (root 3) on the null stream; only the root waits for it (its
    assert_close); on ranks 0 and 2 it also ended before their next launch (their hosts came later),
    on rank 1 it did not. 723: run_graph's first allreduce, LL, on a non-blocking stream "B".
    """
    programs = []
    for r in range(4):
        prog = [call("reduce", "twoshot", "null", root=3)]
        if r != 1:
            prog.append(("sync", "null"))
        prog.append(call("allreduce", "ll", "B"))
        programs.append(prog)
    model = Model(4, epoch=722, ordered=ordered, seed=seed, first={1})
    return model, model.run(programs)


def test_the_wave3_hang_replays_without_the_stream_order():
    """The state of the log: rank 1 stuck in call 722 waiting for 0, ranks 0, 2, 3 in call 723 waiting
    for 1; rank 1's epoch word had moved to 723 under its wait (two kernels had read 722)."""
    model, stuck = _wave3(ordered=False)
    assert stuck == {1: [(722, 0, True)], 0: [(723, 1, False)], 2: [(723, 1, False)], 3: [(723, 1, False)]}
    assert model.epochs[(1, 0)] == model.epochs[(1, 1)] == 722  # both of rank 1's kernels took call 722
    assert model.epochs[(0, 1)] == 723


@pytest.mark.parametrize("seed", range(20))
def test_the_stream_order_removes_it(seed):
    model, stuck = _wave3(ordered=True, seed=seed)
    assert stuck is None and not model.errors, (stuck, model.errors)
    assert {model.epochs[(r, 1)] for r in range(4)} == {723}


# ---------------------------------------------------------------- random programs
KINDS = [("allreduce", "ll"), ("allreduce", "oneshot"), ("allreduce", "twoshot"), ("bcast", "ll"),
         ("bcast", "pull"), ("reduce", "ll"), ("reduce", "twoshot")]


def _programs(P, seed, calls=24, graphs=True, kinds=KINDS):
    """The same collectives on every rank (SPMD), each rank on streams of its own choosing, graphs captured
    once and replayed between eager calls (their launches ordered by the caller), some host waits."""
    shared, streams = random.Random(seed), ["null", "A", "B", "extC"]
    plan = [(*shared.choice(kinds), shared.randrange(P)) for _ in range(calls)]
    graph = [(*shared.choice(kinds), shared.randrange(P)) for _ in range(3)]
    replay_at = {i for i in range(calls) if shared.random() < 0.15} if graphs else set()
    sync_at = {i for i in range(calls) if shared.random() < 0.1}
    programs = []
    for r in range(P):
        local = random.Random(1000 * seed + r)
        prog, last, last_graph = [], None, False
        if graphs:
            prog.append(("begin_capture", 0, "G"))
            prog += [call(op, algo, "G", root) for op, algo, root in graph]
            prog.append(("end_capture", 0, "G"))
        for i, (op, algo, root) in enumerate(plan):
            s = local.choice(streams)
            if i in replay_at:
                if last is not None and last != s:
                    prog.append(("order", last, s))
                prog.append(("replay", 0, s))
                last, last_graph = s, True
            if last_graph and last != s:
                prog.append(("order", last, s))
            prog.append(call(op, algo, s, root))
            last, last_graph = s, False
            if i in sync_at:
                prog.append(("sync", s))
        programs.append(prog)
    return programs


@pytest.mark.parametrize("P", [2, 3, 4])
def test_random_programs_with_the_stream_order_finish_with_the_right_data(P):
    for seed in range(12):
        model = Model(P, epoch=seed % 3, ordered=True, seed=seed)
        stuck = model.run(_programs(P, seed))
        assert stuck is None, (seed, stuck)
        assert not model.errors, (seed, model.errors[:3])
        # every rank gave every logical call the same number
        calls = {j for (_, j) in model.epochs}
        for j in calls:
            assert len({model.epochs[(r, j)] for r in range(P)}) == 1, (seed, j)


def _mixed_programs_finish(P, kinds, algo=None):
    """Ten seeded random programs of ``kinds`` (roots moving, several streams, graphs), each finishing with the
    right data; how many of rank 0's calls took ``algo`` (a tuple of names: the fewest that took one of them)."""
    names = algo if isinstance(algo, tuple) else (algo,)
    taken = dict.fromkeys(names, 0)
    for seed in range(10):
        model = Model(P, epoch=seed % 3, ordered=True, seed=seed)
        programs = _programs(P, seed, kinds=kinds)
        stuck = model.run(programs)
        assert stuck is None, (seed, stuck)
        assert not model.errors, (seed, model.errors[:3])
        for a in programs[0]:
            if a[0] == "call" and a[1]["algo"] in taken:
                taken[a[1]["algo"]] += 1
    return min(taken.values())


@pytest.mark.parametrize("P", [2, 3, 4])
def test_the_two_shot_ll_kernels_among_the_others_finish_with_the_right_data(P):
    """bcast / reduce / allreduce ``lltwoshot`` (no barrier: a bcast root waits for nobody, forwarders wait for the root,
    a reduce's root for the reduced parts) between every other kind, on several streams and in graphs."""
    kinds = KINDS + [("bcast", "lltwoshot"), ("reduce", "lltwoshot"), ("allreduce", "lltwoshot")] * 3
    _mixed_programs_finish(P, kinds)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_the_ll_relay_reduce_among_the_others_finishes_with_the_right_data(P):
    """reduce ``llrelay`` (the non-roots own the parts and push them reduced
    to the root, which waits for them alone) between every other kind, roots moving, on several streams and in
    graphs, the plain LL two-shot kernels among them (the same regions)."""
    kinds = KINDS + [("reduce", "llrelay"), ("bcast", "lltwoshot"), ("allreduce", "lltwoshot")] * 3
    assert _mixed_programs_finish(P, kinds, "llrelay") > 0


@pytest.mark.parametrize("P", [2, 3, 4])
def test_the_ll128_direct_reduce_among_the_others_finishes_with_the_right_data(P):
    """reduce ``ll128direct`` (the non-roots' LL128 lines straight into the root's staging buffer, where the pushed
    two-shot kernels keep their copies; the root waits for the call's flag) and reduce_scatter ``ll128`` (every rank
    the root of its part, in the same buffers) between every other kind, roots moving, on several streams and in
    graphs."""
    kinds = KINDS + [("reduce", "ll128direct"), ("reduce_scatter", "ll128"), ("allreduce", "twoshot"),
                     ("reduce", "twoshot")] * 3
    assert _mixed_programs_finish(P, kinds, ("ll128direct", "ll128")) > 0


def _rs_sweep(P, sizes, rounds=2, calls=3):
    """The reduce_scatter calls of ``benchmarks/gpu/vs_nccl.py --ops reduce_scatter --paths raw,auto,auto0`` at P
    ranks through the IPC kernels, as the 2 x H200 table routes them (eager: ll, ll128, ll, ll128, oneshot as the
    size grows; in graphs: ll, ll128, oneshot; the raw path and the NCCL sizes launch no IPC kernel): per size and
    mode, ``rounds`` rounds of the auto and auto0 paths, each a few eager calls and a host wait, or a graph of
    ``calls`` calls captured once (after one eager call of the graph route) and replayed twice, then waited for."""
    eager = {"4": "ll", "1k": "ll128", "256k": "ll", "768k": "ll128", "2m": "oneshot"}
    graph = {"4": "ll", "1k": "ll", "256k": "ll", "768k": "ll128", "2m": "oneshot"}
    prog, gid = [], 0
    for size in sizes:
        for _ in range(rounds):
            for _path in ("auto", "auto0"):
                prog += [call("reduce_scatter", eager[size], "S") for _ in range(4)] + [("sync", "S")]
        for _ in range(rounds):
            for _path in ("auto", "auto0"):
                prog += [call("reduce_scatter", graph[size], "S"), ("sync", "S"), ("begin_capture", gid, "S")]
                prog += [call("reduce_scatter", graph[size], "S") for _ in range(calls)]
                prog += [("end_capture", gid, "S"), ("replay", gid, "S"), ("replay", gid, "S"), ("sync", "S")]
                gid += 1
    return [list(prog) for _ in range(P)]


@pytest.mark.parametrize("seed", range(6))
def test_the_reduce_scatter_sweep_ends_with_nothing_pending(seed):
    """The call sequence whose process never exited on 2 x H200 (issue 34): reduce_scatter switching ll -> ll128 ->
    ll -> ll128 -> oneshot eagerly and ll -> ll128 -> oneshot in replayed graphs, at 2 ranks.  Every call finishes
    with the right data, and the end leaves nothing that an exit could wait for: no kernel running or queued,
    every rank's epoch word at the number of calls, every ack of every peer caught up (the next call would wait
    for nobody).  So the IPC kernels leave no pending ack or flag epoch at the end of that run: what kept its
    processes alive was their teardown (mpiml.comm._exit)."""
    P = 2
    model = Model(P, epoch=seed % 3, ordered=True, seed=seed)
    stuck = model.run(_rs_sweep(P, ("4", "1k", "256k", "768k", "2m")))
    assert stuck is None and not model.errors, (stuck, model.errors[:3])
    assert not model.running and not any(q for st in model.streams for q in st.values())
    epochs = {model.ws[r].epoch for r in range(P)}
    assert len(epochs) == 1
    assert all(model.ws[r].ack[t] == model.ws[r].epoch for r in range(P) for t in range(P))
    algos = {spec["algo"] for r in range(P) for spec in
             [a[1] for a in _rs_sweep(P, ("4", "1k", "256k", "768k", "2m"))[r] if a[0] == "call"]}
    assert algos == {"ll", "ll128", "oneshot"}


@pytest.mark.parametrize("P", [2, 3, 4])
def test_reduce_scatter_ll_and_oneshot_among_the_others_finish_with_the_right_data(P):
    """reduce_scatter ``ll`` (the LL slots), ``ll128`` and ``oneshot`` (the staging buffers) between every other
    kind, on several streams and in graphs."""
    kinds = KINDS + [("reduce_scatter", "ll"), ("reduce_scatter", "ll128"), ("reduce_scatter", "oneshot")] * 3
    assert _mixed_programs_finish(P, kinds, ("ll", "oneshot")) > 0


@pytest.mark.parametrize("P", [2, 3, 4])
def test_the_pipelined_kernels_among_the_others_finish_with_the_right_data(P):
    """bcast / reduce / allreduce ``pipe`` (no barrier: flags per step, a word per writer; the bcast root and the
    reduce's sources wait for nobody) between every other kind, roots moving, on several streams and in graphs."""
    kinds = KINDS + [("bcast", "pipe"), ("reduce", "pipe"), ("allreduce", "pipe")] * 3
    _mixed_programs_finish(P, kinds)


def test_the_pipelined_bcast_root_is_held_back_by_the_acks():
    """The root of a pipelined bcast waits for nobody: run first, it would overwrite the buffers its peers have
    not read yet (the model sees them read a later call's data) but for the wait for every ack of call E - 2."""
    prog = [call("bcast", "pipe", "S", 0) for _ in range(8)] + [call("reduce", "pipe", "S", 0) for _ in range(4)]
    for drop, fails in (([], False), (["ack wait"], True)):
        model = Model(3, seed=1, first={0}, drop=drop)
        stuck = model.run([list(prog) for _ in range(3)])
        assert bool(stuck or model.errors) is fails, (drop, stuck, model.errors[:2])


def test_random_programs_without_the_stream_order_fail_and_say_why():
    """The same programs with launches left unordered: some runs hang or read another call's data, and in
    every one of those the ranks gave some call different numbers (a kernel started beside or before the
    one launched ahead of it on another stream)."""
    failed = 0
    for seed in range(12):
        model = Model(4, ordered=False, seed=seed)
        stuck = model.run(_programs(4, seed, graphs=False))
        if stuck or model.errors:
            failed += 1
            numbers = {}
            for (r, j), E in model.epochs.items():
                numbers.setdefault(j, set()).add(E)
            assert any(len(e) > 1 for e in numbers.values()), (seed, stuck, model.errors[:3])
    assert failed >= 3, failed


@pytest.mark.parametrize("rule", ["ack wait", "parity", "call flag", "two slots"])
def test_every_rule_of_the_protocol_is_needed(rule):
    """The model is sharp enough to matter: leave out one rule (the wait for every peer's ack of call
    E - 2, the two parities of buffers and LL slots, the call's number in the LL flag, the two barrier
    slots of a two-phase kernel) and runs that pass with it hang or read another call's data."""
    if rule == "ack wait":  # the root of LL broadcasts waits for nobody else: let it run ahead
        prog = [call("bcast", "ll", "S", 0) for _ in range(8)] + [call("reduce", "ll", "S", 0) for _ in range(4)]
        runs = [(Model(3, seed=1, first={0}, drop=[rule]), [list(prog) for _ in range(3)])]
    else:
        runs = [(Model(3, seed=seed, drop=[rule]), _programs(3, seed, calls=40)) for seed in range(6)]
    failed = 0
    for model, programs in runs:
        stuck = model.run(programs)
        failed += bool(stuck or model.errors)
    assert failed, rule


def test_graph_replays_take_the_live_call_number():
    """A graph captured once and replayed between eager calls on one stream: each replay's kernels read
    the epoch word when they run, so they take new numbers, the same on every rank."""
    P = 3
    prog = [("begin_capture", 0, "S"), call("allreduce", "ll", "S"), call("bcast", "pull", "S", 2),
            ("end_capture", 0, "S")]
    for i in range(5):
        prog += [call("allreduce", "twoshot", "S"), ("replay", 0, "S"), call("reduce", "ll", "S", i % P)]
    model = Model(P, ordered=True, seed=3)
    assert model.run([list(prog) for _ in range(P)]) is None and not model.errors
    assert sorted({model.epochs[(0, j)] for j in range(model.calls[0])}) == list(range(model.calls[0]))


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("kind", ["tmp", "ext"])
def test_streams_destroyed_with_their_collective_in_flight(P, kind):
    """A stream made for one collective and let go at once (its kernel may still wait for a slow peer), then
    collectives on other streams: every call is in order, and no stream is touched once destroyed. A CuPy
    stream ("tmp") lives on while the order holds it (it is recorded on at the next switch); a stream the
    order cannot hold ("ext", destroyed by its owner at once) was recorded on right after its launch and is
    never touched again."""
    for seed in range(8):
        shared = random.Random(seed)
        plan = [(*shared.choice(KINDS), shared.randrange(P)) for _ in range(20)]
        programs = []
        for r in range(P):
            local = random.Random(100 * seed + r)
            prog = []
            for i, (op, algo, root) in enumerate(plan):
                if local.random() < 0.4:
                    prog += [call(op, algo, f"{kind}{i}", root), ("destroy", f"{kind}{i}")]
                else:
                    prog.append(call(op, algo, local.choice(["null", "A"]), root))
            programs.append(prog)
        model = Model(P, ordered=True, seed=seed, first={P - 1})
        assert model.run(programs) is None and not model.errors, (seed, model.errors[:3])


def _capture_on_the_previous_stream(P):
    """Eager calls on A, then a capture begun on A while A's last call may still run, an eager call on B
    during the capture (it must wait for A's call: no event can mark it any more), the graph replayed."""
    prog = [call("allreduce", "twoshot", "A"), call("bcast", "ll", "A", P - 1), ("begin_capture", 0, "A"),
            call("reduce", "ll", "A", 0), call("allreduce", "ll", "B"), call("bcast", "pull", "A", 1),
            ("end_capture", 0, "A"), ("order", "B", "A"), ("replay", 0, "A"), ("order", "A", "B"),
            call("allreduce", "oneshot", "B"), call("reduce", "twoshot", "B", P - 1)]
    return [list(prog) for _ in range(P)]


@pytest.mark.parametrize("P", [2, 3, 4])
def test_a_capture_begun_on_the_previous_stream_drains_it(P):
    for seed in range(10):
        model = Model(P, ordered=True, seed=seed, first={seed % P})
        assert model.run(_capture_on_the_previous_stream(P)) is None and not model.errors, (seed, model.errors[:3])
        assert model.drains == P  # once per rank: the switch to B during A's capture
        calls = {j for (_, j) in model.epochs}
        assert all(len({model.epochs[(r, j)] for r in range(P)}) == 1 for j in calls)


def test_without_the_drain_a_capture_on_the_previous_stream_can_overlap():
    """The drain is needed: with a host that does not wait, some schedules start B's call beside A's."""
    failed = 0
    for seed in range(20):
        model = Model(3, ordered=True, seed=seed, first={seed % 3})
        for order in model.orders:
            order._drain = lambda s: None
        stuck = model.run(_capture_on_the_previous_stream(3))
        failed += bool(stuck or model.errors)
    assert failed, "no schedule showed the overlap"


# ---------------------------------------------------------------- StreamOrder itself
def _drive(order, streams, log):
    """Launches as the transport makes them: before() on a switch, after() only while eager."""
    for s in streams:
        if s is not order.last:
            order.before(s)
        log.append(("launch", s))
        if order.eager:
            order.after(s)


def _logged(log, capturing=(), external=()):
    return StreamOrder(lambda s: log.append(("query", s)) or s in capturing,
                       lambda s: log.append(("record", s)), lambda s: log.append(("wait", s)),
                       owned=lambda s: s not in external, drain=lambda s: log.append(("drain", s)))


def test_stream_order_costs_nothing_while_the_stream_stays():
    log = []
    _drive(_logged(log), ["a"] * 5, log)
    assert log == [("query", "a")] + [("launch", "a")] * 5  # the first launch's switch from nothing


def test_stream_order_records_and_waits_only_on_a_switch():
    log = []
    _drive(_logged(log, capturing={"cap"}), ("a", "a", "b", "cap", "cap", "b", "a"), log)
    assert log == [("query", "a"), ("launch", "a"), ("launch", "a"),
                   ("query", "b"), ("query", "a"), ("record", "a"), ("wait", "b"), ("launch", "b"),
                   ("query", "cap"), ("launch", "cap"),   # captured: no record, no wait, last stays "b"
                   ("query", "cap"), ("launch", "cap"),
                   ("launch", "b"),
                   ("query", "a"), ("query", "b"), ("record", "b"), ("wait", "a"), ("launch", "a")]


def test_stream_order_records_after_each_launch_on_a_stream_it_cannot_hold():
    """An external stream (its owner may destroy it any time): recorded on right after each of its launches,
    never touched after; a capturing one is not recorded on."""
    log, capturing = [], set()
    order = _logged(log, capturing=capturing, external={"x"})
    _drive(order, ("a", "x", "x"), log)
    capturing.add("x")
    _drive(order, ("x",), log)
    capturing.discard("x")
    _drive(order, ("a",), log)
    assert log == [("query", "a"), ("launch", "a"),
                   ("query", "x"), ("query", "a"), ("record", "a"), ("wait", "x"), ("launch", "x"),
                   ("query", "x"), ("record", "x"),
                   ("launch", "x"), ("query", "x"), ("record", "x"),
                   ("launch", "x"), ("query", "x"),          # captured: the event still marks the eager launch
                   ("query", "a"), ("wait", "a"), ("launch", "a")]   # "x" itself is not touched
    assert not order.eager


def test_stream_order_drains_when_the_previous_stream_began_a_capture():
    log, capturing = [], set()
    order = _logged(log, capturing=capturing)
    _drive(order, ("a",), log)
    capturing.add("a")
    _drive(order, ("b",), log)
    assert log == [("query", "a"), ("launch", "a"), ("query", "b"), ("query", "a"), ("drain", "a"),
                   ("launch", "b")]
    assert order.last == "b"


def test_stream_order_tells_streams_apart_by_identity_not_handle():
    """A destroyed stream's handle may come back as a new stream's: the order compares (and holds) the stream
    objects, so a new stream with an old handle still waits for the previous launch."""

    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

    log = []
    order = StreamOrder(lambda st: False, lambda st: log.append(("record", st)),
                        lambda st: log.append(("wait", st)))
    first, second = Stream(7), Stream(7)  # the second: another stream that got the first one's handle
    _drive(order, (first, second), [])
    assert log == [("record", first), ("wait", second)]
    assert order.last is second


# ---------------------------------------------------------------- the push kernels (ipc/llpush, small_push.cu)
class PushModel(Model):
    """The model with the push kernels (``kernels/comm/small_push.cu``): reduce and allgather ``llpush``.  At its
    start a push kernel stores ack[me] = E into every peer (it has finished call E - 1), then waits only for the acks
    of the ranks whose slots it writes (reduce: a non-root for the root, the root for nobody; allgather: every
    peer); it pushes its lines as the LL kernels do and ends with the epoch word and its own ack alone (``endack``:
    and every peer's too, as the LL kernels).  ``depth`` D > 0: the lines go to a ring of slots of their own, slot
    [E % D][src], and a writer waits until the reader's ack has reached its mark of that slot (the last push call
    that took it, + 1; each rank keeps its own marks).  Rules that can be left out (``drop``): "ack wait" as before,
    and "push begin ack" (no ack at the start)."""

    def __init__(self, *args, endack=False, depth=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.endack, self.depth = endack, depth
        self.ring = [{} for _ in range(self.P)]   # (slot, src) -> (flag, call, value), in each rank's workspace
        self.marks = [{} for _ in range(self.P)]  # slot -> the last push call that took it, + 1 (a rank's own)

    def expected(self, spec, r):
        if spec["op"] == "allgather":
            return [[self.value(spec["call"], s, q) for q in range(self.P)] for s in range(self.P)]
        return super().expected(spec, r)

    def kernel(self, r, spec):
        if spec["algo"] != "llpush":
            yield from super().kernel(r, spec)
            return
        ws, P, me = self.ws, self.P, r
        j, op, root = spec["call"], spec["op"], spec.get("root", 0)
        E = ws[me].epoch
        self.epochs[(me, j)] = E
        if "push begin ack" not in self.drop:
            for t in range(P):
                if t != me:
                    ws[t].ack[me] = E
                    yield ("step",)
        writes = [t for t in range(P) if t != me and (op == "allgather" or (me != root and t == root))]
        D = self.depth
        need = self.marks[me].get(E % D, 0) if D else E - 1
        if "ack wait" not in self.drop:
            for t in writes:
                yield ("wait", t, lambda t=t: ws[me].ack[t] >= need)
        p, flag = E % 2, E + 1
        x = [self.value(j, me, q) for q in range(P)]

        def slots(owner):  # rank owner's slots of this call: the LL slots of parity p, or the ring's slot E % D
            return _RingSlots(self.ring[owner], E % D) if D else ws[owner].ll[p]

        for d in writes:
            slots(d)[me] = (flag, j, x)
            yield ("step",)

        def read(src):
            yield ("wait", src, lambda: slots(me)[src][0] == flag)
            _, tag, v = slots(me)[src]
            if tag != j:
                self.errors.append(f"rank {me} call {j} (E={E}) read rank {src}'s push line of call {tag}")
            return v

        if op == "allgather":
            got = [None] * P
            for src in range(P):
                got[src] = x if src == me else (yield from read(src))
            self.results[(me, j)] = got
        elif me == root:
            acc = [0] * P
            for src in range(P):
                v = x if src == me else (yield from read(src))
                acc = [a + b for a, b in zip(acc, v)]
            self.results[(me, j)] = acc
        ws[me].epoch = E + 1
        ws[me].ack[me] = E + 1
        if D:
            self.marks[me][E % D] = E + 1
        if self.endack:
            for t in range(P):
                if t != me:
                    ws[t].ack[me] = E + 1
                    yield ("step",)


class _RingSlots:
    """Slot [s][src] of a rank's ring, indexed by src (never written: flag 0)."""

    def __init__(self, ring, s):
        self.ring, self.s = ring, s

    def __getitem__(self, src):
        return self.ring.get((self.s, src), (0, None, None))

    def __setitem__(self, src, value):
        self.ring[(self.s, src)] = value


PUSH_KINDS = [("reduce", "llpush"), ("allgather", "llpush")]


@pytest.mark.parametrize("endack,depth", [(False, 0), (True, 0), (False, 4), (True, 8)])
@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_the_push_kernels_among_the_others_finish_with_the_right_data(P, endack, depth):
    """reduce / allgather ``llpush`` (the ack of the previous call sent at the start, none at the end; waits only for
    the ranks whose slots they write) between every other kind, the LL two-shot and pipelined ones included, roots
    moving, on several streams and in graphs: every run finishes, every rank gives every call the same number and
    every result is right."""
    # (one rank: no two-shot or pipelined kernel, which the host runs only among two ranks or more)
    kinds = KINDS + ([("bcast", "lltwoshot"), ("reduce", "pipe"), ("bcast", "pipe")] if P > 1 else []) + PUSH_KINDS * 4
    taken = 0
    for seed in range(10):
        model = PushModel(P, epoch=seed % 3, ordered=True, seed=seed, endack=endack, depth=depth)
        programs = _programs(P, seed, kinds=kinds)
        stuck = model.run(programs)
        assert stuck is None, (seed, stuck)
        assert not model.errors, (seed, model.errors[:3])
        for j in {j for (_, j) in model.epochs}:
            assert len({model.epochs[(r, j)] for r in range(P)}) == 1, (seed, j)
        taken += sum(a[0] == "call" and a[1]["algo"] == "llpush" for a in programs[0])
    assert taken > 20


@pytest.mark.parametrize("depth", [0, 4])
@pytest.mark.parametrize("seed", range(6))
def test_runs_of_push_kernels_beside_a_bcast_root_running_ahead(seed, depth):
    """The acks of the push kernels arrive one call late (at the next call's start): runs of push reduces (non-roots
    ahead, the root waiting for them) and allgathers between LL bcasts whose root runs first, at every rank's pace."""
    P = 3
    prog = []
    for i in range(8):
        prog += [call("bcast", "ll", "S", 0), call("reduce", "llpush", "S", (i + 1) % P),
                 call("reduce", "llpush", "S", (i + 1) % P), call("allgather", "llpush", "S")]
    for first in ({0}, {1, 2}, None):
        model = PushModel(P, seed=seed, first=first, depth=depth)
        stuck = model.run([list(prog) for _ in range(P)])
        assert stuck is None and not model.errors, (first, stuck, model.errors[:2])


@pytest.mark.parametrize("depth", [0, 4])
@pytest.mark.parametrize("rule", ["ack wait", "push begin ack"])
def test_every_rule_of_the_push_kernels_is_needed(rule, depth):
    """Without the wait for the root's ack of call E - 2, non-roots run first overwrite the root's slots before it
    has read them; without the ack at the start (and none at the end), the next kernels wait for an ack that never
    comes."""
    P = 3
    prog = [call("reduce", "llpush", "S", 0) for _ in range(8)] + [call("allgather", "llpush", "S")] * 4
    for drop, fails in (([], False), ([rule], True)):
        model = PushModel(P, seed=1, first={1, 2}, drop=drop, depth=depth)
        stuck = model.run([list(prog) for _ in range(P)])
        assert bool(stuck or model.errors) is fails, (drop, stuck, model.errors[:2])


def test_the_ring_lets_a_reduces_non_roots_run_ahead_of_the_root():
    """In the ring (depth D), a push reduce's non-roots, run first, write their lines of call E once the root has
    started call E - D + 1 (they start call E, then wait, with the root D calls behind), against E - 1 in the LL
    slots of the call's parity (2 behind): the root finds their lines there when it comes."""
    P = 3
    prog = [call("reduce", "llpush", "S", 0) for _ in range(12)]
    for depth, ahead in ((0, 2), (4, 4), (8, 8)):
        model = PushModel(P, seed=0, first={1, 2}, depth=depth)
        lead = []
        orig = model.kernel

        def kernel(r, spec, orig=orig, model=model, lead=lead):
            if r != 0:  # a non-root starting a call: how many calls it is ahead of the root
                lead.append(model.ws[r].epoch - model.ws[0].epoch)
            return orig(r, spec)

        model.kernel = kernel
        assert model.run([list(prog) for _ in range(P)]) is None and not model.errors
        assert max(lead) == ahead, (depth, max(lead))
