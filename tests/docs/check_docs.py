#!/usr/bin/python3
"""Keeps docs/ honest: every anchor a chapter gives must still point somewhere.

  /usr/bin/python3 tests/docs/check_docs.py REPO [TRAIN_GPT]

Checks, over docs/*.md (CTest: docs_check, label docs):
  paths     every `path/with/a/slash.ext` in backticks, and every relative
            Markdown link, names a file or folder of the repo (build/ outputs
            and absolute paths are not repo files and are skipped)
  symbols   in `path/to/file.h` (`Symbol`, `Class::method`), each symbol's
            every ::-part occurs as a whole word in that file
  flags     every --flag after train_gpt on a command line of a ```sh block is
            one of TRAIN_GPT --help's (or, without TRAIN_GPT, one that
            train/args.cpp or train/args_moe.cpp declares)
  shape     each chapter has a "Read:" line, a ```sh block and an Exercise
            section; docs/README.md and README.md link every chapter
  tool      docs/trace_summary.py, run on a small made-up trace, gives the
            numbers worked out by hand (and --ring its ring steps and hops)
  outputs   (with TRAIN_GPT) every ```sh check block is run again, in a fresh
            directory where build/ is TRAIN_GPT's build and docs/ the repo's;
            each ```output block after it quotes lines of what it printed,
            and every line must still be printed: words as quoted, integers
            (counts, bytes, steps) exactly, and numbers with a point or an
            exponent (losses, grad norms, MiB) within REL_TOL (1e-4) or one
            unit of the last printed digit, so that another CPU's rounding
            passes (```output rel=1e-3 states a looser one for a block;
            ```output if=TEXT is checked only where the run printed TEXT: a
            block quoted for one kind of CPU). A timing is marked ~ before it
            (~26541 tok/s, ETA ~0m04s) and matches any word there; "..."
            stands for any text.
  tables    a Markdown table reports measurements when a column's header says
            "measured" (| formula | measured |, | grid | bytes measured |).
            Every exact number in such a column's cells must be printed by the
            chapter: it must occur in one of the chapter's ```output blocks,
            which "outputs" compares with a fresh run (4.6954 there for 4.6954
            here, 418944 or 418,944 for 418,944). Two exceptions, both said in
            the chapter: a timing or any quantity that varies from run to run
            is marked ~ (~95 ms, ~0.421, ~0.2-2.1 s), and a table a laptop
            cannot rerun (it needs a GPU, root, several hosts) has the comment
            <!-- not rerun: WHY --> on a line of its own right above it.
            Formula columns are arithmetic, not measurements: not compared.
            Numbers inside words (float32, h1, 6627e8d5, 50th), references
            (chapter 2) and dates (2026-11-27) are not quantities. A ratio of
            two measured numbers is arithmetic: write it in the formula column.
  arithmetic  outside code blocks, every plain sum or product written out
            with its result (2 + 4 + 12/2 = 12, 111 × 64 = 7,104, 1/9 = 0.111)
            comes out right to the result's printed digits; a result with a
            unit after it (4 × 109,248 = 427 KiB) is not checked.
Exits 1 listing every problem (file:line: what), 0 when there is none.
"""
import os
import re
import subprocess
import sys

PATH_RE = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.*<>-]+)+/?)`")
ANCHOR_RE = re.compile(r"`([A-Za-z0-9_./-]+\.[A-Za-z0-9]+)`\s*\(((?:\s*`[^`]+`\s*,?)+)\)")
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# An exact quantity in a table cell or an output block: 418,944  4.6954  1.544e-02  83 (of 83%); not the digits
# inside a word (float32, h1, 6627e8d5, 50th). A ~ token (~95, ~0.2-2.1) is a timing and is skipped.
TABLE_NUMBER_RE = re.compile(r"~\S+|(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")
NOT_A_QUANTITY_RE = re.compile(r"\b(?:chapters?|issues?) \d+|\b\d{4}-\d{2}-\d{2}\b")  # a reference, a date
# "a op b op c = d" with plain numbers and + - − × · * / ( ): the left side is evaluated, d compared to its digits
ARITH_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
ARITH_TERM = r"(?:\(\s*)*" + ARITH_NUM + r"(?:\s*\))*"
ARITH_RE = re.compile(r"(?<![\w.,²³^/])(" + ARITH_TERM + r"(?:\s*[+\-−×·*/]\s*" + ARITH_TERM + r")+)\s*=\s*("
                      + ARITH_NUM + r")(?![\w.%²³]|\s*[A-Za-z%])")
NOT_RERUN_RE = re.compile(r"^\s*<!--\s*not rerun:\s*(.*?)\s*-->\s*$")
NUMBER_RE = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:e[-+]?\d+)?")
# How close a rerun's number must be to the one a chapter quotes ("outputs"). The chapters' numbers
# come from one CPU; another one's kernels round differently (AVX2 or AVX-512 GEMMs and row sums,
# fused multiply-adds or not), so a loss printed as 4.4927120 on one is 4.4927151 on another. A
# number with a point or an exponent (a loss, a grad norm, MiB, a ratio) matches within REL_TOL of
# its value, or one unit of its last printed digit where that is larger (4.4927 for 4.4928); an
# integer (a count, bytes, a step, a token) matches exactly. An ```output block may state a looser
# tolerance for numbers that drift further (```output rel=1e-3: a long run, where rounding compounds).
REL_TOL = 1e-4
# how many anchors were checked, for the summary line
CHECKED = {"paths": 0, "symbols": 0, "flags": 0, "commands": 0, "quoted lines": 0, "table numbers": 0, "sums": 0,
           "blocks for another CPU": 0}


def repo_file(repo, path):
    return os.path.exists(os.path.join(repo, path.rstrip("/")))


def skip_path(path):
    # build outputs, files a command writes, globs and placeholders are not repo files
    return path.startswith(("build/", "/", "out/", "http")) or any(c in path for c in "*<>")


def known_flags(repo, train_gpt):
    if train_gpt:
        out = subprocess.run([train_gpt, "--help"], capture_output=True, text=True, timeout=60).stdout
        flags = set(FLAG_RE.findall(out))
        if "--steps" in flags:
            return flags
    flags = set()
    for name in ("args.cpp", "args_moe.cpp"):
        with open(os.path.join(repo, "train", name)) as f:
            flags |= set(re.findall(r'"(--[a-z][a-z0-9-]*)"', f.read()))
    return flags


def command_lines(text):
    """(line number, command) for each line of a ```sh block, continuations joined."""
    out, in_sh, pending, start = [], False, "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_sh = not in_sh and line.strip() in ("```sh", "```bash", "```sh check")
            continue
        if not in_sh:
            continue
        if not pending:
            start = n
        pending += line.rstrip("\\") + " "
        if not line.endswith("\\"):
            out.append((start, pending.split(" #")[0]))  # a trailing comment is not part of it
            pending = ""
    return out


def check_chapter(repo, path, text, flags, problems):
    name = os.path.relpath(path, repo)
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        for p in PATH_RE.findall(line):
            if skip_path(p):
                continue
            CHECKED["paths"] += 1
            if not repo_file(repo, p):
                problems.append(f"{name}:{n}: `{p}` is not a file of the repo")
        for link in LINK_RE.findall(line):
            if "://" in link or link.startswith("mailto:"):
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(path), link))
            if not os.path.exists(target):
                problems.append(f"{name}:{n}: link ({link}) leads nowhere")
        for p, syms in ANCHOR_RE.findall(line):
            full = os.path.join(repo, p)
            if skip_path(p) or not os.path.isfile(full):
                continue  # a missing file is reported above
            with open(full, errors="replace") as f:
                body = f.read()
            for sym in re.findall(r"`([^`]+)`", syms):
                CHECKED["symbols"] += 1
                parts = [s for s in re.split(r"::|\.", sym.replace("()", "")) if s]
                missing = [s for s in parts if not re.search(r"(?<![\w])" + re.escape(s) + r"(?![\w])", body)]
                if missing:
                    problems.append(f"{name}:{n}: `{sym}` does not occur in {p}")
    for n, cmd in command_lines(text):
        if "train_gpt" not in cmd:
            continue
        for flag in FLAG_RE.findall(cmd.split("train_gpt", 1)[1]):
            CHECKED["flags"] += 1
            if flag not in flags:
                problems.append(f"{name}:{n}: train_gpt has no flag {flag}")
    if not os.path.basename(path) == "README.md":
        if not any(line.startswith("Read:") for line in lines):
            problems.append(f"{name}: no 'Read:' line (the files to read, with their symbols)")
        if not command_lines(text):
            problems.append(f"{name}: no ```sh block (the command to run)")
        if not re.search(r"^#+ .*Exercise", text, re.M):
            problems.append(f"{name}: no Exercise section")


def check_trace_summary(repo, problems):
    sys.path.insert(0, os.path.join(repo, "docs"))
    import trace_summary  # noqa: E402

    def x(name, ts, dur, tid):
        return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid}

    # One step: backward [0, 100) with a wait [80, 100); two 8 KiB all-reduces,
    # [50, 90) (30 us of it while backward computed) and [90, 110) (none).
    # ZeRO's per-bucket step: bucket 0 inside the wait, bucket 1 after it.
    events = [x("forward", -50, 50, 0), x("backward", 0, 100, 0), x("wait for gradient all-reduce", 80, 20, 0),
              x("step bucket 0", 85, 5, 0), x("step bucket 1", 111, 2, 0), x("optimizer step", 110, 10, 0),
              x("all_reduce(avg, float32) dp (size 2) #1 (8 KiB)", 50, 40, 1),
              x("all_reduce(avg, float32) dp (size 2) #2 (8 KiB)", 90, 20, 1)]
    s = trace_summary.summarise(events)[0]
    want = {"steps": 1, "dp_comm_ms": 0.06, "dp_comm_hidden": 0.5, "wait_ms_per_step": 0.02}
    for k, v in want.items():
        if abs(s[k] - v) > 1e-9:
            problems.append(f"docs/trace_summary.py: {k} = {s[k]} on the made-up trace, by hand {v}")
    if s["per_step"].get("all_reduce(avg, float32) dp (size 2)") != (2.0, 16.0):
        problems.append(f"docs/trace_summary.py: per_step = {s['per_step']}, by hand 2 all-reduces, 16 KiB")
    if s["step_buckets_in_wait"] != (1, 2):
        problems.append(f"docs/trace_summary.py: step buckets in a wait {s['step_buckets_in_wait']}, by hand (1, 2)")
    if s["gather_overlaps_forward"] is not None:
        problems.append("docs/trace_summary.py: an all-gather share without any all-gather")
    # A pipeline stage with ZeRO: two micro-batches' transfers of 64 KiB each aggregate to one line;
    # the all-gather [35, 75) overlaps the forward F0 [30, 60) by 25 of its 40 us.
    events = [x("F0", 30, 30, 0), x("B0", 60, 20, 0), x("optimizer step", 100, 10, 0),
              x("all_gather(float32) dp (size 2) #1 (8 KiB)", 35, 40, 1),
              x("send_forward mb0 (64 KiB)", 60, 5, 1), x("send_forward mb1 (64 KiB)", 70, 5, 1)]
    s = trace_summary.summarise(events)[0]
    if s["per_step"].get("send_forward") != (2.0, 128.0):
        problems.append(f"docs/trace_summary.py: per_step = {s['per_step']}, by hand 2 send_forward, 128 KiB")
    if s["gather_overlaps_forward"] is None or abs(s["gather_overlaps_forward"] - 0.625) > 1e-9:
        problems.append(f"docs/trace_summary.py: all-gather overlap {s['gather_overlaps_forward']}, by hand 0.625")


def check_ring_summary(repo, problems):
    """docs/trace_summary.py --ring on a made-up cp 2 trace: which hop travels beside which step, by hand."""
    sys.path.insert(0, os.path.join(repo, "docs"))
    import trace_summary  # noqa: E402

    def x(name, ts, dur, tid):
        return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid}

    # Step 2 of a cp 2 run (after the optimizer step at [0, 10)): forward s0 [20, 60) with its K/V hop
    # [15, 65) beside it (40 of 50 us overlapped), s1 [66, 80); backward s0 [100, 140) beside a K/V hop
    # [98, 148) (not beside the earlier layer's dK/dV hop home at [95, 97)), s1 [150, 190) beside the
    # dK/dV hop posted after s0, [149, 169) (19 of its 20 us overlapped), then the dK/dV hop home
    # [191, 195). A second forward ring at [300, ...) is not step 2's first.
    kv, dkv = "ring {} hop K/V 65536 B (64 KiB)", "ring B hop dK/dV 65536 B (64 KiB)"
    events = [x("optimizer step", 0, 10, 0),
              x(kv.format("F"), 15, 50, 1), x("ring F s0: K/V of rank 0 (chunks 0 3): q0k0* q3k0 q3k3*", 20, 40, 0),
              x("ring F s1: K/V of rank 1 (chunks 1 2): q3k1 q3k2", 66, 14, 0),
              x(dkv, 95, 2, 1), x(kv.format("B"), 98, 50, 1), x("ring B s0: K/V of rank 0 (chunks 0 3): q0k0* q3k0 q3k3*", 100, 40, 0),
              x(dkv, 149, 20, 1), x("ring B s1: K/V of rank 1 (chunks 1 2): q3k1 q3k2", 150, 40, 0),
              x(dkv, 191, 4, 1), x(kv.format("F"), 295, 50, 1),
              x("ring F s0: K/V of rank 0 (chunks 0 3): q0k0* q3k0 q3k3*", 300, 40, 0)]
    r = trace_summary.ring_steps(events)[0]
    want_f = [(0, 0, ["q0k0*", "q3k0", "q3k3*"], [("K/V", 65536, 0.05, 0.8)]), (1, 1, ["q3k1", "q3k2"], [])]
    want_b = [(0, 0, ["q0k0*", "q3k0", "q3k3*"], [("K/V", 65536, 0.05, 0.8)]),
              (1, 1, ["q3k1", "q3k2"], [("dK/dV", 65536, 0.02, 0.95)])]
    for pass_, want in (("F", want_f), ("B", want_b)):
        got = [(st["s"], st["src"], st["blocks"], [(w, n, round(ms, 9), round(sh, 9)) for w, n, ms, sh in st["hops"]])
               for st in r[pass_]["steps"]]
        if got != want:
            problems.append(f"docs/trace_summary.py --ring: {pass_} ring {got} on the made-up trace, by hand {want}")
    if r["F"]["after"] != [] or [(w, n) for w, n, _ in r["B"]["after"]] != [("dK/dV", 65536)]:
        problems.append(f"docs/trace_summary.py --ring: after the last step {r['F']['after']}, {r['B']['after']}; "
                        "by hand nothing forward, the dK/dV hop home backward")

def check_step_traffic(repo, problems):
    """docs/trace_summary.py's step_traffic (bytes per step, exposed communication) on a made-up step."""
    sys.path.insert(0, os.path.join(repo, "docs"))
    import trace_summary  # noqa: E402

    def x(name, ts, dur, tid, nbytes=None):
        e = {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid}
        return dict(e, args={"bytes": nbytes}) if nbytes is not None else e

    # One step between the optimizer steps at 0 and 200, dp 4. Compute: [0, 5) and [10, 150)
    # less the wait [40, 60). Communication [30, 70), [140, 170), [180, 190): 80 us, of which
    # [40, 60), [150, 170) and [180, 190) beside no compute: 50 us exposed. Bytes sent per rank:
    # 4000 x 3/4 + 8000 x 3/4 + 2 x 400 x 3/4 = 9600 (the float64 loss left out).
    events = [x("optimizer step", 0, 5, 0), x("forward", 10, 50, 0), x("wait for param all-gather, unit 1", 40, 20, 0),
              x("backward", 60, 90, 0), x("optimizer step", 200, 5, 0),
              x("all_gather(float32) dp (size 4) #1 (3 KiB)", 30, 40, 1, 4000),
              x("reduce_scatter(avg, float32) dp (size 4) #2 (7 KiB)", 140, 30, 1, 8000),
              x("all_reduce(avg, float64) dp (size 4) #3 (0 KiB)", 175, 5, 1, 8),
              x("all_reduce(avg, float32) dp (size 4) #4 (0 KiB)", 180, 10, 1, 400)]
    t = trace_summary.step_traffic(events)[0]
    want = {"steps": 1, "sent_bytes": 9600, "comm_ms": 0.08, "exposed_ms": 0.05, "exposed_share": 0.625,
            "waited_ms": 0.02}
    for k, v in want.items():
        if abs(t[k] - v) > 1e-9:
            problems.append(f"docs/trace_summary.py: step_traffic {k} = {t[k]} on the made-up trace, by hand {v}")


def check_tolerance(problems):
    """The outputs check's tolerance on made-up lines: what another CPU prints passes, a real change fails."""
    cases = [  # (quoted, printed, rel_tol, should match)
        ("step 4/20 | loss 4.4927 | ~4975 tok/s", "step     4/20 | loss 4.4928 | 123 tok/s", REL_TOL, True),
        ("step 4/20 | loss 4.4927 | ~4975 tok/s", "step     4/20 | loss 4.4937 | 123 tok/s", REL_TOL, False),
        ("step 4/20 | loss 4.4927", "step     5/20 | loss 4.4927", REL_TOL, False),  # integers exactly
        ('"loss": 4.4927120208740234, ..., "grad_norm": 2.87884914', '"loss": 4.4927151208740234, "lr": 1, '
         '"grad_norm": 2.87884918', REL_TOL, True),
        ("bytes 418,944", "bytes 418,945", REL_TOL, False),
        ("0  53568 | ... | 3.71 / 3.71 | ...", "0  53568 | 0.20 / 0.20 | 3.71 / 3.71 | 1.23", REL_TOL, True),
        ("0  53568 | ... | 3.71 / 3.71 | ...", "0  53568 | 0.20 / 0.20 | 3.75 / 3.71 | 1.23", REL_TOL, False),
        ("loss 3.3620", "loss 3.3644", REL_TOL, False),
        ("loss 3.3620", "loss 3.3644", 2e-3, True),
        ("lr 1.50e-03", "lr 1.51e-03", REL_TOL, True),  # one unit of the last printed digit
        ("lr 1.50e-03", "lr 1.52e-03", REL_TOL, False),
    ]
    for quoted, printed, rel, want in cases:
        if quoted_line_matcher(quoted, rel)(printed) != want:
            problems.append(f"tests/docs/check_docs.py: '{quoted}' {'should' if want else 'should not'} match "
                            f"'{printed}' at rel {rel}")
    if output_block_options("output rel=2e-3 if=bf16 GEMMs: native") != (2e-3, "bf16 GEMMs: native"):
        problems.append("tests/docs/check_docs.py: ```output rel=2e-3 if=... misread")


def fenced_blocks(text):
    """(line number of the fence, info string, [lines]) for each fenced block."""
    out, info, body, start = [], None, [], 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if info is None and stripped.startswith("```"):
            info, body, start = stripped[3:].strip(), [], n
        elif info is not None and stripped == "```":
            out.append((start, info, body))
            info = None
        elif info is not None:
            body.append(line)
    return out


def quoted_line_matcher(quoted, rel_tol=REL_TOL):
    """A quoted output line as a test of a printed line: '...' any text, any spacing, ~number any number,
    an integer exactly, and a number with a point or an exponent close to the quoted one (close_enough).

    The pieces between the '...'s are regexes, each decimal a capture group of any number written the same
    way; a printed line matches when the pieces match in order and every captured number is close enough.
    Every place each piece matches is tried (a '...' may skip a number that would be too far off)."""
    pieces = []  # (regex, quoted decimals in it), one per piece between '...'s
    for text in quoted.strip().split("..."):
        parts, pos, want = [], 0, []
        for m in re.finditer(r"~\S+|" + NUMBER_RE.pattern, text):
            parts.append(re.escape(text[pos:m.start()]))
            tok = m.group(0)
            if tok.startswith("~"):
                parts.append(r"\S+")
            elif not re.search(r"[.e]", tok):  # an integer: exactly
                parts.append(r"(?<![\d.])" + re.escape(tok) + r"(?![\d])")
            else:
                point = r"\.\d*" if "." in tok else ""
                exponent = r"e[-+]?\d+" if "e" in tok else ""
                parts.append(r"(?<![\d.])([-+]?\d[\d,]*" + point + exponent + r")(?![\d])")
                want.append(tok)
            pos = m.end()
        parts.append(re.escape(text[pos:]))
        pieces.append((re.compile(re.sub(r"(\\ )+", r"\\s+", "".join(parts))), want))

    def match_from(line, k, start):
        rx, want = pieces[k]
        for i in range(start, len(line) + 1):
            m = rx.match(line, i)
            if m and all(close_enough(q, g, rel_tol) for q, g in zip(want, m.groups())) and (
                    k + 1 == len(pieces) or match_from(line, k + 1, m.end())):
                return True
        return False
    return lambda line: match_from(line, 0, 0)


def output_block_options(info):
    """'output rel=1e-3 if=bf16 GEMMs: native' -> (1e-3, 'bf16 GEMMs: native'); (REL_TOL, None) by default.
    rel= loosens the tolerance for the block's numbers; if= checks the block only when the rerun printed
    that text (a line that differs by CPU: the chapter quotes one block for each kind of CPU)."""
    rest = info.split(None, 1)[1] if " " in info else ""
    only_if = None
    if "if=" in rest:
        rest, only_if = rest.split("if=", 1)
        only_if = only_if.strip()
    m = re.search(r"\brel=([0-9.e+-]+)", rest)
    return (float(m.group(1)) if m else REL_TOL), only_if


def close_enough(quoted, got, rel_tol=REL_TOL):
    """Whether a rerun's number `got` matches the chapter's `quoted` one (see REL_TOL)."""
    if quoted == got:
        return True
    q, g = quoted.replace(",", ""), got.replace(",", "")
    if not re.search(r"[.e]", q):
        return False  # an integer: a count, bytes, a step, exactly
    try:
        qv, gv = float(q), float(g)
    except ValueError:
        return False
    mantissa = q.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    unit = 10.0 ** (-decimals) * (10.0 ** int(q.split("e")[1]) if "e" in q else 1.0)  # one in the last digit
    return abs(gv - qv) <= max(rel_tol * abs(qv), unit) * (1 + 1e-9)


def run_commands(commands, build, repo, workdir):
    """Runs one ```sh check block's commands in workdir; their stdout and stderr, concatenated."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", LC_ALL="C")
    out = ""
    for cmd in commands:
        r = subprocess.run(cmd, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=240)
        out += r.stdout + r.stderr
        if r.returncode != 0 and "teach-break found-inf-wrong-group" not in cmd:
            out += f"\n(exit status {r.returncode})\n"
    return out


def exact_numbers(text):
    """The exact quantities of a text, commas dropped ("418,944" -> "418944"); ~ timings left out."""
    text = NOT_A_QUANTITY_RE.sub(" ", text)
    return [m.group(0).replace(",", "") for m in TABLE_NUMBER_RE.finditer(text) if not m.group(0).startswith("~")]


def table_cells(line):
    """The cells of a Markdown table row: '| a | b \\| c |' -> ['a', 'b \\| c']."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def check_tables(repo, path, text, problems):
    """Every exact number in a "measured" column must be printed by one of the chapter's ```output blocks."""
    name = os.path.relpath(path, repo)
    printed = set()
    for _, info, body in fenced_blocks(text):
        if info.split()[:1] == ["output"]:
            printed.update(exact_numbers("\n".join(body)))
    lines = text.splitlines()
    in_fence, n = False, 0
    while n < len(lines):
        line = lines[n]
        if line.strip().startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.lstrip().startswith("|"):
            n += 1
            continue
        start, header = n, table_cells(line)
        rows = []
        while n < len(lines) and lines[n].lstrip().startswith("|"):
            rows.append((n + 1, table_cells(lines[n])))
            n += 1
        measured = [k for k, h in enumerate(header) if "measured" in h.lower()]
        if not measured:
            continue
        above = start - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        marker = NOT_RERUN_RE.match(lines[above]) if above >= 0 else None
        if marker:
            if not marker.group(1):
                problems.append(f"{name}:{above + 1}: <!-- not rerun: --> without the reason (say why a laptop "
                                f"cannot rerun the table below it)")
            continue
        for row_n, cells in rows[2:]:  # past the header and its |---| line
            for k in measured:
                if k >= len(cells):
                    continue
                for num in exact_numbers(cells[k]):
                    CHECKED["table numbers"] += 1
                    if num not in printed:
                        problems.append(
                            f"{name}:{row_n}: {num} in the '{header[k]}' column (row '{cells[0][:40]}') is printed "
                            f"by none of the chapter's ```output blocks. Fix it one of three ways: quote the line "
                            f"that prints it in an ```output block after the ```sh check block that runs it "
                            f"(docs_check reruns it); write ~{num} if it is a timing or varies from run to run; "
                            f"or, if a laptop cannot rerun the table, put <!-- not rerun: WHY --> on the line "
                            f"above it")


def check_arithmetic(repo, path, text, problems):
    """Every written-out sum or product (2 + 4 + 12 = 18) outside code blocks comes out right."""
    name = os.path.relpath(path, repo)
    in_fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        pos = 0
        while m := ARITH_RE.search(line, pos):
            pos = m.start(2)  # the result may start the next one: 53,184 + 2,944 = 56,128 = ...
            lhs, rhs = m.group(1), m.group(2).replace(",", "")
            if lhs.count("(") != lhs.count(")"):
                continue  # a piece of a longer formula (64² or a symbol before it), not a whole sum
            expr = lhs.replace(",", "").replace("×", "*").replace("·", "*").replace("−", "-")
            try:
                value = eval(expr, {"__builtins__": {}})  # digits, + - * / and parentheses only (ARITH_RE)
            except (SyntaxError, ZeroDivisionError):
                continue
            CHECKED["sums"] += 1
            digits = len(rhs.split(".")[1]) if "." in rhs else 0
            if abs(round(value, digits) - float(rhs)) > 1e-9:
                problems.append(f"{name}:{n}: {lhs.strip()} = {round(value, digits)}, not {m.group(2)}")


def check_outputs(repo, path, text, build, problems):
    """Reruns each ```sh check block and compares the ```output blocks after it with what it printed."""
    import tempfile
    import time
    name = os.path.relpath(path, repo)
    printed, started = None, time.time()
    with tempfile.TemporaryDirectory(prefix="docs_check_") as work:
        os.symlink(build, os.path.join(work, "build"))
        os.symlink(os.path.join(repo, "docs"), os.path.join(work, "docs"))
        for n, info, body in fenced_blocks(text):
            if info == "sh check":
                cmds = [c for _, c in command_lines("```sh\n" + "\n".join(body) + "\n```")]
                for prog in sorted(set(re.findall(r"(?<![\w/])build/[\w/.-]+", " ".join(cmds)))):
                    if not os.path.exists(os.path.join(work, prog)):
                        problems.append(f"{name}:{n}: {prog} is not built, so this block cannot be rerun "
                                        f"(cmake --build build --target {os.path.basename(prog)})")
                CHECKED["commands"] += len(cmds)
                printed = run_commands(cmds, build, repo, work)
            elif info.split()[:1] == ["output"]:
                if printed is None:
                    problems.append(f"{name}:{n}: an ```output block with no ```sh check block before it")
                    continue
                rel_tol, only_if = output_block_options(info)
                if only_if and only_if not in printed:
                    CHECKED["blocks for another CPU"] += 1
                    continue
                lines = printed.splitlines()
                for k, quoted in enumerate(body, n + 1):
                    if not quoted.strip():
                        continue
                    CHECKED["quoted lines"] += 1
                    matches = quoted_line_matcher(quoted, rel_tol)
                    if not any(matches(line) for line in lines):
                        problems.append(f"{name}:{k}: the run no longer prints: {quoted.strip()}")
    return time.time() - started


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    repo = os.path.abspath(sys.argv[1])
    flags = known_flags(repo, sys.argv[2] if len(sys.argv) == 3 else None)
    docs = os.path.join(repo, "docs")
    chapters = sorted(f for f in os.listdir(docs) if f.endswith(".md") and f != "README.md")
    problems = []
    if not chapters:
        problems.append("docs/: no chapters")
    index = ""
    if os.path.isfile(os.path.join(docs, "README.md")):
        with open(os.path.join(docs, "README.md")) as fh:
            index = fh.read()
        check_chapter(repo, os.path.join(docs, "README.md"), index, flags, problems)
    else:
        problems.append("docs/README.md: missing (the reading order)")
    for f in chapters:
        path = os.path.join(docs, f)
        with open(path) as fh:
            text = fh.read()
        check_chapter(repo, path, text, flags, problems)
        check_tables(repo, path, text, problems)
        check_arithmetic(repo, path, text, problems)
    with open(os.path.join(repo, "README.md")) as fh:
        readme = fh.read()
    for c in chapters:
        if f"]({c})" not in index:
            problems.append(f"docs/README.md: does not link the chapter {c}")
        if f"](docs/{c})" not in readme:
            problems.append(f"README.md: does not link the chapter docs/{c}")
    check_trace_summary(repo, problems)
    check_ring_summary(repo, problems)

    check_step_traffic(repo, problems)
    check_tolerance(problems)
    if len(sys.argv) == 3:  # the build to rerun the chapters' commands with
        build = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[2])))
        only = os.environ.get("LOOM_DOCS_CHAPTERS", "")  # e.g. "04,06": rerun only these
        for f in ["README.md"] + chapters:
            if only and not any(f.startswith(c) for c in only.split(",")):
                continue
            with open(os.path.join(docs, f)) as fh:
                seconds = check_outputs(repo, os.path.join(docs, f), fh.read(), build, problems)
            if seconds > 0.5:
                print(f"check_docs: reran docs/{f} in {seconds:.0f} s")
    for p in problems:
        print(p)
    print(f"check_docs: {len(chapters)} chapters; checked {CHECKED['paths']} paths, {CHECKED['symbols']} symbols, "
          f"{CHECKED['flags']} train_gpt flags ({len(flags)} known); reran {CHECKED['commands']} commands, compared "
          f"{CHECKED['quoted lines']} quoted output lines (skipped {CHECKED['blocks for another CPU']} blocks "
          f"quoted for another kind of CPU), {CHECKED['table numbers']} measured table numbers, "
          f"{CHECKED['sums']} sums; {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
