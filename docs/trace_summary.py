#!/usr/bin/python3
"""Summarise a train_gpt --trace file: what ran per step, and how much of the
communication overlapped backward.

  /usr/bin/python3 docs/trace_summary.py trace.json
  /usr/bin/python3 docs/trace_summary.py --ring trace.json    (a --cp run: the picture of the ring's steps)

Per rank it prints every collective and pipeline transfer that runs every
step (its name without the sequence number, and a transfer's without its
micro-batch: "send_forward" stands for send_forward mb0, mb1, ...) with how
many times it ran per optimizer step and the KiB it carried (sizes as the
trace rounds them, each span down to whole KiB), then the time of the data-parallel
collectives, the share of it hidden
behind backward's compute (inside `backward` or a pipeline B<i> or, interleaved,
B<i>.<c> span, but not
inside a "wait for ..." span, where the compute thread blocks on them), and
the time per step the compute thread spent in "wait for ..." spans: the
overlap the bucketed and ZeRO chapters are about. A trace without any "wait
for" span ran synchronous collectives (--dp-mode naive: the hook returns when
its all-reduce is done), so none of their time was hidden. With ZeRO's param
all-gathers it also prints the share of their time that overlapped a forward
(`forward` or F<i>) span on the compute track: what --overlap-param-gather buys.
With ZeRO's per-bucket step (`step bucket b` spans) it counts how many ran
inside a "wait for ..." span, while the gradient sync was still in flight
(--grad-clip 0), rather than after it (clipping needs the whole gradient).

Last, per rank, what the data-parallel collectives cost per step after the
first (step_traffic): the bytes this rank sent (from each span's exact
"bytes"), and their time on the communication track with the part of it that
had no compute beside it - the exposed communication prefetch is meant to hide
(ZeRO-3, chapter 12).

A span on the communication track runs from the moment the collective starts
on this rank to the moment it completes here, so it includes waiting for the
slowest rank of the group to arrive: a long span is not a slow link by itself.
"""
import collections
import json
import re
import sys


def overlap(a, b, intervals):
    """Microseconds of [a, b) covered by the (disjoint) intervals."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in intervals)


def summarise(events):
    """events: the trace's traceEvents. Returns {pid: dict} (see main)."""
    spans = [e for e in events if e.get("ph") == "X"]
    out = {}
    for pid in sorted({e["pid"] for e in spans}):
        mine = [e for e in spans if e["pid"] == pid]
        compute = [e for e in mine if e["tid"] == 0]
        start = min((e["ts"] for e in compute), default=0)  # setup (broadcasts, handshake) left out
        comm = [e for e in mine if e["tid"] == 1 and e["ts"] >= start]
        steps = sum(1 for e in compute if e["name"] == "optimizer step") or 1
        backward = [(e["ts"], e["ts"] + e["dur"]) for e in compute
                    if e["name"] == "backward" or re.fullmatch(r"B\d+(\.\d+)?", e["name"])]
        counts, kib = collections.Counter(), collections.Counter()
        for e in comm:  # "all_reduce(avg, float32) dp (size 2) #7 (27 KiB)", "send_forward mb3.1 (64 KiB)"
            m = re.fullmatch(r"(.*?)(?: #\d+| mb\d+(?:\.\d+)?)? \((\d+) KiB\)", e["name"])
            name = m.group(1) if m else re.sub(r" mb\d+(\.\d+)?$", "", e["name"])
            counts[name] += 1
            kib[name] += int(m.group(2)) if m else 0
        # The compute thread blocked on communication: spans named "wait for ...".
        waits = [(e["ts"], e["ts"] + e["dur"]) for e in compute if e["name"].startswith("wait for")]
        # Only a wait inside backward takes time away from it (a pipeline waits for its dp
        # sync after the schedule, outside every B span).
        waits_in_backward = [(max(x, u), min(y, v)) for x, y in waits for u, v in backward if max(x, u) < min(y, v)]
        total = hidden = 0.0
        for e in comm:
            if not re.match(r"(all_reduce|reduce_scatter|all_gather)\(", e["name"]) or " dp " not in e["name"] \
                    or "float64" in e["name"]:  # the logged loss, not a gradient
                continue
            a, b = e["ts"], e["ts"] + e["dur"]
            total += b - a
            # hidden: while backward computed (inside backward, not inside a wait)
            hidden += overlap(a, b, backward) - overlap(a, b, waits_in_backward)
        # ZeRO's param all-gathers: the share of their time a forward computed beside them.
        forward = [(e["ts"], e["ts"] + e["dur"]) for e in compute
                   if e["name"] == "forward" or re.fullmatch(r"F\d+(\.\d+)?", e["name"])]
        gathers = [(e["ts"], e["ts"] + e["dur"]) for e in comm if e["name"].startswith("all_gather(") and " dp " in e["name"]]
        # ZeRO's step per bucket: inside a wait (the sync still running) or after it
        step_buckets = [(e["ts"], e["ts"] + e["dur"]) for e in compute if e["name"].startswith("step bucket")]
        stepped_in_wait = sum(1 for a, b in step_buckets if any(x <= a and b <= y for x, y in waits))
        gather_total = sum(b - a for a, b in gathers)
        gather_in_forward = sum(overlap(a, b, forward) for a, b in gathers)
        out[pid] = {"steps": steps, "per_step": {k: (v / steps, kib[k] / steps) for k, v in counts.items()},
                    "gather_overlaps_forward": gather_in_forward / gather_total if gather_total else None,
                    "step_buckets_in_wait": (stepped_in_wait, len(step_buckets)),
                    "dp_comm_ms": total / 1e3, "dp_comm_hidden": hidden / total if total else 0.0,
                    "wait_ms_per_step": sum(y - x for x, y in waits) / 1e3 / steps, "async": bool(waits)}
    return out


RING_STEP_RE = re.compile(r"ring ([FB]) s(\d+): K/V of rank (\d+) \(chunks (\d+) (\d+)\):(.*)")
RING_HOP_RE = re.compile(r"ring ([FB]) hop (K/V|dK/dV) (\d+) B \(\d+ KiB\)")


def ring_steps(events):
    """The ring attention steps of a --cp run's trace (parallel/context_parallel/ring_trace.h):
    {pid: {"F"/"B": [step, ...]}} for the first forward and the first backward ring after the
    first optimizer step (step 2: step 1 pays one-time costs), each step a dict: s, src,
    chunks, blocks, hops (what, bytes, ms, share of the hop's time the step's math
    overlapped), and "after": the hops posted after the last step (dK/dV going home)."""
    spans = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    out = {}
    for pid in sorted({e["pid"] for e in spans}):
        mine = [e for e in spans if e["pid"] == pid]
        first_step = next((e["ts"] + e["dur"] for e in mine if e["name"] == "optimizer step" and e["tid"] == 0), 0)
        for pass_ in "FB":
            # this pass's steps and hops; a K/V hop is posted just before the step it travels beside,
            # a dK/dV hop just after the step that summed it (the last one goes home)
            ring = [e for e in mine if e["tid"] == 0 and (m := RING_STEP_RE.fullmatch(e["name"])) and m.group(1) == pass_]
            hops = [(e, m.group(2), int(m.group(3))) for e in mine
                    if e["tid"] == 1 and (m := RING_HOP_RE.fullmatch(e["name"])) and m.group(1) == pass_]
            start = next((i for i, e in enumerate(ring)
                          if e["ts"] >= first_step and RING_STEP_RE.fullmatch(e["name"]).group(2) == "0"), None)
            if start is None:
                continue
            end = next((i for i in range(start + 1, len(ring)) if RING_STEP_RE.fullmatch(ring[i]["name"]).group(2) == "0"),
                       len(ring))
            rows, lo = [], ring[start - 1]["ts"] + ring[start - 1]["dur"] if start > 0 else -float("inf")
            for e in ring[start:end]:
                m = RING_STEP_RE.fullmatch(e["name"])
                a, b = e["ts"], e["ts"] + e["dur"]
                beside = [(w, n, h["dur"] / 1e3, overlap(h["ts"], h["ts"] + h["dur"], [(a, b)]) / h["dur"] if h["dur"] else 1.0)
                          for h, w, n in hops if lo <= h["ts"] <= a and (w == "K/V" or e is not ring[start])]
                rows.append({"s": int(m.group(2)), "src": int(m.group(3)), "chunks": (int(m.group(4)), int(m.group(5))),
                             "blocks": m.group(6).split(), "hops": beside})
                lo = b
            upto = ring[end]["ts"] if end < len(ring) else float("inf")
            after = [(w, n, h["dur"] / 1e3) for h, w, n in hops if lo <= h["ts"] < upto and w == "dK/dV"]
            out.setdefault(pid, {})[pass_] = {"steps": rows, "after": after}
    return out


def print_ring(events):
    """The picture of the ring: per cp rank and step, the K/V block held, the blocks computed
    (q3k1: query chunk 3 x key chunk 1; * the diagonal, causal block) and the hops in flight
    beside the step's math, with the share of each hop's time the math overlapped."""
    for pid, passes in ring_steps(events).items():
        for pass_, ring in passes.items():
            print(f"rank {pid}, {'forward' if pass_ == 'F' else 'backward'} ring (one layer, step 2):")
            print(f"  {'step':4}  {'holds K/V of':19}  {'computes':22}  hops in flight beside it (bytes, ms, overlapped)")
            for st in ring["steps"]:
                hops = "; ".join(f"{w} {n} B, ~{ms:.2f} ms, ~{100 * share:.0f}%" for w, n, ms, share in st["hops"])
                print(f"  s{st['s']:<3}  rank {st['src']} (chunks {st['chunks'][0]} {st['chunks'][1]})  "
                      f"{' '.join(st['blocks']):22}  {hops or '-'}")
            for w, n, ms in ring["after"]:
                print(f"  after the last step: {w} {n} B home, ~{ms:.2f} ms, nothing left to overlap it")

def union(intervals):
    """The disjoint intervals covering the same time as `intervals`."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract(intervals, holes):
    """The parts of the disjoint `intervals` outside the disjoint `holes`."""
    out = []
    for a, b in intervals:
        for x, y in holes:
            if y <= a or x >= b:
                continue
            if x > a:
                out.append((a, x))
            a = max(a, y)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def step_traffic(events):
    """What the data-parallel gradient/param collectives cost per optimizer step,
    over the steps after the first (which warms up): {pid: dict}, for ranks
    with at least 2 optimizer steps. A step is the time from one "optimizer
    step" span's start to the next's, so it holds that step's param all-gather
    (ZeRO-1/2) and the next forward and backward, whole.

    sent_bytes: what this rank sends, from the spans' exact "bytes" (args): a
    ring all-gather or reduce-scatter of a B-byte buffer over N ranks sends
    B (N-1)/N from each rank, an all-reduce (a reduce-scatter, then an
    all-gather) twice that. So ZeRO-1's reduce-scatter + all-gather of Ψ bytes
    sends 2Ψ(N-1)/N, and ZeRO-3's two all-gathers + reduce-scatter 3Ψ(N-1)/N.
    exposed_ms: the time those collectives ran on the communication track
    while the compute track did no work (outside forward, backward and the
    optimizer step, or inside a "wait for ..." span there): communication that
    was not hidden behind compute. waited_ms: the time the compute thread spent
    in "wait for ..." spans, blocked on communication: what the step lost to it."""
    out = {}
    spans = [e for e in events if e.get("ph") == "X"]
    for pid in sorted({e["pid"] for e in spans}):
        mine = [e for e in spans if e["pid"] == pid]
        steps = sorted(e["ts"] for e in mine if e["tid"] == 0 and e["name"] == "optimizer step")
        if len(steps) < 2:
            continue
        first, last = steps[0], steps[-1]
        inside = [e for e in mine if first <= e["ts"] < last]
        work = union((e["ts"], e["ts"] + e["dur"]) for e in inside if e["tid"] == 0 and (
            e["name"] in ("forward", "backward", "optimizer step") or re.fullmatch(r"[FB]\d+(\.\d+)?", e["name"])))
        waits = union((e["ts"], e["ts"] + e["dur"]) for e in inside if e["tid"] == 0 and e["name"].startswith("wait for"))
        busy = subtract(work, waits)
        sent, comm = collections.Counter(), []
        for e in inside:
            m = re.match(r"(all_reduce|reduce_scatter|all_gather)\((.*?)\) dp\S* \(size (\d+)\)", e["name"])
            if e["tid"] != 1 or not m or "float64" in m.group(2):  # float64: the logged loss, not a gradient
                continue
            n = int(m.group(3))
            sent[m.group(1)] += e.get("args", {}).get("bytes", 0) * (n - 1) / n * (2 if m.group(1) == "all_reduce" else 1)
            comm.append((e["ts"], e["ts"] + e["dur"]))
        comm = union(comm)
        comm_us = sum(b - a for a, b in comm)
        exposed_us = sum(b - a for a, b in subtract(comm, busy))
        k = len(steps) - 1
        out[pid] = {"steps": k, "sent_bytes": sum(sent.values()) / k, "sent_by_kind": {x: v / k for x, v in sent.items()},
                    "comm_ms": comm_us / 1e3 / k, "exposed_ms": exposed_us / 1e3 / k,
                    "exposed_share": exposed_us / comm_us if comm_us else 0.0,
                    "waited_ms": sum(b - a for a, b in waits) / 1e3 / k}
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--ring":  # the ring attention picture (--cp)
        with open(sys.argv[2]) as f:
            return print_ring(json.load(f)["traceEvents"])
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        events = json.load(f)["traceEvents"]
    for pid, s in summarise(events).items():
        print(f"rank {pid}: {s['steps']} optimizer steps")
        for name, (n, kib) in sorted(s["per_step"].items()):
            print(f"  {n:6.1f} per step {kib:8.0f} KiB per step  {name}")
        if s["gather_overlaps_forward"] is not None:
            print(f"  param all-gathers: {100 * s['gather_overlaps_forward']:.0f}% of their time overlapped a forward")
        if s["step_buckets_in_wait"][1]:
            k, n = s["step_buckets_in_wait"]
            print(f"  {k} of {n} 'step bucket' spans ran inside a 'wait for ...' span (while the gradient sync ran)")
        if s["dp_comm_ms"] == 0:
            print("  no data-parallel gradient collectives (dp = 1)")
            continue
        if not s["async"]:  # DataParallelNaive: the hook itself waits, inside backward
            print(f"  dp gradient collectives: {s['dp_comm_ms']:.1f} ms in all, synchronous (no 'wait for' "
                  f"span): backward stopped for each one, none of it hidden")
            continue
        print(f"  dp gradient/param collectives: {s['dp_comm_ms']:.1f} ms in all, "
              f"{100 * s['dp_comm_hidden']:.0f}% of it hidden behind backward's compute; "
              f"compute waited {s['wait_ms_per_step']:.2f} ms per step")
    for pid, t in step_traffic(events).items():
        print(f"rank {pid}, {t['steps']} steps after the first: the data-parallel collectives sent {t['sent_bytes']:.0f} bytes "
              f"per step from this rank ({', '.join(f'{k} {v:.0f}' for k, v in sorted(t['sent_by_kind'].items()))}); "
              f"{t['comm_ms']:.2f} ms per step on the communication track, {t['exposed_ms']:.2f} ms of it exposed "
              f"({100 * t['exposed_share']:.0f}%: no compute beside it); compute waited {t['waited_ms']:.2f} ms per step")


if __name__ == "__main__":
    main()
