// The planner page in a real browser (CTest planner_wasm_browser).
//
//   node tests/planner_wasm/browser.js CHROMIUM SITE/planner.html LOOM_PLAN OUT_DIR [CONFIGS]
//
// With CONFIGS (configs.txt), first every flag set in it runs through the
// page's WebAssembly (window.loomPlan) in the browser: exit code, stdout and
// stderr byte for byte the CLI's, as equals_cli.js checks under Node.
// Headless Chromium opens the built site from disk (file://, nothing served),
// and for each case below sets the form as a reader would, then reads the page:
// the command it shows is run through build/plan/loom_plan, and the page's
// printout, memory table (every rank, every kind), step time, MFU and refusal
// must be the CLI's. Each case's screenshot is saved to OUT_DIR; each figure
// (memory, step, schedule) is cut from a screenshot and must not be blank; any
// console error or uncaught exception fails the test. Chromium is driven by
// its DevTools protocol over a pipe (--remote-debugging-pipe), nothing to install.
"use strict";
const {spawn, spawnSync} = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");
const zlib = require("zlib");
const {fixed, formatBytes, formatSeconds} = require(path.join(__dirname, "../../docs/site/loom_plan.js"));

// Each case changes the form from the case before, as a reader would; its
// fields are named as planner_page.js names them (loom_plan's flags), and
// "refused" says whether the CLI must refuse the result.
const CASES = [
  {refused: false, set: {}},  // the page as it opens
  {refused: false, set: {model: "GPT-2 124M", machine: "A100 80GB", dtype: "fp32", dp: 4, tp: 2, pp: 2, zero: 2,
                         recompute: "selective", schedule: "afab", microbatches: 4, batch: 4}},
  {refused: false, set: {model: "Llama-2-70B", machine: "H100 80GB", dtype: "bf16", dp: 2, tp: 8, pp: 4, cp: 2, zero: 3,
                         recompute: "full", schedule: "zb-h1", microbatches: 8, batch: 1}},
  {refused: false, set: {model: "GPT-3 175B", machine: "A100 80GB", dp: 4, tp: 8, pp: 8, cp: 1, zero: 1,
                         "virtual-stages": 2, schedule: "1f1b", microbatches: 16, "sequence-parallel": true,
                         recompute: "selective"}},
  {refused: false, set: {model: "GPT-2 1.5B", dp: 16, tp: 1, pp: 1, "virtual-stages": 1, zero: 0, recompute: "",
                         microbatches: 2, "sequence-parallel": false}},
  {refused: true, set: {model: "GPT-2 124M", tp: 5}},  // 12 heads over tp 5
  {refused: true, set: {tp: 1, pp: 2, "virtual-stages": 2, schedule: "afab"}},  // no interleaved AFAB
];

// Chromium's DevTools protocol over a pipe: JSON messages, each ending in \0,
// written to its fd 3 and read from its fd 4.
function devtools(chromium, profile) {
  const proc = spawn(chromium, ["--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                                `--user-data-dir=${profile}`, "about:blank"],  // no flag that eases file:// pages
                     {stdio: ["ignore", "ignore", "ignore", "pipe", "pipe"]});
  let next = 1, buffer = Buffer.alloc(0);
  const waiting = new Map(), listeners = [];
  proc.stdio[4].on("data", chunk => {
    buffer = Buffer.concat([buffer, chunk]);
    for (let end; (end = buffer.indexOf(0)) >= 0; buffer = buffer.subarray(end + 1)) {
      const msg = JSON.parse(buffer.subarray(0, end).toString("utf8"));
      const w = waiting.get(msg.id);
      if (w) waiting.delete(msg.id), msg.error ? w.reject(new Error(JSON.stringify(msg.error))) : w.resolve(msg.result);
      else listeners.forEach(f => f(msg));
    }
  });
  const send = (method, params = {}, sessionId) => new Promise((resolve, reject) => {
    const id = next++;
    waiting.set(id, {resolve, reject});
    proc.stdio[3].write(JSON.stringify({id, method, params, sessionId}) + "\0");
  });
  return {proc, send, on: f => listeners.push(f)};
}

// An 8-bit RGB(A), non-interlaced PNG (what Chromium writes) -> its distinct colours.
function pngColours(png) {
  const w = png.readUInt32BE(16), h = png.readUInt32BE(20), bpp = png[25] === 6 ? 4 : 3, stride = w * bpp;
  const idat = [];
  for (let at = 8; at < png.length; at += 12 + png.readUInt32BE(at))
    if (png.toString("ascii", at + 4, at + 8) === "IDAT") idat.push(png.subarray(at + 8, at + 8 + png.readUInt32BE(at)));
  const raw = zlib.inflateSync(Buffer.concat(idat)), px = Buffer.alloc(h * stride), colours = new Set();
  for (let y = 0; y < h; y++) {
    const filter = raw[y * (stride + 1)], line = raw.subarray(y * (stride + 1) + 1);
    for (let x = 0; x < stride; x++) {  // undo the row's filter (PNG spec, section 9)
      const a = x >= bpp ? px[y * stride + x - bpp] : 0, b = y ? px[(y - 1) * stride + x] : 0;
      const c = x >= bpp && y ? px[(y - 1) * stride + x - bpp] : 0, p = a + b - c;
      const paeth = Math.abs(p - a) <= Math.abs(p - b) && Math.abs(p - a) <= Math.abs(p - c) ? a
                  : Math.abs(p - b) <= Math.abs(p - c) ? b : c;
      px[y * stride + x] = (line[x] + [0, a, b, (a + b) >> 1, paeth][filter]) & 255;
    }
    for (let x = 0; x < w; x++) colours.add(px.readUIntBE(y * stride + x * bpp, 3));
  }
  return colours.size;
}

// The CLI's printout against what the page shows: a list of problems.
function compare(cli, page) {
  const problems = [];
  if (cli.status !== 0) {
    if (!page.refused || page.refused !== cli.stderr) problems.push(`refusal: CLI "${cli.stderr}", page "${page.refused}"`);
    return problems;
  }
  if (page.refused) problems.push(`the page refused what the CLI planned: ${page.refused}`);
  if (page.printout !== cli.stdout) problems.push("the page's printout is not the CLI's");
  const lines = cli.stdout.split("\n");
  page.rows.forEach((cells, i) => {  // pp rank, params, grads, optimizer, activations, gathered, total, %
    const row = lines.find(l => new RegExp(`^\\s+${i}  (emb|\\d)`).test(l));
    const printed = (row || "").match(/\d+\.\d+ [KMG]iB/g), shown = [...cells.slice(1, 5), cells[6]];
    if (JSON.stringify(printed) !== JSON.stringify(shown)) problems.push(`pp rank ${i}: CLI ${printed}, page ${shown}`);
  });
  const pp = Number((/x pp (\d+)/.exec(cli.stdout) || [])[1]);
  if (page.rows.length !== pp) problems.push(`${page.rows.length} memory rows for pp ${pp}`);
  const step = lines.find(l => l.startsWith("step time:")) || "";
  for (const [what, shown] of [["step time: ", page.step], ["(bubble ", page.bubble], ["optimizer ", page.optimizer]])
    if (!step.includes(what + shown)) problems.push(`${what}${shown} not in "${step}"`);
  if (!cli.stdout.includes(`MFU ${page.mfu},`)) problems.push(`MFU ${page.mfu} is not the CLI's`);
  return problems;
}

async function main() {
  const [chromium, html, loomPlan, out, configFile] = process.argv.slice(2);
  fs.mkdirSync(out, {recursive: true});
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "loom-chromium-"));
  const cdp = devtools(chromium, profile), errors = [];
  cdp.on(msg => {
    const p = msg.params || {};
    if (msg.method === "Runtime.exceptionThrown") errors.push(p.exceptionDetails.exception?.description || p.exceptionDetails.text);
    if (msg.method === "Runtime.consoleAPICalled" && (p.type === "error" || p.type === "assert"))
      errors.push(p.args.map(a => a.value ?? a.description).join(" "));
    if (msg.method === "Log.entryAdded" && p.entry.level === "error") errors.push(`${p.entry.text} ${p.entry.url || ""}`);
  });
  const {targetId} = await cdp.send("Target.createTarget", {url: "about:blank"});
  const {sessionId} = await cdp.send("Target.attachToTarget", {targetId, flatten: true});
  const page = (method, params) => cdp.send(method, params, sessionId);
  const evaluate = async expr => (await page("Runtime.evaluate", {expression: expr, returnByValue: true})).result.value;
  for (const domain of ["Runtime", "Log", "Page"]) await page(domain + ".enable");
  await page("Emulation.setDeviceMetricsOverride", {width: 1300, height: 1800, deviceScaleFactor: 1, mobile: false});
  await page("Page.navigate", {url: "file://" + path.resolve(html)});
  for (let t = 0; !(await evaluate("document.body && document.body.dataset.ready === '1'")); t++) {
    if (t > 300) throw new Error(`the page never became ready: ${errors.join("; ")}`);
    await new Promise(r => setTimeout(r, 100));
  }
  let failed = 0;
  const configs = configFile ? fs.readFileSync(configFile, "utf8").split("\n").filter(l => l.trim() && !l.startsWith("#")) : [];
  for (const line of configs) {
    const args = line.trim().split(/\s+/), cli = spawnSync(loomPlan, args, {encoding: "utf8"});
    const web = await evaluate(`(() => { const r = window.loomPlan(${JSON.stringify(args)}); return {exit: r.exit, stdout: r.stdout, stderr: r.stderr}; })()`);
    if (web.exit !== cli.status || web.stdout !== cli.stdout || web.stderr !== cli.stderr)
      failed++, console.log(`FAIL in the browser: loom_plan ${line}: exit ${cli.status} / ${web.exit}\n${cli.stderr}${web.stderr}`);
  }
  console.log(`${configs.length} flag sets through the page's WebAssembly: ${failed} differ from the CLI`);
  for (const [i, {refused, set: fields}] of CASES.entries()) {
    await evaluate(`(() => { const f = document.getElementById("planner").elements, set = ${JSON.stringify(fields)};
      for (const k in set) f[k].type === "checkbox" ? f[k].checked = set[k] : f[k].value = String(set[k]);
      f.dp.dispatchEvent(new Event("change", {bubbles: true})); })()`);
    const shown = await evaluate(`(() => { const t = id => document.getElementById(id)?.textContent;
      return {command: t("command"), refused: document.getElementById("refused").hidden ? "" : t("refused"),
              printout: t("printout"), step: t("step-s"), bubble: t("bubble-s"), optimizer: t("optimizer-s"), mfu: t("mfu"),
              rows: [...document.querySelectorAll("#memory-table tr[data-rank]")].map(r => [...r.cells].map(c => c.textContent)),
              figures: ["memory", "step", "schedule"].map(id => { const r = document.getElementById(id).getBoundingClientRect();
                return {id, x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; })}; })()`);
    const args = shown.command.replace(/^build\/plan\/loom_plan /, "").split(" ");
    const cli = spawnSync(loomPlan, args, {encoding: "utf8"});
    const problems = compare(cli, shown);
    if ((cli.status !== 0) !== refused) problems.push(`the CLI ${refused ? "planned" : "refused"} it: ${cli.stderr}`);
    for (const [k, v] of Object.entries(fields))  // the command is the form's
      if (k !== "model" && k !== "machine" && !(typeof v === "boolean" ? args.includes("--" + k) === v
          : k === "recompute" ? v === "" || args.includes(v === "full" ? "--recompute" : "--recompute-selective")
          : args.join(" ").includes(`--${k} ${v}`)))
        problems.push(`the command does not say ${k} ${v}: ${shown.command}`);
    const shot = await page("Page.captureScreenshot", {format: "png", captureBeyondViewport: true});
    fs.writeFileSync(path.join(out, `case${i}.png`), Buffer.from(shot.data, "base64"));
    if (cli.status === 0)
      for (const f of shown.figures) {
        if (f.id === "schedule" && args[args.indexOf("--pp") + 1] === "1") continue;  // pp 1: a sentence, no picture
        const clip = {x: f.x, y: f.y, width: Math.min(f.width, 1200), height: f.height, scale: 1};
        const png = f.width * f.height > 0 ? Buffer.from((await page("Page.captureScreenshot",
                      {format: "png", clip, captureBeyondViewport: true})).data, "base64") : null;
        const colours = png ? pngColours(png) : 0;
        if (colours < 4) problems.push(`the ${f.id} figure is blank (${f.width}x${f.height}, ${colours} colours)`);
      }
    const verdict = problems.length ? "FAIL" : "ok";
    console.log(`${verdict} case ${i}: ${cli.status === 0 ? "planned" : "refused"}: ${shown.command}`);
    problems.forEach(p => console.log("  " + p));
    if (problems.length) failed++;
  }
  errors.forEach(e => console.log(`console error: ${e}`));
  await new Promise(done => { cdp.proc.on("exit", done); cdp.send("Browser.close").catch(() => cdp.proc.kill()); });
  fs.rmSync(profile, {recursive: true, force: true});
  console.log(`planner_wasm_browser: ${CASES.length} cases, ${failed} failed, ${errors.length} console errors; screenshots in ${out}`);
  process.exit(failed || errors.length ? 1 : 0);
}
main().catch(e => { console.log(e.stack || e); process.exit(1); });
