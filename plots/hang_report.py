#!/usr/bin/env python3
"""Why did the run stop? Read every rank's flight record and name the first disagreement.

    plots/hang_report.py OUT/flight        # the folder the watchdog wrote (--hang-timeout)

The records (common/flight.h) hold each rank's last operations of common/comm: for each
group (which world ranks), the collectives numbered in the order the rank called them, and
the point-to-point messages numbered per peer and direction, with kind, count, value type,
root, tag, a label (the trace event they ran in) and the step. MPI and NCCL need every
member of a group to make the same collectives in the same order, and each message to be
received as it was sent, so the report lines the ranks up group by group and message by
message and prints, on its first line, the first place where they disagree:

    group {0,1,2,3}: ranks 0, 1, 3 are in allreduce #4 (after backward, step 3, 42368 x fp32 = 169.5 kB);
    rank 2 is in allreduce_host #4 (after optimizer, step 3, 1 x f64 = 8 B) - rank 2 took another path at step 3

"took another path" names the rank whose call differs from its own call at the same place
(the same count of that group's calls into the step) one step earlier: the others repeat
what they did, it does not. The lines after the first say what each rank was doing when it
wrote its record. Exit status: 0 with a finding, 1 when the records show none (the lines
then say what each rank waits in), 2 when there is nothing to read.

The report reads only the records' operations: a test-only fault's note ("injected") is
not used (tests/test_flight.py checks the report against it)."""
import glob
import json
import os
import sys

COLLECTIVES = {"allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall", "alltoallv", "barrier",
               "allreduce_host"}
SENDS = {"send", "isend"}
RECVS = {"recv", "irecv"}


def human_bytes(b):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


class Group:
    def __init__(self, gid, members, axis=""):
        self.id, self.members, self.axis = gid, list(members), axis

    def text(self):
        """"tp group {2,3}": the axis the lab named (flight_group_axis), then the world ranks."""
        m = self.members
        named = f"{self.axis} group " if self.axis else "group "
        if len(m) > 14:
            return named + "{" + ",".join(map(str, m[:12])) + f",...,{m[-1]}}} ({len(m)} ranks)"
        return named + "{" + ",".join(map(str, m)) + "}"

    def world(self, r):
        return self.members[r] if 0 <= r < len(self.members) else r


def ranks_text(ranks):
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class Op(dict):
    """One operation of one rank's record, with its rank and group."""

    def where(self, group, with_group=True):
        label, step = self.get("label") or "", self.get("step", -1)
        inside = ", ".join(x for x in (label, f"step {step + 1}" if step >= 0 else "") if x)
        size = f"{self['count']} x {self['type']} = {human_bytes(self['bytes'])}"
        extra = ""
        if self["kind"] in SENDS | RECVS:
            extra = f", tag {self['tag']}"
        if self["kind"] == "broadcast":
            extra = f", root {group.world(self['root'])}"
        peer = ""
        if self["kind"] in SENDS:
            peer = f" to rank {group.world(self['peer'])}"
        elif self["kind"] in RECVS:
            peer = f" from rank {group.world(self['peer'])}"
        of = f" of {group.text()}" if with_group else ""
        return f"{self['kind']} #{self['seq']}{peer}{of} ({inside}{', ' if inside else ''}{size}{extra})"

    def call(self):
        """What must agree between the ranks' calls at one place (the label excepted)."""
        # an all-to-all's counts differ by rank: they are compared pair by pair (alltoall_findings)
        count = None if self["kind"] in ("alltoall", "alltoallv") else self["count"]
        return (self["kind"], count, self["type"], self.get("root", -1), self.get("tag", -1))

    def same_place_call(self):
        """What a rank repeats step after step at one place: the call and its label."""
        return self.call() + (self.get("label"),)


def load(folder):
    records = {}
    for path in sorted(glob.glob(os.path.join(folder, "rank-*.json"))):
        with open(path, encoding="utf-8") as f:
            try:
                rec = json.load(f)
            except ValueError as e:
                print(f"{path}: not JSON ({e}); skipped", file=sys.stderr)
                continue
        records[rec["rank"]] = rec
    return records


class Analysis:
    def __init__(self, records):
        self.records = records
        self.world_size = max(r["world_size"] for r in records.values())
        self.groups = {}  # (id, members) -> Group
        self.ops = {}  # rank -> [Op], oldest first, the pending check's op included
        self.pending = {}  # rank -> Op it waits in (None: none)
        for rank, rec in records.items():
            gmap = {}
            for g in rec["groups"]:
                if g["members"]:
                    key = (g["id"], tuple(g["members"]))
                    self.groups.setdefault(key, Group(g["id"], g["members"], g.get("axis", "")))
                    gmap[g["id"]] = key
            ops = []
            for o in rec["ops"]:
                op = Op(o, rank=rank, gkey=gmap.get(o["group"]))
                ops.append(op)
            pend = rec.get("pending")
            pop = None
            if pend:
                match = [op for op in ops if op["id"] == pend["id"] and pend["id"] >= 0]
                if match:
                    pop = match[0]
                else:  # a wait for an op the ring lost, or --check-collectives' check before a call
                    pop = Op(pend, rank=rank, gkey=gmap.get(pend["group"]))
                    if pend.get("in_check"):
                        ops.append(pop)
                pop["waiting"] = True
                pop["in_check"] = pend.get("in_check", False)
                pop["waiting_since_s"] = pend.get("waiting_since_s")
            self.ops[rank] = ops
            self.pending[rank] = pop
        self.rank_group = {}  # (rank, gkey) -> the rank's group entry
        for rank, rec in records.items():
            for g in rec["groups"]:
                if g["members"]:
                    self.rank_group[(rank, (g["id"], tuple(g["members"])))] = g

    # -- what one rank repeats ---------------------------------------------------------

    def covered(self, rank, step):
        """Whether the rank's ring reaches back to the start of `step`."""
        rec = self.records[rank]
        if rec["ops_issued"] <= rec["records_kept"]:
            return True
        return any(op["step"] < step for op in self.ops[rank])

    def stream(self, op):
        """The rank's operations that are numbered together with op: the group's
        collectives, or the messages to / from one peer."""
        if op["kind"] in COLLECTIVES:
            return lambda o: o["gkey"] == op["gkey"] and o["kind"] in COLLECTIVES
        kinds = SENDS if op["kind"] in SENDS else RECVS
        return lambda o: o["gkey"] == op["gkey"] and o["kind"] in kinds and o["peer"] == op["peer"]

    def deviates(self, op):
        """True when op differs from the rank's own call at the same place one step
        earlier (None: not known, the ring does not reach back that far)."""
        if op.get("same_as_last_step") is not None:  # the rank compared it when it made the call
            return not op["same_as_last_step"]
        step = op.get("step", -1)
        if step < 1 or not self.covered(op["rank"], step - 1):
            return None
        same = self.stream(op)
        mine = [o for o in self.ops[op["rank"]] if same(o)]
        now = [o for o in mine if o["step"] == step and o["seq"] < op["seq"]]
        before = [o for o in mine if o["step"] == step - 1]
        offset = len(now)
        return offset >= len(before) or before[offset].same_place_call() != op.same_place_call()

    def state(self, rank):
        """What the rank was doing when it wrote its record, in words."""
        rec = self.records.get(rank)
        if rec is None:
            return f"rank {rank} wrote no record"
        pend = self.pending.get(rank)
        if pend is not None:
            group = self.groups.get(pend["gkey"])
            check = "--check-collectives' check before " if pend.get("in_check") else ""
            waited = rec["dumped_at_s"] - pend["waiting_since_s"] if pend.get("waiting_since_s") else None
            since = f" for {waited:.1f} s" if waited is not None else ""
            return f"rank {rank} waits{since} in {check}{pend.where(group) if group else pend['kind']}"
        if rec.get("outside_wait_since_s"):
            return (f"rank {rank} waits for {rec['dumped_at_s'] - rec['outside_wait_since_s']:.1f} s in an MPI wait "
                    "outside common/comm's operations (run.c's agreement at a step's end, or the run's closing gathers)")
        done = [op for op in self.ops[rank] if op.get("completed_s") is not None]
        if done:
            last = done[-1]
            ago = rec["dumped_at_s"] - last["completed_s"]
            return (f"rank {rank} is in no communication of common/comm: its last, "
                    f"{last.where(self.groups[last['gkey']])}, ended {ago:.1f} s before its record")
        return f"rank {rank} is in no communication of common/comm"

    def elsewhere(self, rank, gkey):
        """A rank missing from a group's call: what it does instead, in words."""
        pend = self.pending.get(rank)
        if pend is not None and pend["gkey"] != gkey:
            return f"is in {pend.where(self.groups[pend['gkey']])} instead"
        if pend is not None:
            return f"is in {pend.where(self.groups[pend['gkey']], with_group=False)}"
        return self.state(rank).split(" ", 2)[2]

    # -- collectives -------------------------------------------------------------------

    def collective_findings(self, gkey, group):
        findings = []
        members = group.members
        have = [m for m in members if m in self.records]
        by_rank = {}
        for m in have:
            by_rank[m] = {op["seq"]: op for op in self.ops[m] if op["gkey"] == gkey and op["kind"] in COLLECTIVES}
        if not by_rank:
            return findings
        last = {m: self.rank_group[(m, gkey)]["collectives"] - 1 for m in have}
        for m in have:  # a pending check's call is not yet counted
            if by_rank[m]:
                last[m] = max(last[m], max(by_rank[m]))
        lo = max(min(s) if s else last[m] + 1 for m, s in by_rank.items())
        hi = max(last.values())
        for k in range(lo, hi + 1):
            present = {m: by_rank[m][k] for m in have if k in by_rank[m]}
            absent = [m for m in have if k not in by_rank[m] and last[m] < k]
            if not present:
                continue
            step = min(op["step"] for op in present.values())
            calls = {}
            for m, op in present.items():
                calls.setdefault(op.call(), []).append(m)
            dev = {m: self.deviates(op) for m, op in present.items()}
            deviators = [m for m, d in dev.items() if d]
            waiting = any(op.get("waiting") or op.get("completed_s") is None for op in present.values())
            if len(calls) > 1 or (deviators and len(deviators) < len(have) and
                                  len({op.get("label") for op in present.values()}) > 1):
                findings.append(self.mismatch(group, gkey, k, step, present, calls, deviators, absent))
            elif absent and waiting:
                findings.append(self.missing(group, gkey, k, step, present, absent))
        return findings

    def mismatch(self, group, gkey, k, step, present, calls, deviators, absent):
        blamed = set(deviators) if deviators and len(deviators) < len(present) else set()
        if not blamed:
            sizes = sorted((len(v), c) for c, v in calls.items())
            if len(sizes) > 1 and sizes[0][0] < sizes[1][0]:
                blamed = set(calls[sizes[0][1]])
        # classes of equal calls (with their labels), the others first, then the blamed
        classes = {}
        for m, op in present.items():
            classes.setdefault((op.same_place_call(), m in blamed), []).append(m)
        parts = []
        for (_, is_blamed), ranks in sorted(classes.items(), key=lambda kv: (kv[0][1], min(kv[1]))):
            op = present[min(ranks)]
            verb = "is" if len(ranks) == 1 else "are"
            parts.append(f"{ranks_text(ranks)} {verb} in {op.where(group, with_group=False)}")
        for m in absent:
            parts.append(f"rank {m} {self.elsewhere(m, gkey)}")
        line = f"{group.text()}: " + "; ".join(parts)
        if blamed and deviators and set(deviators) == blamed:
            line += f" - {ranks_text(blamed)} took another path at step {step + 1}"
        elif blamed:
            line += f" - {ranks_text(blamed)} differ{'s' if len(blamed) == 1 else ''} from the rest"
        return {"step": step, "order": 0 if blamed else 2, "seq": k, "line": line, "blamed": blamed}

    def missing(self, group, gkey, k, step, present, absent):
        waiting = sorted(present)
        op = present[waiting[0]]
        parts = [f"{ranks_text(waiting)} {'is' if len(waiting) == 1 else 'are'} in "
                 f"{op.where(group, with_group=False)}"]
        blamed, took = set(absent), []
        for m in absent:
            pend = self.pending.get(m)
            if pend is not None and pend["gkey"] != gkey and self.deviates(pend):
                took.append(m)
            parts.append(f"rank {m} {self.elsewhere(m, gkey)}" if pend is not None else
                         f"rank {m} has not entered it: it {self.elsewhere(m, gkey)}")
        line = f"{group.text()}: " + "; ".join(parts)
        if took:
            line += f" - {ranks_text(took)} took another path at step {step + 1}"
        # a group whose missing ranks are the many (they wait in another group for the few) comes later
        order = 1 if took else (1.5 if len(absent) < len(present) else 3)
        return {"step": step, "order": order, "seq": k, "line": line, "blamed": blamed}

    # -- all-to-all counts -------------------------------------------------------------

    def alltoall_findings(self, gkey, group):
        findings = []
        ops = {}
        for m in group.members:
            for op in self.ops.get(m, []):
                if op["gkey"] == gkey and op["kind"] in ("alltoall", "alltoallv") and "send_counts" in op:
                    ops.setdefault(op["seq"], {})[m] = op
        for k, present in sorted(ops.items()):
            for a, op in present.items():
                for j, b in enumerate(group.members):
                    if b == a or b not in present or present[b]["kind"] != op["kind"]:
                        continue
                    sent = op["send_counts"][j]
                    expected = present[b]["recv_counts"][group.members.index(a)]
                    if sent != expected:
                        line = (f"{group.text()}: in {op.where(group, with_group=False)} rank {a} sends {sent} "
                                f"value{'' if sent == 1 else 's'} to rank {b}, which expects {expected}")
                        findings.append({"step": op["step"], "order": 0, "seq": k, "line": line, "blamed": {a}})
        return findings

    # -- point to point ------------------------------------------------------------------

    def p2p_findings(self, gkey, group):
        findings = []
        members = [m for m in group.members if m in self.records]
        for a in members:
            for b in members:
                ga, gb = group.members.index(a), group.members.index(b)
                sends = {op["seq"]: op for op in self.ops[a]
                         if op["gkey"] == gkey and op["kind"] in SENDS and op["peer"] == gb}
                recvs = {op["seq"]: op for op in self.ops[b]
                         if op["gkey"] == gkey and op["kind"] in RECVS and op["peer"] == ga}
                sent_total = self.rank_group[(a, gkey)]["sent"][gb]
                for j in sorted(set(sends) & set(recvs)):
                    s, r = sends[j], recvs[j]
                    what = []
                    if s["tag"] != r["tag"]:
                        what.append(f"tag ({s['tag']} and {r['tag']}: MPI matches a message by its tag, so "
                                    "neither completes)")
                    if s["count"] != r["count"]:
                        what.append(f"count ({s['count']} and {r['count']} values)")
                    if not what:
                        continue
                    blamed = {x["rank"] for x in (s, r) if self.deviates(x)}
                    line = (f"{group.text()}: rank {a}'s {s.where(group, with_group=False)} and rank {b}'s "
                            f"{r.where(group, with_group=False)} differ in {' and '.join(what)}")
                    if len(blamed) == 1:
                        line += f" - {ranks_text(blamed)} took another path at step {min(s['step'], r['step']) + 1}"
                    findings.append({"step": min(s["step"], r["step"]), "order": 0 if len(blamed) == 1 else 1,
                                     "seq": j, "line": line, "blamed": blamed or {a, b}})
                # a receive that waits for a message its sender has not sent
                for j, r in sorted(recvs.items()):
                    if j < sent_total or not (r.get("waiting") or r.get("completed_s") is None):
                        continue
                    if not r.get("waiting") and self.pending.get(b) is not None:
                        continue  # posted, but the rank waits in something else
                    findings.append(self.unsent(group, gkey, a, b, r))
                    break
        return findings

    def unsent(self, group, gkey, a, b, r):
        """Rank b waits for message r from rank a, which a never sent."""
        line = f"{group.text()}: rank {b} is in {r.where(group, with_group=False)}; rank {a} has not sent it"
        blamed = set()
        if self.deviates(r):  # b asks for a message where it did not before
            line = (f"{group.text()}: rank {b} is in {r.where(group, with_group=False)}, a message rank {a} "
                    f"never sent - rank {b} took another path at step {r['step'] + 1}")
            blamed = {b}
        else:
            # a message of a's that went elsewhere, where a did not send one before
            gb = group.members.index(b)
            stray = [op for op in self.ops[a] if op["gkey"] == gkey and op["kind"] in SENDS and op["peer"] != gb and
                     op["step"] == r["step"] and self.deviates(op)]
            if stray:
                s = stray[0]
                line += (f": it sent {s.where(group, with_group=False)} instead - rank {a} took another path at step "
                         f"{s['step'] + 1}")
                blamed = {a}
            else:
                line += f": rank {a} {self.elsewhere(a, gkey)}"
        # after a pair that disagrees in count or tag (certain), before a guess; of the guesses, the end of a
        # chain of waits (a sender in no communication) before a sender that waits itself
        order = 0.5 if blamed else (1.2 if self.pending.get(a) is None else 2.5)
        return {"step": r["step"], "order": order, "seq": r["seq"], "line": line,
                "blamed": blamed or {a}}

    def findings(self):
        out = []
        for gkey, group in sorted(self.groups.items()):
            out += self.collective_findings(gkey, group)
            out += self.alltoall_findings(gkey, group)
            out += self.p2p_findings(gkey, group)
        # the earliest step first; in a step, a rank that took another path before a guess
        out.sort(key=lambda f: (f["step"], f["order"], f["seq"]))
        return out


def report(folder):
    records = load(folder)
    if not records:
        print(f"{folder}: no flight records (rank-R.json): did the watchdog run? (--hang-timeout)")
        return 2, []
    a = Analysis(records)
    lines = []
    checks = [r["check"] for r in records.values() if r.get("check")]
    found = a.findings()
    if checks:  # --check-collectives compared the calls of every member before it stopped: its words
        lines.append(checks[0])
    elif found:
        lines.append(found[0]["line"])
    else:
        lines.append("no disagreement in the records: every group's calls agree as far as the rings reach "
                     "(a rank stuck outside common/comm, or a larger --flight-records may show more)")
    missing = [r for r in range(a.world_size) if r not in records]
    if missing:
        lines.append(f"no record from {ranks_text(missing)} (a rank that died, or a host without this folder)")
    for r in sorted(records):
        if records[r].get("error"):
            lines.append(f"rank {r} stopped on an error: {records[r]['error']}")
    for f in found[1:4]:
        lines.append("also: " + f["line"])
    lines.append("what each rank was doing:")
    for r in sorted(records):
        lines.append("  " + a.state(r))
    return (0 if checks or found else 1), lines


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    status, lines = report(argv[1])
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
