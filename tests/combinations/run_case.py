#!/usr/bin/env python3
"""Runs the combination sweep's cases (generate.py's JSON) and judges each one.

A case either
- is refused before training: non-zero exit, an error naming a flag, no step
  line printed and no step logged (a refusal after step 1 is a defect), or
- trains, and equals one process on the same global batch (same --dtype,
  --recompute and model flags) within the dtype's tolerance: every step's
  loss and grad_norm, and every final param (per tensor ||a - b|| / ||b||;
  the attention key bias as max |a - b| over the model's max |param|, as
  tests/train_gpt_run.h explains), and then, by its lifecycle:
  - resume: stopped at step 3 with --save/--stop-at, resumed with the same
    flags: every loss and grad_norm and every final param bit-exact against
    the straight run; resumed at one process: within tolerance of one process;
  - export: --export-hf's model.safetensors within tolerance of one process's
    export, the same config.json;
  - init: started --init-from a folder one process exported (the model flags
    come from its config.json), compared with one process started from it.

One-process reference runs are cached per distinct flag set. Every run is
`timeout 120` around mpirun with LOOM_COLLECTIVE_TIMEOUT=60: a hang fails.
Python's standard library only.
"""
import argparse
import array
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

EMBD, STEPS, STOP_AT = 32, 6, 3
# Tolerances, relative (see the README): fp32 as tests/train_gpt_run.h (cp's
# ring as tests/test_train_gpt_context_parallel.cpp). bf16 and fp16 round the
# parallel sums' last bits at their own precision, and one process differs
# from itself as much: bf16 --grad-accum 2 against --batch 16 (llama, kv 1,
# untied) moves step 6's grad_norm by 1.9e-2 while the losses keep 5e-5, and
# --dp 4 --cp 2 --grad-accum 2 by 4.5e-2 (the sweep's worst); AdamW turns that
# rounding into params up to 3.7e-2 apart (a bias, measured). That is about
# one AdamW step at this lr, so a stale export is caught by the bit-exact
# export-with-save check below, not by these bounds.
TOL = {"fp32": dict(loss=1e-5, grad_norm=1e-5, params=1e-5),
       "bf16": dict(loss=1e-3, grad_norm=5e-2, params=5e-2),
       "fp16": dict(loss=1e-3, grad_norm=5e-2, params=5e-2)}
# LOW_PRECISION_NOTE: one process in bf16 or fp16 is not the exact answer
# either. Its batch gradient sums 16 sequences at once where a parallel run
# sums parts and adds them in fp32 (main_grad), so the parallel run can be the
# closer of the two to fp32: --dp 2 --tp 2 --cp 2 --zero 2 bf16 put a layer
# norm bias 4.2e-3 (max |a - b|) from one process's bf16 and 3.2e-4 from its
# fp32, where one process's bf16 was 4.6e-3 from its own fp32. A low-precision value past its
# bound therefore passes when it is no further from one process's fp32 run
# (same flags, --dtype fp32) than one process's own run is, within this factor.
# Why 4 and not 1: each rank's weight gradient leaves its bf16 GEMM rounded
# before the fp32 sum over ranks, so up to 8 roundings (dp x cp) meet where one
# process rounds once - about sqrt(8) = 2.8 times the noise where the parts
# cancel, as near-zero biases' do (--dp 2 --cp 4 --zero 3 bf16: 2.7 times, a
# layer norm bias). A wrong reduction (a rank's part lost or counted twice)
# moves a gradient by its own size, 2^8 times bf16's rounding; the fp32 cases
# bound every mechanism at 1e-5.
ROUNDING_FACTOR = 4.0
CP_PARAM_TOL = 3e-5
# cp with --eod-mask-loss: each cp rank's mean is weighted by its own target
# count (parallel/per_token_loss.h), one more rounding per rank and part, which
# AdamW lifts on near-zero gradients as above (--pp 4 --cp 2, Llama with 2 kv
# heads, full recompute, ZeRO-1 afab and ZeRO-3 zb-h1: losses 3.4e-8 and
# 3.6e-8, grad norms 3.8e-6 and 3.9e-6, one c_attn weight 3.13e-5, its exported
# v slice 6.27e-5). A wrong weighting moves the losses by 2-3e-4, which the
# losses' 1e-5 catches (tests/test_train_gpt_context_parallel.cpp's mutation).
CP_MASKED_PARAM_TOL = 1e-4
# Their grad norms, for the same reason: a state whose params are within that
# bound gives a step's grad norm further from one process's than 1e-5.
# --tp 4 --cp 2 --zero 1 --grad-accum 2, GPT-2 untied: step 4's grad norm
# 1.6e-5 off (losses 3.0e-7, params 1.1e-5), and the same 1.6e-5 when one
# process resumes the run's step-3 checkpoint - carried by the state, not
# made by the step's reductions (the parallel step and one process's from the
# same state agree to 3e-7).
# Masked tp cases too: --dp 2 --tp 4 --sequence-parallel --zero 3 --dp-shard 2, GPT-2, fp32: grad norm
# 1.1e-5 off at every run (losses 2.1e-7), the weights' rounding beside the row-parallel partial sums.
CP_MASKED_GRAD_NORM_TOL = 5e-5
# fp32 params when the global batch is summed in 8 parts or more (dp x micro-batches x accumulation):
# AdamW lifts the summation order's rounding on near-zero gradients (train_gpt_run.h) as with cp, e.g.
# --dp 4 --pp 2 --virtual-stages 2 --microbatches 4, Llama with one kv head: losses 3.2e-8, grad norm
# 1.6e-6, and one weight 1.25e-5 from one process's. From 8 parts: --dp 4 --pp 2 (m 2) --dp-mode naive
# --recompute full, Llama with one kv head, untied: one c_proj weight 1.66e-5, under --schedule zb-v and
# 1f1b alike (their saved weights are the same bytes: it is the split's rounding, not a schedule's).
# Under --eod-mask-loss each part's mean is also multiplied by its token weight
# (parallel/per_token_loss.h), one more rounding per part (--dp 2 --pp 4
# --virtual-stages 2, Llama with one kv head, full recompute: losses 4.0e-8,
# grad norm 5.2e-6, one c_proj weight 2.2e-5; unmasked, its grad norm is 2.1e-6 off).
SPLIT_PARAM_TOL, SPLIT_PARTS = 3e-5, 8
# fp32 params under tensor parallelism: a row-parallel layer's product is two
# partial sums over the split input dimension, all-reduced, and AdamW lifts
# that order's rounding on near-zero gradients as it does cp's (--tp 2 --pp 4
# afab, Llama, started --init-from a trained folder, ZeRO-1 and ZeRO-3 alike:
# losses 3.7e-8, grad norm 9.7e-7, one c_proj weight 3.2e-5 from one process's).
TP_PARAM_TOL = 5e-5


class Run:
    def __init__(self, rc, output, log, seconds):
        self.rc, self.output, self.log, self.seconds = rc, output, log, seconds

    def steps(self):
        return [int(e["step"]) for e in self.log]

    def error(self):
        """The first error or watchdog line, else the output's last line."""
        for key in ("error:", "collective watchdog", "error"):
            for line in self.output.splitlines():
                if key in line.lower() and "errorcode" not in line and "MCA parameter" not in line:
                    return line.strip()[:600 if "watchdog" in key else 300]
        lines = [l for l in self.output.splitlines() if l.strip()]
        return lines[-1].strip()[:300] if lines else "(no output)"

    def step_printed(self):
        return bool(self.log) or re.search(r"^step\s+\d+/\d+", self.output, re.M) is not None


class Runner:
    def __init__(self, train_gpt, data, work, mpiexec, model):
        self.train_gpt, self.data, self.work, self.mpiexec = train_gpt, data, Path(work), mpiexec
        self.layers, self.heads, self.block = model["layers"], model["heads"], model["block"]
        self.refs, self.folders = {}, {}
        self.runs = 0

    def common(self):
        return ["--steps", str(STEPS), "--warmup", "2", "--eval-every", "0", "--sample", "0", "--threads", "1",
                "--data", self.data]

    def size(self):
        return ["--layers", str(self.layers), "--heads", str(self.heads), "--embd", str(EMBD),
                "--block", str(self.block)]

    def run(self, world, args, log):
        cmd = ["timeout", "-k", "5", "120"]
        if world > 1:
            cmd += self.mpiexec.split() + ["-np", str(world)]
        cmd += [self.train_gpt] + self.common() + args + ["--log", str(log)]
        env = dict(os.environ, LOOM_COLLECTIVE_TIMEOUT="60")
        t = time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env)
        self.runs += 1
        entries = []
        if Path(log).exists():
            entries = [json.loads(l) for l in Path(log).read_text().splitlines() if l.strip()]
        return Run(p.returncode, p.stdout, entries, time.time() - t)

    # The HF folder an init case starts from: one process, 2 steps, exported (cached per model).
    def init_folder(self, model_args):
        key = tuple(model_args)
        if key not in self.folders:
            d = self.work / f"init{len(self.folders)}"
            d.mkdir(parents=True, exist_ok=True)
            r = self.run(1, self.size() + model_args + ["--batch", "8", "--steps", "2", "--export-hf", str(d / "hf")],
                         d / "log.jsonl")
            self.folders[key] = (d / "hf", r)
        return self.folders[key]

    # One process on the global batch (cached per flag set).
    def reference(self, args, export):
        key = (tuple(args), export)
        if key not in self.refs:
            d = self.work / f"ref{len(self.refs)}"
            d.mkdir(parents=True, exist_ok=True)
            extra = ["--save", str(d / "ck.safetensors")] + (["--export-hf", str(d / "hf")] if export else [])
            self.refs[key] = (d, self.run(1, args + extra, d / "log.jsonl"))
        return self.refs[key]


# safetensors: 8-byte little-endian header length, JSON header, raw little-endian tensors.
def load_safetensors(path):
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], body[a:b])
    return out


def to_floats(dtype, data):
    if dtype == "F32":
        return array.array("f", data)
    if dtype == "BF16":  # the top half of an fp32
        wide = bytearray(2 * len(data))
        wide[2::4], wide[3::4] = data[0::2], data[1::2]
        return array.array("f", bytes(wide))
    if dtype == "F16":
        return array.array("f", [x[0] for x in __import__("struct").iter_unpack("<e", data)])
    if dtype == "F64":
        return array.array("d", data)
    raise ValueError(f"dtype {dtype}")


def pieces(name, values):
    """The c_attn bias as its q, k, v parts (k: the key bias, see the top); every other tensor whole."""
    if not name.endswith("attn.c_attn.bias"):
        return [(name, values, False)]
    kv = (len(values) - EMBD) // 2
    return [(name + " (q)", values[:EMBD], False), (name + " (k)", values[EMBD:EMBD + kv], True),
            (name + " (v)", values[EMBD + kv:], False)]


def compare_weights(got_path, ref_path, tol, exact_path=None):
    """(worst relative difference, its tensor, worst key bias, problems).

    exact_path (bf16, fp16): one process's fp32 run of the same flags. A tensor
    past tol still passes when the case is no further from that fp32 answer
    than one process's own low-precision run is, within ROUNDING_FACTOR: its
    difference is then one process's rounding, not the parallel run's
    (LOW_PRECISION_NOTE above)."""
    got, ref = load_safetensors(got_path), load_safetensors(ref_path)
    exact = load_safetensors(exact_path) if exact_path else None
    if set(got) != set(ref):
        return math.inf, "names differ", 0, [f"tensor names differ: {sorted(set(got) ^ set(ref))[:4]}"]
    parts, scale = [], 0.0
    for name in sorted(ref):
        if got[name][1] != ref[name][1]:
            return math.inf, name, 0, [f"{name}: shape {got[name][1]} vs {ref[name][1]}"]
        a, b = to_floats(got[name][0], got[name][2]), to_floats(ref[name][0], ref[name][2])
        e = to_floats(exact[name][0], exact[name][2]) if exact and name in exact else None
        pe = pieces(name, e) if e is not None else [(None, None, None)] * len(pieces(name, b))
        for (pname, pa, key), (_, pb, _), (_, px, _) in zip(pieces(name, a), pieces(name, b), pe):
            d2 = sum((x - y) * (x - y) for x, y in zip(pa, pb))
            r2 = sum(y * y for y in pb)
            mx = max((abs(x - y) for x, y in zip(pa, pb)), default=0.0)
            m = max((abs(y) for y in pb), default=0.0)
            # (the case's distance to fp32, one process's distance to fp32), as the norm or the max
            to_exact = None
            if px is not None:
                dist = (lambda u: max((abs(x - y) for x, y in zip(u, px)), default=0.0)) if key else \
                       (lambda u: math.sqrt(sum((x - y) * (x - y) for x, y in zip(u, px))))
                to_exact = (dist(pa), dist(pb))
            parts.append((pname, math.sqrt(d2), math.sqrt(r2), mx, key, to_exact))
            scale = max(scale, m)
    worst, worst_name, worst_key, problems = 0.0, "", 0.0, []
    for pname, d, r, mx, key, to_exact in parts:
        rel = mx / scale if key else d / max(r, 1e-30)
        if rel != rel:
            rel = math.inf
        if key:
            worst_key = max(worst_key, rel)
        elif rel > worst:
            worst, worst_name = rel, pname
        if rel > tol and not (to_exact and to_exact[0] <= ROUNDING_FACTOR * to_exact[1]):
            extra = f" (fp32 distance {to_exact[0]:.1e} vs one process's {to_exact[1]:.1e})" if to_exact else ""
            problems.append(f"{pname} {rel:.2e} > {tol:.0e}{extra}")
    return worst, worst_name, worst_key, problems


def same_bytes(a_path, b_path):
    a, b = load_safetensors(a_path), load_safetensors(b_path)
    diff = [n for n in b if n not in a or a[n][2] != b[n][2]]
    return diff + [n for n in a if n not in b]


def compare_logs(got, ref, steps, tol, exact=None):
    """Worst relative loss and grad_norm difference over `steps`, and problems.

    exact (bf16, fp16): one process's fp32 run; a value past tol passes when it
    is no further from fp32's than one process's is, within ROUNDING_FACTOR."""
    g = {int(e["step"]): e for e in got.log}
    r = {int(e["step"]): e for e in ref.log}
    x = {int(e["step"]): e for e in exact.log} if exact else {}
    problems, worst = [], {"loss": 0.0, "grad_norm": 0.0}
    r = {s: e for s, e in r.items() if s in steps}
    if sorted(g) != steps or sorted(r) != steps:
        return worst, [f"logged steps {sorted(g)} (one process: {sorted(r)}), want {steps}"]
    for s in steps:
        for k in ("loss", "grad_norm"):
            a, b = float(g[s][k]), float(r[s][k])
            rel = (0.0 if a == 0 else math.inf) if b == 0 else abs(a - b) / abs(b)
            if rel != rel:
                rel = math.inf
            worst[k] = max(worst[k], rel)
            if rel > tol[k]:
                if s in x and abs(a - float(x[s][k])) <= ROUNDING_FACTOR * abs(b - float(x[s][k])):
                    continue
                problems.append(f"step {s} {k} {a:.7g} vs {b:.7g} ({rel:.1e} > {tol[k]:.0e})")
    return worst, problems[:3]


def case_args(f, model):
    """(world, the case's train_gpt flags, one process's flags, batch per rank, global batch)."""
    world = f["dp"] * f["tp"] * f["pp"] * f["cp"]
    per_step = (f["microbatches"] or f["pp"]) if f["pp"] > 1 else f["grad_accum"]
    batch = max(1, 16 // (f["dp"] * per_step))
    global_batch = f["dp"] * batch * per_step
    par = ["--dp", f["dp"], "--tp", f["tp"], "--pp", f["pp"], "--cp", f["cp"], "--zero", f["zero"]]
    if f.get("dp_shard"):
        par += ["--dp-shard", f["dp_shard"]]
    if f.get("ep", 1) > 1:
        par += ["--ep", f["ep"]]
    if f["sequence_parallel"]:
        par += ["--sequence-parallel"]
    for flag, key, default in [("--dp-mode", "dp_mode", "bucket"), ("--bucket-mb", "bucket_mb", 25),
                               ("--virtual-stages", "virtual_stages", 1), ("--schedule", "schedule", "1f1b"),
                               ("--partition", "partition", "uniform"), ("--grad-accum", "grad_accum", 1),
                               ("--microbatches", "microbatches", 0),
                               ("--zero3-prefetch", "zero3_prefetch", "on"),
                               ("--zero3-reshard-after-forward", "zero3_reshard_after_forward", "on")]:
        if f[key] != default:
            par += [flag, f[key]]
    if f["overlap_param_gather"]:
        par += ["--overlap-param-gather"]
    if f.get("overlap_pairs"):
        par += ["--overlap-pairs"]
    same = ["--dtype", f["dtype"], "--recompute", f["recompute"]]
    same += mask_args(f)  # the reference masks the same targets
    return world, [str(x) for x in par], same, batch, global_batch


def mask_args(f):
    """--eod-mask-loss: every run of the case, its references and fp32 twins included, masks the same targets."""
    return ["--eod-mask-loss", "."] if f.get("eod_mask_loss") else []


def model_args(f):
    m = ["--arch", f["arch"]]
    if f["kv_heads"]:
        m += ["--kv-heads", str(f["kv_heads"])]
    if f["untied"]:
        m += ["--untied"]
    if f["dropout"]:
        m += ["--dropout", str(f["dropout"])]
    if f.get("experts", 0):
        m += ["--experts", str(f["experts"]), "--experts-per-token", "2"]
    return m


def judge(runner, case):
    """(verdict, flags shown, details)."""
    f = case["flags"]
    d = runner.work / f"case{case['id']:03d}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    world, par, same, batch, global_batch = case_args(f, runner)
    life = f["lifecycle"]
    flags = par + ["--batch", str(batch)] + same + model_args(f) + ([] if life == "none" else [f"[{life}]"])
    if life == "init":
        folder, made = runner.init_folder(model_args(f))
        if made.rc != 0:
            return "FAIL", flags, [f"one process could not make the --init-from folder ({' '.join(model_args(f))}): "
                                f"{made.error()}"]
        model = ["--init-from", str(folder)]
    else:
        model = runner.size() + model_args(f)
    tol = dict(TOL[f["dtype"]])
    if f["cp"] > 1 and f["dtype"] == "fp32":
        tol["params"] = CP_MASKED_PARAM_TOL if f.get("eod_mask_loss") else CP_PARAM_TOL
        if f.get("eod_mask_loss"):
            tol["grad_norm"] = CP_MASKED_GRAD_NORM_TOL
    parts = f["dp"] * f["grad_accum"] * ((f["microbatches"] or f["pp"]) if f["pp"] > 1 else 1)
    split = parts >= SPLIT_PARTS
    if split and f["dtype"] == "fp32":
        tol["params"] = SPLIT_PARAM_TOL
    if f["tp"] > 1 and f["dtype"] == "fp32":
        tol["params"] = max(tol["params"], TP_PARAM_TOL)
        if f.get("eod_mask_loss"):  # the token weights' rounding meets tp's partial sums, as cp's
            tol["grad_norm"] = CP_MASKED_GRAD_NORM_TOL
    args = model + same + par + ["--batch", str(batch)]
    export = life == "export"
    # An export case saves no checkpoint: its final params are the export's (issue 52: --export-hf without
    # --save read the params before the last step's param sync).
    straight = runner.run(world, args + (["--export-hf", str(d / "hf")] if export else
                                         ["--save", str(d / "ck.safetensors")]), d / "straight.jsonl")
    predicted = case["predicted_refusal"]
    notes = []
    if straight.rc != 0:
        if straight.rc in (124, 137):
            return "FAIL", flags, [f"hung: timeout after {straight.seconds:.0f} s; {straight.error()}"]
        err = straight.error()
        if straight.step_printed():
            return "FAIL", flags, [f"failed after training started (steps {straight.steps()} logged): {err}"]
        if not re.search(r"--[a-z][a-z0-9-]+", err):
            return "FAIL", flags, [f"refused without naming a flag: {err}"]
        return "REFUSED", flags, [err + ("" if predicted else " (not predicted)")]
    if predicted:
        notes.append(f"ran though predicted refused ({'; '.join(predicted)})")
    ref_args = model + same + ["--batch", str(global_batch)]
    if f["dtype"] == "fp16":
        # fp16's overflow decisions: each rank backpropagates the loss scale / (dp x cp)
        # (MixedPrecisionOptions::grad_mean_ranks), so its fp16 weight gradients are
        # partial sums like one micro-batch's; one process accumulating as many parts
        # overflows when they do, one process summing the whole batch in fp16 at 2^16 earlier.
        split = min(global_batch, f["cp"] * parts)  # dp x cp x micro-batches x accumulation
        while global_batch % split:
            split -= 1
        if split > 1:
            ref_args = model + same + ["--batch", str(global_batch // split), "--grad-accum", str(split)]
    ref_dir, ref = runner.reference(ref_args, export)
    if ref.rc != 0:
        return "FAIL", flags, [f"the case ran but one process failed (--batch {global_batch}): {ref.error()}"] + notes
    problems = []

    def fp32_twin():
        """bf16/fp16: one process's fp32 run of the same flags (dir, Run), made when a bound is first passed."""
        if f["dtype"] == "fp32":
            return None, None
        d32, r32 = runner.reference(model + ["--dtype", "fp32", "--recompute", f["recompute"]] + mask_args(f) +
                                    ["--batch", str(global_batch)], export)
        return (d32, r32) if r32.rc == 0 else (None, None)

    rounding = []  # the problems that are bounds passed (not a failed run, not a lost bit)

    def logs(got, steps):
        w, p = compare_logs(got, ref, steps, tol)
        if p and f["dtype"] != "fp32":
            p = compare_logs(got, ref, steps, tol, fp32_twin()[1])[1]
        rounding.extend(p)
        return w, p

    def weights(got_path, ref_path, name):
        r = compare_weights(got_path, ref_path, tol["params"])
        if r[3] and fp32_twin()[0] is not None:
            r = r[:3] + (compare_weights(got_path, ref_path, tol["params"], fp32_twin()[0] / name)[3],)
        rounding.extend(r[3])
        return r

    def mechanism_in_fp32():
        """A bf16/fp16 case past its bounds: the same flags in fp32 against one process's fp32, at fp32's bounds."""
        d32 = d / "fp32"
        d32.mkdir(exist_ok=True)
        ref32_dir, ref32 = fp32_twin()
        if ref32 is None:
            return ["one process's fp32 run failed"]
        run = runner.run(world, model + ["--dtype", "fp32", "--recompute", f["recompute"]] + mask_args(f) + par +
                         ["--batch", str(batch), "--save", str(d32 / "ck.safetensors")], d32 / "log.jsonl")
        if run.rc != 0:
            return [f"the same flags in fp32 failed: {run.error()}"]
        tol32 = dict(TOL["fp32"])
        if f["cp"] > 1 or split:
            tol32["params"] = max(CP_PARAM_TOL, SPLIT_PARAM_TOL)
        if f["cp"] > 1 and f.get("eod_mask_loss"):
            tol32["params"], tol32["grad_norm"] = CP_MASKED_PARAM_TOL, CP_MASKED_GRAD_NORM_TOL
        if f["tp"] > 1:
            tol32["params"] = max(tol32["params"], TP_PARAM_TOL)
        w, p = compare_logs(run, ref32, list(range(STEPS)), tol32)
        wp, wname, _, q = compare_weights(d32 / "ck.safetensors", ref32_dir / "ck.safetensors", tol32["params"])
        notes.append(f"the same flags in fp32: loss {w['loss']:.1e} params {wp:.1e}")
        return [f"in fp32: {x}" for x in p + q[:3]]

    worst, p = logs(straight, list(range(STEPS)))
    problems += p
    notes.append(f"loss {worst['loss']:.1e} grad_norm {worst['grad_norm']:.1e}")
    if export:  # the same flags again, with --save: its checkpoint, and an export that must be the same to the bit
        saved = runner.run(world, args + ["--export-hf", str(d / "hf_saved"), "--save", str(d / "ck.safetensors")],
                           d / "saved.jsonl")
        if saved.rc != 0:
            problems.append(f"export with --save failed: {saved.error()}")
        elif (d / "hf" / "model.safetensors").exists():
            diff = same_bytes(d / "hf" / "model.safetensors", d / "hf_saved" / "model.safetensors")
            if diff:
                wd, wdn, _, _ = compare_weights(d / "hf" / "model.safetensors", d / "hf_saved" / "model.safetensors", 0)
                problems.append(f"export without --save differs from the same run's export with --save: {wd:.1e} "
                                f"({wdn}; {len(diff)} tensors)")
    if (d / "ck.safetensors").exists():
        wp, wname, wkey, p = weights(d / "ck.safetensors", ref_dir / "ck.safetensors", "ck.safetensors")
        problems += [f"final params: {x}" for x in p[:3]]
        notes.append(f"params {wp:.1e} ({wname}) key bias {wkey:.1e}")
    if life == "resume":
        stop = runner.run(world, args + ["--stop-at", str(STOP_AT), "--save", str(d / "stop.safetensors")],
                          d / "resumed.jsonl")
        if stop.rc != 0:
            problems.append(f"--stop-at {STOP_AT} run failed: {stop.error()}")
        else:
            res = runner.run(world, args + ["--resume", str(d / "stop.safetensors"),
                                            "--save", str(d / "resumed.safetensors")], d / "resumed.jsonl")
            if res.rc != 0:
                problems.append(f"--resume failed: {res.error()}")
            else:
                exact = [(e["step"], e["loss"], e["grad_norm"]) for e in res.log]
                want = [(e["step"], e["loss"], e["grad_norm"]) for e in straight.log]
                if exact != want:
                    bad = [(a, b) for a, b in zip(exact, want) if a != b][:2] or [(len(exact), len(want))]
                    problems.append(f"resume not bit-exact: (step, loss, grad_norm) {bad[0][0]} vs straight {bad[0][1]}")
                diff = same_bytes(d / "resumed.safetensors", d / "ck.safetensors")
                if diff:
                    problems.append(f"resume: final params not bit-exact: {diff[:3]}")
                if exact == want and not diff:
                    notes.append("resume bit-exact")
            one = runner.run(1, ref_args + ["--resume", str(d / "stop.safetensors"),
                                            "--save", str(d / "one.safetensors")], d / "one.jsonl")
            if one.rc != 0:
                problems.append(f"resumed at one process failed: {one.error()}")
            else:
                w1, p = logs(one, list(range(STOP_AT, STEPS)))
                problems += [f"resumed at one process: {x}" for x in p]
                wp1, wname1, _, p = weights(d / "one.safetensors", ref_dir / "ck.safetensors", "ck.safetensors")
                problems += [f"resumed at one process: final params: {x}" for x in p[:3]]
                notes.append(f"at one process loss {w1['loss']:.1e} params {wp1:.1e}")
    if export:
        hf, ref_hf = d / "hf" / "model.safetensors", ref_dir / "hf" / "model.safetensors"
        if not hf.exists() or not ref_hf.exists():
            problems.append(f"export: {'no ' + str(hf) if not hf.exists() else 'one process exported nothing'}")
        else:
            we, wename, wkey, p = weights(hf, ref_hf, "hf/model.safetensors")
            problems += [f"export: {x}" for x in p[:3]]
            if json.loads((d / "hf" / "config.json").read_text()) != json.loads(
                    (ref_dir / "hf" / "config.json").read_text()):
                problems.append("export: config.json differs from one process's")
            notes.append(f"export params {we:.1e} ({wename}) key bias {wkey:.1e}")
    # bf16/fp16 rounding past every bound, nothing else wrong: the mechanism is
    # judged in fp32 instead (LOW_PRECISION_NOTE), where a wrong reduction shows at 1e-5.
    if problems and f["dtype"] != "fp32" and all(any(r in x for r in rounding) for x in problems):
        p32 = mechanism_in_fp32()
        if not p32:
            return "PASS", flags, [f"{f['dtype']} rounding past its bounds ({problems[0]})"] + notes
        problems += p32
    return ("FAIL" if problems else "PASS"), flags, problems + notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", required=True, help="generate.py's JSON")
    ap.add_argument("--work", required=True, help="a directory for the runs")
    ap.add_argument("--train-gpt", default=os.environ.get("LOOM_TRAIN_GPT", "build/examples/train_gpt"))
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "data" / "tiny_corpus.txt"))
    ap.add_argument("--mpiexec", default=os.environ.get("LOOM_MPIEXEC", "mpirun") + " --allow-run-as-root --oversubscribe")
    ap.add_argument("--only", help="comma-separated case ids")
    a = ap.parse_args()
    doc = json.loads(Path(a.cases).read_text())
    cases = doc["cases"]
    if a.only:
        keep = {int(x) for x in a.only.split(",")}
        cases = [c for c in cases if c["id"] in keep]
    runner = Runner(str(Path(a.train_gpt).resolve()), a.data, a.work, a.mpiexec, doc["model"])
    t0 = time.time()
    counts = {"PASS": 0, "REFUSED": 0, "FAIL": 0}
    for case in cases:
        t = time.time()
        verdict, flags, details = judge(runner, case)
        counts[verdict] += 1
        world = case["flags"]["dp"] * case["flags"]["tp"] * case["flags"]["pp"] * case["flags"]["cp"]
        print(f"case {case['id']:3d} {verdict:7s} np {world} {' '.join(flags)} | {'; '.join(details)} "
              f"[{time.time() - t:.1f} s]", flush=True)
    passed = counts["PASS"] + counts["REFUSED"]
    print(f"{passed} passed, {counts['FAIL']} failed")
    print(f"refused before training: {counts['REFUSED']} (counted as passed); {runner.runs} train_gpt runs in "
          f"{time.time() - t0:.0f} s")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
