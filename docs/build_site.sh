#!/usr/bin/env bash
# Builds the course as a static site, fully offline: build/site/index.html.
#   bash docs/build_site.sh [SITE_DIR]      (default build/site; LOOM_BUILD=DIR: the build to draw with, default build)
# The chapters in reading order (docs/README.md is index.html), each with
# previous / contents / next and a sidebar; every repo path a chapter names
# links to a page of that file's source; the pictures the chapters' commands
# draw (chapter 4's --schedule-svg, chapter 17's sweep) are drawn again with
# this build (build/examples/train_gpt, build/plan/loom_plan, when built) and
# inlined; planner.html runs loom_plan itself, compiled to WebAssembly
# (build/plan/wasm/planner_wasm.js, when Emscripten built it). Pandoc
# (Debian's: apt-get install pandoc) turns Markdown into HTML
# with docs/site/template.html; no script, font or style is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
site=${1:-build/site}
command -v pandoc > /dev/null || { echo "build_site.sh: pandoc not found (apt-get install -y pandoc)" >&2; exit 1; }
rm -rf "$site" && mkdir -p "$site"
build=()
b=${LOOM_BUILD:-build}
if [ -x "$b/examples/train_gpt" ] && [ -x "$b/plan/loom_plan" ]; then build=("$b")
else echo "build_site.sh: no $b/examples/train_gpt and $b/plan/loom_plan: the pages go without their pictures" >&2; fi
/usr/bin/python3 docs/site/prepare.py . "$site" "${build[@]}"
cp docs/site/style.css docs/site/loom_plan.js docs/site/planner_page.js "$site/"
# The planner page's loom_plan, compiled to WebAssembly by this build when it
# found Emscripten (plan/CMakeLists.txt); without it the page says so.
if [ -f "$b/plan/wasm/planner_wasm.js" ]; then cp "$b/plan/wasm/planner_wasm.js" "$site/"
else
  echo "build_site.sh: no $b/plan/wasm/planner_wasm.js (apt-get install emscripten, rebuild): the planner page says so" >&2
  echo "// This site was built without the WebAssembly planner: planner_page.js says so on the page." > "$site/planner_wasm.js"
fi

mapfile -t pages < "$site/pages.txt"
sidebar="<ol>"
for p in "${pages[@]:1}"; do
  read -r md html title <<< "$p"
  sidebar+="<li><a href=\"$html\">${title}</a></li>"
done
sidebar+="</ol>"
for i in "${!pages[@]}"; do
  read -r md html title <<< "${pages[$i]}"
  nav=()
  if (( i > 0 )); then read -r _ h t <<< "${pages[$((i - 1))]}"; nav+=(-V "prev=$h" -V "prevtitle=$t"); fi
  if (( i + 1 < ${#pages[@]} )); then read -r _ h t <<< "${pages[$((i + 1))]}"; nav+=(-V "next=$h" -V "nexttitle=$t"); fi
  pandoc --from gfm --to html5 --standalone --template docs/site/template.html \
         --metadata "pagetitle=$title" -V "root=" -V "sidebar=${sidebar//<a href=\"$html\">/<a class=\"here\" href=\"$html\">}" \
         "${nav[@]}" -o "$site/$html" "$site/md/$md"
done
rm -rf "$site/md" "$site/pages.txt"
echo "build_site.sh: ${#pages[@]} pages, $(find "$site/src" -name '*.html' | wc -l) source pages, $(ls "$site/svg" 2>/dev/null | wc -l) pictures: $site/index.html"
