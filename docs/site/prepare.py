#!/usr/bin/python3
"""Turns docs/*.md into pandoc input for the site (docs/build_site.sh).

  /usr/bin/python3 docs/site/prepare.py REPO SITE [TRAIN_GPT_BUILD]

For each page, in reading order (docs/README.md as index.html, the chapters,
teaching.md, and docs/site/planner.md, the planner live): chapter links (NN-name.md) become NN-name.html; every backticked
repo path (`parallel/data_parallel/bucket.h`) becomes a link to a page of that file's source
(SITE/src/PATH.html, written here, escaped, with line numbers), so the site
needs nothing but itself; the pictures a chapter's command draws (a schedule
SVG, the planner's sweep) are made by running that command with the build,
and inlined after the block that makes them. Writes SITE/pages.txt: one line
a page, "MD HTML TITLE", which build_site.sh hands to pandoc in order.
"""
import html
import os
import re
import subprocess
import sys

PATH_RE = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+)`")
CHAPTER_LINK_RE = re.compile(r"\]\(((?:\d\d-[\w-]+|teaching|README|site/planner)\.md)(#[^)]*)?\)")
# (chapter, a command of its ```sh check block that draws the picture, how to draw it here, caption)
PICTURES = {
    "04-pipeline-parallel.md": [
        ("--schedule-svg schedule_1f1b.svg",
         "mpirun --oversubscribe -np 2 {build}/examples/train_gpt --pp 2 --virtual-stages 1 --microbatches 4 --batch 2 "
         "--schedule-svg {out} --steps 3 --eval-every 0 --sample 0 --log-every 10",
         "pp_1f1b.svg", "1F1B, 2 stages, 4 micro-batches: step 2, drawn by --schedule-svg in this build"),
        ("--schedule-svg schedule.svg",
         "mpirun --oversubscribe -np 2 {build}/examples/train_gpt --pp 2 --virtual-stages 2 --microbatches 4 --batch 2 "
         "--schedule-svg {out} --steps 3 --eval-every 0 --sample 0 --log-every 10",
         "pp_interleaved.svg", "interleaved 1F1B (2 virtual stages): step 2, drawn by --schedule-svg in this build"),
    ],
    "17-choosing-the-grid.md": [
        ("docs/plan_sweep.py",
         "/usr/bin/python3 {repo}/docs/plan_sweep.py {build}/plan/loom_plan --svg {out} -- --model gpt3-175b "
         "--machine a100 --batch 1 --dtype bf16 --recompute-selective --sequence-parallel --partition blocks",
         "sweep.svg", "the sweep without ZeRO: memory of the fullest rank against step time (loom_plan's numbers)"),
    ],
}


def pages(repo):
    docs = os.path.join(repo, "docs")
    chapters = sorted(f for f in os.listdir(docs) if re.match(r"\d\d-.*\.md$", f))
    return ["README.md"] + chapters + ["teaching.md", "site/planner.md"]  # planner.md: loom_plan live, in WebAssembly


def html_name(md):
    return "index.html" if md == "README.md" else os.path.basename(md)[:-3] + ".html"


def title(text):
    m = re.search(r"^# (.*)$", text, re.M)
    return m.group(1).strip() if m else "loom"


def source_page(repo, site, path):
    """SITE/src/PATH.html: the file, escaped, numbered; a folder: its listing."""
    full = os.path.join(repo, path.rstrip("/"))
    out = os.path.join(site, "src", path.rstrip("/") + ".html")
    if os.path.exists(out):
        return
    os.makedirs(os.path.dirname(out), exist_ok=True)
    depth = "../" * (path.rstrip("/").count("/") + 1)
    if os.path.isdir(full):
        entries = sorted(os.listdir(full))
        body = "<ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in entries) + "</ul>"
    else:
        with open(full, errors="replace") as f:
            lines = f.read().splitlines()
        body = "<pre><code>" + "\n".join(f'<span id="L{n}">{n:5d}  {html.escape(line)}</span>'
                                          for n, line in enumerate(lines, 1)) + "</code></pre>"
    with open(out, "w") as f:
        f.write(f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(path)}</title>'
                f'<link rel="stylesheet" href="{depth}style.css"></head><body><main>'
                f'<p><a href="{depth}index.html">loom, the course</a></p><h1><code>{html.escape(path)}</code></h1>'
                f'{body}</main></body></html>\n')


def picture(repo, site, build, command, name):
    """Runs command, which writes an SVG; returns its text, or None (no build, or it failed)."""
    out = os.path.join(site, "svg", name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if not build:
        return None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = command.format(build=build, repo=repo, out=out)
    r = subprocess.run(cmd, shell=True, cwd=site, env=env, capture_output=True, text=True, timeout=240)
    if r.returncode != 0 or not os.path.exists(out):
        print(f"prepare.py: no picture {name}: {cmd}\n{r.stdout[-500:]}{r.stderr[-500:]}", file=sys.stderr)
        return None
    with open(out) as f:
        svg = f.read()
    return re.sub(r"<\?xml[^>]*\?>\s*", "", svg)


def prepare(repo, site, build, md, text):
    # chapter links -> pages; repo paths -> source pages (backticks inside code blocks stay text)
    text = CHAPTER_LINK_RE.sub(lambda m: "](" + html_name(m.group(1)) + (m.group(2) or "") + ")", text)
    def repo_link(m):  # ](../plan/machine.cpp) -> the file's source page
        p = m.group(1)
        if not os.path.exists(os.path.join(repo, p.rstrip("/"))):
            return m.group(0)
        source_page(repo, site, p)
        return f"](src/{p.rstrip('/')}.html{m.group(2) or ''})"
    text = re.sub(r"\]\(\.\./([^)#\s]+)(#[^)]*)?\)", repo_link, text)
    out, in_fence, fence_text = [], False, []
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if in_fence:
                out.append(line)
                in_fence = False
                block = "\n".join(fence_text)
                for key, command, name, caption in PICTURES.get(md, []):
                    if key in block:
                        svg = picture(repo, site, build, command, name)
                        if svg:
                            out += ["", f'<figure class="svg">{svg}<figcaption>{html.escape(caption)}</figcaption>'
                                        "</figure>", ""]
                continue
            in_fence, fence_text = True, []
            out.append(line)
            continue
        if in_fence:
            fence_text.append(line)
            out.append(line)
            continue

        def link(m):
            p = m.group(1)
            if p.startswith(("build/", "http")) or not os.path.exists(os.path.join(repo, p.rstrip("/"))):
                return m.group(0)
            source_page(repo, site, p)
            return f"[`{p}`](src/{p.rstrip('/')}.html)"
        out.append(PATH_RE.sub(link, line))
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    repo, site = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    build = os.path.abspath(sys.argv[3]) if len(sys.argv) == 4 else None
    os.makedirs(os.path.join(site, "md"), exist_ok=True)
    listing = []
    for md in pages(repo):
        with open(os.path.join(repo, "docs", md)) as f:
            text = f.read()
        with open(os.path.join(site, "md", os.path.basename(md)), "w") as f:
            f.write(prepare(repo, site, build, md, text))
        listing.append(f"{os.path.basename(md)} {html_name(md)} {title(text)}")
    with open(os.path.join(site, "pages.txt"), "w") as f:
        f.write("\n".join(listing) + "\n")


if __name__ == "__main__":
    main()
