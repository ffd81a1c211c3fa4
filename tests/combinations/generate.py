#!/usr/bin/env python3
"""The combination sweep's cases: a covering array over train_gpt's flags.

Pairwise (strength 2): every pair of values of every two factors below is in
some case. --full adds strength 3 over the parallel sizes, --zero and the
lifecycle: every triple of their values is in some case.

Two kinds of rules shape the array:
- CONSTRAINTS: what the command line cannot mean (world > 8, a divisibility
  that fails, a flag that only means something beside another one). A case
  they forbid is never generated.
- REFUSALS: what train_gpt says it does not support (yet). Such a case IS
  generated, and must be refused before training (run_case.py checks that).
  A refused case teaches nothing about the flags beside the refusing ones, so
  it covers only the tuples that are refused whatever else is chosen; every
  other tuple must be covered by a case that runs. The rules are this file's
  prediction; the runner's verdict never depends on it (a prediction that
  turns out wrong is reported, not failed).

Greedy and deterministic (AETG-style, fixed seed): take the first uncovered
tuple, build a few candidate cases around it, one factor at a time choosing
the value that covers the most uncovered tuples (and keeps the case
completable), keep the best candidate. Python's standard library only.

Usage: generate.py [--full] [--out cases.json]   (prints the case count)
"""
import argparse
import itertools
import json
import random
import sys

# The tiny model every case trains (run_case.py passes the same numbers).
LAYERS, HEADS, BLOCK = 6, 4, 16

FACTORS = [  # name, values (the first is train_gpt's default where it has one)
    ("dp", [1, 2, 4]),
    ("tp", [1, 2, 4]),
    ("pp", [1, 2, 4]),
    ("cp", [1, 2, 4]),
    ("zero", [0, 1, 2, 3]),
    ("dp_shard", [0, 1, 2]),  # --dp-shard: 0 = not given (dp); HSDP when it is less than dp
    ("lifecycle", ["none", "resume", "export", "init"]),
    ("sequence_parallel", [False, True]),
    ("dp_mode", ["bucket", "naive"]),
    ("bucket_mb", [25, 0.01]),
    ("virtual_stages", [1, 2]),
    ("schedule", ["1f1b", "afab", "zb-h1", "zb-v", "dualpipev"]),
    ("partition", ["uniform", "balanced"]),
    ("dtype", ["fp32", "bf16", "fp16"]),
    ("recompute", ["none", "selective", "full"]),
    ("arch", ["gpt2", "llama"]),
    ("kv_heads", [0, 2, 1]),
    ("untied", [False, True]),
    ("grad_accum", [1, 2]),
    ("microbatches", [0, 1, 2, 4]),
    ("overlap_param_gather", [False, True]),
    ("overlap_pairs", [False, True]),  # --overlap-pairs: DualPipeV's pairs on two threads (overlapped_pairs.h)
    ("zero3_prefetch", ["on", "off"]),
    ("zero3_reshard_after_forward", ["on", "off"]),
    ("dropout", [0.0, 0.1]),
    ("eod_mask_loss", [False, True]),  # on: --eod-mask-loss . (uneven target counts across ranks)
    ("experts", [0, 4]),  # --experts 4 --experts-per-token 2 (nn/moe.h), dropless
    ("ep", [1, 2, 4]),  # --ep: the experts split over ep consecutive dp ranks (parallel/expert_parallel/)
]
NAMES = [n for n, _ in FACTORS]
# The completion search sets the experts first: --ep needs them, and what refuses them (gpt2; --ep
# with tp, pp or ZeRO-3) is then pruned at once instead of after every factor before them.
SEARCH_ORDER = ["experts", "ep"] + [n for n in NAMES if n not in ("experts", "ep")]
VALUES = dict(FACTORS)
STRENGTH3 = ["dp", "tp", "pp", "cp", "zero", "lifecycle"]


def kv(c):
    return c["kv_heads"] or HEADS


# (factors it reads, predicate that must hold). Checked as soon as its factors are set.
CONSTRAINTS = [
    (("dp", "tp", "pp", "cp"), lambda c: c["dp"] * c["tp"] * c["pp"] * c["cp"] <= 8),
    (("tp",), lambda c: HEADS % c["tp"] == 0),
    (("tp", "kv_heads"), lambda c: kv(c) % c["tp"] == 0),
    (("kv_heads",), lambda c: HEADS % kv(c) == 0),
    (("cp",), lambda c: BLOCK % (2 * c["cp"]) == 0),
    (("tp", "sequence_parallel"), lambda c: not c["sequence_parallel"] or (c["tp"] > 1 and BLOCK % c["tp"] == 0)),
    (("pp", "virtual_stages"), lambda c: c["virtual_stages"] == 1 or c["pp"] >= 2),
    # every stage chunk needs one of the layers+2 items (embedding, blocks, head)
    (("pp", "virtual_stages"), lambda c: c["pp"] * c["virtual_stages"] <= LAYERS + 2),
    # --virtual-stages 2 runs interleaved 1F1B, or the V of zb-v and dualpipev
    (("virtual_stages", "schedule"), lambda c: c["virtual_stages"] == 1 or c["schedule"] in ("1f1b", "zb-v", "dualpipev")),
    (("virtual_stages", "microbatches", "pp", "schedule"),
     lambda c: c["virtual_stages"] == 1 or c["schedule"] != "1f1b" or (c["microbatches"] or c["pp"]) % c["pp"] == 0),
    (("dp", "dp_shard"), lambda c: c["dp_shard"] == 0 or c["dp"] % c["dp_shard"] == 0),
    (("zero", "overlap_param_gather"), lambda c: not c["overlap_param_gather"] or c["zero"] in (1, 2)),
    (("schedule", "overlap_pairs"), lambda c: not c["overlap_pairs"] or c["schedule"] == "dualpipev"),
    (("zero", "zero3_prefetch"), lambda c: c["zero3_prefetch"] == "on" or c["zero"] == 3),
    (("zero", "zero3_reshard_after_forward"), lambda c: c["zero3_reshard_after_forward"] == "on" or c["zero"] == 3),
    (("dp_mode", "bucket_mb"), lambda c: c["dp_mode"] == "bucket" or c["bucket_mb"] == 25),
    # --init-from starts from a folder one process exported: GPT-2 with its own head has none
    (("lifecycle", "arch", "untied"), lambda c: not (c["lifecycle"] == "init" and c["arch"] == "gpt2" and c["untied"])),
    # ... nor with fewer kv heads than heads (GPT2LMHeadModel has one per query head)
    (("lifecycle", "arch", "kv_heads"),
     lambda c: not (c["lifecycle"] == "init" and c["arch"] == "gpt2" and c["kv_heads"] not in (0, HEADS))),
    # --ep splits the experts (4 of them) over ep consecutive dp ranks
    # (two rules, so that the search prunes on dp as soon as it is set)
    (("ep", "dp"), lambda c: c["dp"] % c["ep"] == 0),
    (("ep", "experts"), lambda c: c["ep"] == 1 or c["experts"] > 0),
    # ... of one shard group under --dp-shard (HSDP: the experts shard inside it, torchtitan's layout)
    (("ep", "dp_shard"), lambda c: c["ep"] == 1 or c["dp_shard"] == 0 or c["dp_shard"] % c["ep"] == 0),
]

# (factors it reads, predicate: train_gpt refuses, reason). The prediction only.
REFUSALS = [
    (("dropout", "tp"), lambda c: c["dropout"] > 0 and c["tp"] > 1, "--dropout with --tp"),
    (("dropout", "cp"), lambda c: c["dropout"] > 0 and c["cp"] > 1, "--dropout with --cp"),
    (("zero", "dp_mode"), lambda c: c["zero"] == 3 and c["dp_mode"] == "naive", "--zero 3 with --dp-mode naive"),
    (("dp_shard", "zero"), lambda c: c["dp_shard"] > 0 and c["zero"] != 3, "--dp-shard without --zero 3"),
    (("dp_mode", "zero", "dtype"), lambda c: c["dp_mode"] == "naive" and c["zero"] in (1, 2) or (
        c["dp_mode"] == "naive" and c["dtype"] != "fp32"), "--dp-mode naive has no main_grad buffer (--zero 1/2, bf16, fp16)"),
    (("grad_accum", "pp"), lambda c: c["grad_accum"] > 1 and c["pp"] > 1, "--grad-accum with --pp"),
    (("schedule", "pp"), lambda c: c["schedule"] == "zb-h1" and c["pp"] == 1, "--schedule zb-h1 with --pp 1"),
    (("schedule", "virtual_stages"), lambda c: c["schedule"] in ("zb-v", "dualpipev") and c["virtual_stages"] != 2,
     "--schedule zb-v/dualpipev without --virtual-stages 2"),
    (("schedule", "microbatches", "pp"),
     lambda c: c["schedule"] == "dualpipev" and (c["microbatches"] or c["pp"]) < 2 * c["pp"],
     "--schedule dualpipev with fewer than 2 pp micro-batches"),
    # a pair's F and B on two threads would both talk inside their chunks on one group (train/checks.cpp)
    (("overlap_pairs", "tp", "cp", "ep", "zero", "overlap_param_gather"),
     lambda c: c["overlap_pairs"] and (c["tp"] * c["cp"] * c["ep"] > 1 or c["zero"] == 3 or c["overlap_param_gather"]),
     "--overlap-pairs with --tp/--cp/--ep/--zero 3/--overlap-param-gather"),
    (("lifecycle", "arch", "untied"), lambda c: c["lifecycle"] == "export" and c["arch"] == "gpt2" and c["untied"],
     "--export-hf with --arch gpt2 --untied"),
    (("lifecycle", "arch", "kv_heads"),
     lambda c: c["lifecycle"] == "export" and c["arch"] == "gpt2" and c["kv_heads"] not in (0, HEADS),
     "--export-hf with --arch gpt2 --kv-heads"),
    # the batch split over ranks, accumulation steps or pipeline micro-batches: other masks than one process's
    (("dropout", "dp", "grad_accum", "pp", "microbatches"),
     lambda c: c["dropout"] > 0 and (c["dp"] > 1 or c["grad_accum"] > 1 or (c["pp"] > 1 and (c["microbatches"] or c["pp"]) > 1)),
     "--dropout on a split batch"),
    # a mixture of experts: Llama's blocks only; under every axis, tp or cp together with pp, ZeRO-3
    # and recomputation too (train/checks_moe.cpp; the sweep's experts are dropless, so
    # --capacity-factor's refusal under --sequence-parallel and --cp does not arise)
    (("experts", "arch"), lambda c: c["experts"] > 0 and c["arch"] == "gpt2", "--experts with --arch gpt2"),
    # --ep: each ep rank holds only its experts, equal to one process under tp and pp, alone or together
    # (the grad norm over pp x tp x ep), and ZeRO-1/2/3 (sharded over their expert-dp group; under --dp-shard
    # over its ranks in the shard group), with tp and with pp too: nothing refused (train/checks_moe.cpp)
]


def holds(rules, c):
    """False when a rule whose factors are all set fails on the partial case c."""
    return all(pred(c) for keys, pred in rules if all(k in c for k in keys))


def refused_by(c):
    """The predicted refusal reasons of a complete case."""
    return [why for _, pred, why in REFUSALS if pred(c)]


REFUSAL_AS_RULES = [(keys, (lambda p: lambda c: not p(c))(pred)) for keys, pred, _ in REFUSALS]
# The rules that read each factor, for the search below: setting one factor of a
# case that held every rule can only break the rules that read it.
RULES_READING = {runnable: {n: [(k, p) for k, p in rules if n in k] for n in NAMES}
                 for runnable, rules in ((False, CONSTRAINTS), (True, CONSTRAINTS + REFUSAL_AS_RULES))}


def completable(partial, runnable, order=None):
    """A depth-first search: can `partial` be completed into a valid case (one that runs, if runnable)?"""
    rules = CONSTRAINTS + (REFUSAL_AS_RULES if runnable else [])
    free = [n for n in (order or SEARCH_ORDER) if n not in partial]
    c = dict(partial)
    if not holds(rules, c):
        return None

    def dfs(i):
        if i == len(free):
            return dict(c)
        for v in VALUES[free[i]]:
            c[free[i]] = v
            if holds(RULES_READING[runnable][free[i]], c):
                found = dfs(i + 1)
                if found:
                    return found
            del c[free[i]]
        return None

    return dfs(0)


def tuples_of(full):
    """Every required factor combination: all pairs, and with --full all triples of STRENGTH3."""
    combos = list(itertools.combinations(NAMES, 2))
    if full:
        combos += list(itertools.combinations(STRENGTH3, 3))
    out = []
    for keys in combos:
        for vals in itertools.product(*(VALUES[k] for k in keys)):
            out.append(tuple(zip(keys, vals)))
    return out


def generate(full, seed=52, candidates=8):
    rng = random.Random(seed)
    required, refusal_only = [], set()
    for t in tuples_of(full):
        if completable(dict(t), runnable=True):
            required.append(t)
        elif completable(dict(t), runnable=False):
            required.append(t)
            refusal_only.add(t)  # refused whatever else is chosen: a refused case covers it
        # else: the constraints forbid it
    uncovered = set(required)
    by_keys = {}
    for t in required:
        by_keys.setdefault(tuple(k for k, _ in t), []).append(t)
    combos = list(by_keys)

    def gain(c, newly_set):
        """Uncovered runnable tuples the (partial) case c completes by setting newly_set."""
        g = 0
        for keys in combos:
            if newly_set in keys and all(k in c for k in keys):
                t = tuple((k, c[k]) for k in keys)
                if t in uncovered and t not in refusal_only:
                    g += 1
        return g

    cases = []
    for target in required:
        if target not in uncovered:
            continue
        if target in refusal_only:
            # Refused for the target's reasons only (one cause per refused case), the other
            # values chosen, in factor order, to cover the most other refused-anyway tuples.
            reasons = refused_by(completable(dict(target), runnable=False))
            case = dict(target)
            for name in [n for n in NAMES if n not in case]:
                scored = []
                for v in VALUES[name]:
                    case[name] = v
                    done = completable(case, runnable=False)
                    if done and refused_by(done) == reasons:
                        g = sum(1 for t in uncovered if t in refusal_only and all(case.get(k) == x for k, x in t))
                        scored.append((g, -VALUES[name].index(v), v))
                    del case[name]
                case[name] = max(scored)[2]
        else:
            best, best_gain = None, -1
            for _ in range(candidates):
                c = dict(target)
                rest = [n for n in NAMES if n not in c]
                rng.shuffle(rest)
                for name in rest:
                    scored = []
                    for v in VALUES[name]:
                        c[name] = v
                        if completable(c, runnable=True):
                            scored.append((gain(c, name), rng.random(), v))
                        del c[name]
                    c[name] = max(scored)[2]
                total = sum(1 for t in uncovered if t not in refusal_only and all(c.get(k) == v for k, v in t))
                if total > best_gain:
                    best, best_gain = c, total
            case = best
        cases.append(case)
        refused = bool(refused_by(case))
        for t in list(uncovered):
            if all(case[k] == v for k, v in t) and (not refused or t in refusal_only):
                uncovered.discard(t)
    assert not uncovered
    return cases, len(required), len(refusal_only)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="strength 3 over the parallel sizes x --zero x lifecycle")
    ap.add_argument("--out", help="write the cases here as JSON (default: stdout)")
    a = ap.parse_args()
    cases, n_tuples, n_refusal = generate(a.full)
    doc = {"strength": "3 over " + " x ".join(STRENGTH3) + ", 2 over all" if a.full else "2",
           "model": {"layers": LAYERS, "heads": HEADS, "block": BLOCK},
           "cases": [dict(id=i, flags=c, predicted_refusal=refused_by(c)) for i, c in enumerate(cases)]}
    text = json.dumps(doc, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    n_ref = sum(1 for c in cases if refused_by(c))
    print(f"{len(cases)} cases ({n_ref} predicted refused) cover {n_tuples} tuples "
          f"({n_refusal} of them refused whatever else is set)", file=sys.stdout if a.out else sys.stderr, flush=True)


if __name__ == "__main__":
    main()
