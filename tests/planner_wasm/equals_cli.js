// The WebAssembly planner equals the CLI (CTest planner_wasm_equals_cli).
//
//   node tests/planner_wasm/equals_cli.js PLANNER_WASM_JS LOOM_PLAN CONFIGS
//
// Each line of CONFIGS (configs.txt) runs through build/plan/loom_plan and
// through planner_wasm.js (under Node, as docs/site/loom_plan.js runs it in
// the page): exit code, stdout and stderr must be byte for byte the same,
// refusals included. Then the numbers the page draws (the JSON of
// plan/wasm/entry.cpp) must be the ones the CLI printed: every rank's memory
// by kind, ZeRO-3's gathered buffer, the step's parts, MFU and HFU,
// formatted as loom_plan formats them; and the parts must add up to the step.
// One difference is meant: --machine cpu measures the CPU loom_plan runs on,
// which the page refuses to do (plan/wasm/no_cpu_measure.cpp); checked last.
"use strict";
const {spawnSync} = require("child_process");
const fs = require("fs");
const path = require("path");
const {loadPlanner, fixed, formatBytes, formatSeconds} = require(path.join(__dirname, "../../docs/site/loom_plan.js"));

function configs(file) {
  return fs.readFileSync(file, "utf8").split("\n").filter(l => l.trim() && !l.startsWith("#")).map(l => l.trim().split(/\s+/));
}

// What the page shows, checked against the CLI's printout: a list of problems.
function pageNumbersMatch(plan, stdout) {
  const problems = [], lines = stdout.split("\n");
  const expect = (what, want, line) => { if (!line || !line.includes(want)) problems.push(`${what}: ${want} not in "${line}"`); };
  plan.stages.forEach((st, i) => {
    const row = lines.find(l => new RegExp(`^\\s+${i}  (emb|\\d)`).test(l));
    const printed = row ? row.match(/\d+\.\d+ [KMG]iB/g) : [];
    const mem = st.memory;
    const mine = [mem.params, mem.grads, mem.optimizer, mem.activations, mem.total].map(formatBytes);
    if (JSON.stringify(printed) !== JSON.stringify(mine)) problems.push(`pp rank ${i}: the CLI prints ${printed}, the page ${mine}`);
  });
  if (plan.stages.some(st => st.memory.gathered > 0))
    expect("ZeRO-3 gathered", plan.stages.map(st => formatBytes(st.memory.gathered)).join(", "), lines.find(l => l.includes("gathered units")));
  const s = plan.step, f = formatSeconds;
  expect("step time", `step time: ${f(s.step_s)} = pipeline ${f(s.pipeline_s)} (bubble ${f(s.bubble_s)}) + dp exposed ` +
         `${f(s.dp_exposed_s)} + embedding ${f(s.embedding_s)} + optimizer ${f(s.optimizer_s)}`, lines.find(l => l.startsWith("step time:")));
  const pct = x => fixed(100 * x / s.step_s, 0) + "%";
  expect("shares", `compute ${pct(s.compute_s)}, tp ${pct(s.tp_s)}, pp p2p ${pct(s.pp_s)}, bubble ${pct(s.bubble_s)}, ` +
         `dp ${pct(s.dp_exposed_s)}, embedding ${pct(s.embedding_s)}, optimizer ${pct(s.optimizer_s)}`, lines.find(l => l.includes("shares:")));
  expect("MFU", `MFU ${fixed(100 * s.mfu, 1)}%, HFU ${fixed(100 * s.hfu, 1)}%`, lines.find(l => l.includes("HFU")));
  expect("capacity", `, ${fixed(plan.machine.memory_gib, 0)} GiB,`, lines.find(l => l.includes("TFLOP/s")));
  const parts = s.compute_s + s.tp_s + s.pp_s + s.cp_s + s.ep_s + s.bubble_s + s.cores_s + s.dp_exposed_s + s.embedding_s +
                s.optimizer_s;
  if (Math.abs(parts - s.step_s) > 1e-12 * s.step_s) problems.push(`the step's parts add up to ${parts}, not ${s.step_s}`);
  if ((plan.stages.length > 1) !== plan.schedule_svg.startsWith("<svg")) problems.push("a pipeline without its picture (or a picture without one)");
  return problems;
}

async function main() {
  const [wasmJs, loomPlan, configFile] = process.argv.slice(2);
  const run = await loadPlanner(require(path.resolve(wasmJs)));
  let failed = 0, refused = 0;
  const all = configs(configFile);
  for (const args of all) {
    const cli = spawnSync(loomPlan, args, {encoding: "utf8"});
    const web = run(args);
    const problems = [];
    if (web.exit !== cli.status) problems.push(`exit: CLI ${cli.status}, wasm ${web.exit}`);
    if (web.stdout !== cli.stdout) problems.push(`stdout differs:\n--- CLI\n${cli.stdout}--- wasm\n${web.stdout}`);
    if (web.stderr !== cli.stderr) problems.push(`stderr differs:\n--- CLI\n${cli.stderr}--- wasm\n${web.stderr}`);
    if (cli.status === 0 && web.plan) problems.push(...pageNumbersMatch(web.plan, cli.stdout));
    else if (cli.status === 0) problems.push("the CLI planned it, the wasm returned no plan");
    else refused++;
    if (problems.length) failed++, console.log(`FAIL loom_plan ${args.join(" ")}\n  ${problems.join("\n  ")}`);
  }
  const cpu = run(["--machine", "cpu"]);
  if (cpu.exit !== 1 || !cpu.stderr.startsWith("loom_plan: --machine cpu measures the CPU that runs loom_plan"))
    failed++, console.log(`FAIL --machine cpu: the page must refuse to measure, got exit ${cpu.exit}: ${cpu.stderr}`);
  console.log(`planner_wasm_equals_cli: ${all.length} configurations (${refused} refused), ${failed} differ`);
  if (all.length < 30) console.log("fewer than 30 configurations"), failed++;
  process.exit(failed ? 1 : 0);
}
main().catch(e => { console.log(e.stack || e); process.exit(1); });
