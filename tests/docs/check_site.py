#!/usr/bin/python3
"""Checks the site docs/build_site.sh built (CTest: docs_site, label docs).

  /usr/bin/python3 tests/docs/check_site.py REPO SITE [--pictures N]

  pages     every page of the course has its HTML: docs/README.md as index.html,
            each docs/NN-*.md and docs/teaching.md as NN-*.html, teaching.html,
            and docs/site/planner.md (the planner, live) as planner.html
  order     each chapter page links the one before and the one after it (the pager)
  links     every local href and src of every HTML file of the site (the source
            pages too) names a file of the site (#fragments dropped)
  offline   no asset is fetched from the network: no src=, <link href=, CSS url()
            or @import with http(s): or // (a hyperlink <a href="https://..."> is
            a link for the reader, not an asset, and is allowed)
  pictures  with --pictures N, at least N inline <svg> in the site's pages
Exits 1 listing every problem, 0 when there is none.
"""
import os
import re
import sys

ASSET_RES = [re.compile(r"<(?:img|script|iframe|source|video|audio|embed)\b[^>]*\bsrc\s*=\s*[\"']?([^\"' >]+)", re.I),
             re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?([^\"' >]+)", re.I),
             re.compile(r"url\(\s*[\"']?([^\"')]+)", re.I), re.compile(r"@import\s+[\"']([^\"']+)", re.I)]
LINK_RE = re.compile(r"\b(?:href|src)\s*=\s*\"([^\"]*)\"", re.I)


def main():
    args = sys.argv[1:]
    pictures = 0
    if "--pictures" in args:
        k = args.index("--pictures")
        pictures = int(args[k + 1])
        del args[k:k + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    repo, site = (os.path.abspath(a) for a in args)
    problems = []
    chapters = sorted(f for f in os.listdir(os.path.join(repo, "docs")) if re.match(r"\d\d-.*\.md$", f))
    order = ["index.html"] + [c[:-3] + ".html" for c in chapters] + ["teaching.html", "planner.html"]
    for page in order:
        if not os.path.isfile(os.path.join(site, page)):
            problems.append(f"{page}: missing")
    for i, page in enumerate(order):
        path = os.path.join(site, page)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            text = f.read()
        pager = text[text.find('class="pager"'):]
        if i > 0 and f'href="{order[i - 1]}"' not in pager:
            problems.append(f"{page}: the pager does not link the page before, {order[i - 1]}")
        if i + 1 < len(order) and f'href="{order[i + 1]}"' not in pager:
            problems.append(f"{page}: the pager does not link the page after, {order[i + 1]}")
    svgs, files, links = 0, 0, 0
    for root, _, names in os.walk(site):
        for name in names:
            if not name.endswith((".html", ".css")):
                continue
            files += 1
            path = os.path.join(root, name)
            rel = os.path.relpath(path, site)
            with open(path, errors="replace") as f:
                text = f.read()
            svgs += len(re.findall(r"<svg\b", text)) if name.endswith(".html") and "/" not in rel else 0
            for rx in ASSET_RES:
                for url in rx.findall(text):
                    if re.match(r"(?:https?:)?//", url):
                        problems.append(f"{rel}: fetches {url} from the network")
            for url in LINK_RE.findall(text):
                if re.match(r"[a-z]+:|//|#", url) or not url:
                    continue
                links += 1
                target = os.path.normpath(os.path.join(root, url.split("#")[0]))
                if not target.startswith(site) or not os.path.exists(target):
                    problems.append(f"{rel}: link {url} leads nowhere")
    if svgs < pictures:
        problems.append(f"{svgs} inline pictures in the pages, expected at least {pictures}")
    for p in problems:
        print(p)
    print(f"check_site: {len(order)} pages, {files} files, {links} local links, {svgs} inline SVGs; "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
