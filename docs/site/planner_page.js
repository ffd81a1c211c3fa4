// The planner page (planner.md): the form's choices become loom_plan's flags,
// loom_plan runs in WebAssembly (loom_plan.js), and its plan is drawn.
"use strict";

// Models: loom_plan's --model presets, and shapes given flag by flag.
const MODELS = {
  "GPT-2 124M": ["--model", "gpt2-124m"],
  "GPT-2 350M": ["--layers", "24", "--embd", "1024", "--heads", "16", "--vocab", "50257", "--block", "1024"],
  "GPT-2 1.5B": ["--layers", "48", "--embd", "1600", "--heads", "25", "--vocab", "50257", "--block", "1024"],
  "Llama-2-7B-like": ["--arch", "llama", "--layers", "32", "--embd", "4096", "--heads", "32", "--ffn", "11008",
                      "--vocab", "32000", "--block", "4096"],
  "Llama-2-70B": ["--model", "llama2-70b"],
  "GPT-3 175B": ["--model", "gpt3-175b"],
  "Mixtral-8x7B (MoE)": ["--model", "mixtral-8x7b"],
  "DeepSeek-V3 (MoE)": ["--model", "deepseek-v3"],
};
// loom_plan's datasheet machines (plan/machine.cpp; cpu is measured, so not here).
const MACHINES = {"H100 80GB": "h100", "H200 141GB": "h200", "A100 80GB": "a100", "a laptop (8 AVX2 cores)": "laptop"};
// Memory by kind (plan/memory_model.h's RankMemory); "gathered" is ZeRO-3's
// buffer of gathered units, the one buffer the planner counts.
const KINDS = [["params", "#4c78a8"], ["grads", "#72b7b2"], ["optimizer", "#f58518"],
               ["activations", "#54a24b"], ["gathered", "#b279a2"]];

const form = document.getElementById("planner");
const $ = id => document.getElementById(id);

function fillSelect(name, options) {
  form.elements[name].innerHTML = Object.keys(options).map(k => `<option>${k}</option>`).join("");
}

// The form as loom_plan's command line.
function flags() {
  const f = form.elements, args = [...MODELS[f.model.value], "--machine", MACHINES[f.machine.value]];
  for (const name of ["dtype", "dp", "tp", "pp", "cp", "ep", "virtual-stages", "zero", "schedule", "microbatches", "batch"])
    args.push("--" + name, f[name].value);
  if (f["sequence-parallel"].checked) args.push("--sequence-parallel");
  if (f.recompute.value) args.push(f.recompute.value === "full" ? "--recompute" : "--recompute-selective");
  return args;
}

// One horizontal stacked bar per row: rows = [{label, parts: [[name, value, colour]]}], a line at `limit`.
function bars(rows, limit, format, limitLabel) {
  const width = 640, left = 110, row = 30, scale = Math.max(limit, ...rows.map(r => r.parts.reduce((a, p) => a + p[1], 0)));
  let svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${width + left + 10}" height="${rows.length * row + 30}">`;
  rows.forEach((r, i) => {
    let x = left;
    svg += `<text x="4" y="${i * row + 20}" font-size="13">${r.label}</text>`;
    for (const [name, value, colour] of r.parts) {
      const w = width * value / scale;
      svg += `<rect x="${x}" y="${i * row + 6}" width="${w}" height="20" fill="${colour}"><title>${name} ${format(value)}</title></rect>`;
      x += w;
    }
  });
  const lx = left + width * limit / scale, h = rows.length * row + 8;
  svg += `<line x1="${lx}" y1="2" x2="${lx}" y2="${h}" stroke="#c00" stroke-width="2"/>`;
  svg += `<text x="${Math.min(lx, left + width - 60)}" y="${h + 16}" font-size="12" fill="#c00">${limitLabel}</text>`;
  return svg + "</svg>";
}

function legend(items) {
  return items.map(([name, colour]) => `<span class="key" style="background:${colour}"></span>${name}`).join(" ");
}

function drawMemory(plan) {
  const capacity = plan.machine.memory_gib * 2 ** 30;
  const rows = plan.stages.map((st, i) => ({label: `pp rank ${i}`, parts: KINDS.map(([k, c]) => [k, st.memory[k], c])}));
  $("memory").innerHTML = bars(rows, capacity, formatBytes, `${plan.machine.memory_gib} GiB`) + "<p>" + legend(KINDS) + "</p>";
  const head = ["pp rank", ...KINDS.map(k => k[0]), "total", "of the device"];
  $("memory-table").innerHTML = `<tr>${head.map(h => `<th>${h}</th>`).join("")}</tr>` + plan.stages.map((st, i) =>
    `<tr data-rank="${i}"><td>${i}</td>${[...KINDS.map(k => st.memory[k[0]]), st.memory.total].map(b =>
      `<td>${formatBytes(b)}</td>`).join("")}<td>${fixed(100 * st.memory.total / capacity, 0)}%</td></tr>`).join("");
}

function drawStep(plan) {
  const s = plan.step;
  const parts = [["compute", s.compute_s, "#4c78a8"], ["tp", s.tp_s, "#f58518"], ["pp p2p", s.pp_s, "#e45756"],
                 ["cp ring", s.cp_s, "#ff9da6"], ["ep all-to-all", s.ep_s, "#17becf"], ["dp", s.dp_exposed_s, "#eeca3b"], ["embedding", s.embedding_s, "#9d755d"],
                 ["bubble", s.bubble_s, "#bab0ac"], ["optimizer", s.optimizer_s, "#b279a2"], ["cores", s.cores_s, "#888"]];
  $("step").innerHTML = bars([{label: "one step", parts}], s.step_s, formatSeconds, formatSeconds(s.step_s)) +
                        "<p>" + legend(parts.filter(p => p[1] > 0).map(p => [p[0], p[2]])) + "</p>";
  const comm = s.tp_s + s.pp_s + s.cp_s + s.ep_s + s.dp_exposed_s + s.embedding_s;
  $("step-text").innerHTML = `step <b id="step-s">${formatSeconds(s.step_s)}</b>: compute <span id="compute-s">` +
    `${formatSeconds(s.compute_s)}</span>, exposed communication <span id="comm-s">${formatSeconds(comm)}</span>, ` +
    `bubble <span id="bubble-s">${formatSeconds(s.bubble_s)}</span>, optimizer <span id="optimizer-s">` +
    `${formatSeconds(s.optimizer_s)}</span>; MFU <span id="mfu">${fixed(100 * s.mfu, 1)}%</span>. Binds: ${plan.binds}.`;
}

function update(run) {
  const args = flags(), r = run(args);
  $("command").textContent = "build/plan/loom_plan " + args.join(" ");
  $("refused").hidden = r.exit === 0;
  $("refused").textContent = r.stderr;
  $("results").hidden = r.exit !== 0;
  if (r.exit !== 0) return;
  drawMemory(r.plan);
  drawStep(r.plan);
  $("schedule").innerHTML = r.plan.schedule_svg ||
    (r.plan.stages.length > 1 ? "<p>No drawing of this schedule yet.</p>" : "<p>pp 1: no pipeline, nothing to schedule.</p>");
  const svg = $("schedule").querySelector("svg");  // drawn 1000 wide: fit it to the column
  if (svg) svg.setAttribute("viewBox", `0 0 ${svg.getAttribute("width")} ${svg.getAttribute("height")}`),
           svg.setAttribute("width", "100%"), svg.removeAttribute("height");
  $("printout").textContent = r.stdout;
}

fillSelect("model", MODELS);
fillSelect("machine", MACHINES);
form.elements.model.value = "Llama-2-7B-like";
form.elements.zero.value = "1";
if (typeof loomPlanner === "undefined") {  // a site built without Emscripten (docs/build_site.sh)
  $("refused").hidden = false, $("results").hidden = true;
  $("refused").textContent = "This site was built without the WebAssembly planner (apt-get install emscripten, rebuild).";
} else {
  loadPlanner(loomPlanner).then(run => {
    for (const event of ["input", "change"]) form.addEventListener(event, () => update(run));  // as one types, and on leaving
    update(run);
    window.loomPlan = run;  // for the console, and the browser test (tests/planner_wasm/browser.js)
    document.body.dataset.ready = "1";
  });
}
