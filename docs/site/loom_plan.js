// loom_plan, compiled to WebAssembly (plan/wasm/entry.cpp), as one function:
// the planner page's and its tests' one way in.
//
//   const run = await loadPlanner(loomPlanner);      // loomPlanner: planner_wasm.js's factory
//   run(["--model", "gpt2-124m", "--machine", "h100", "--dp", "8"])
//   -> {exit, stdout, stderr, plan}: the CLI's exit code and printout, and the
//      plan's numbers (plan/wasm/entry.cpp lists them; null when refused)
async function loadPlanner(factory) {
  const printed = {stdout: [], stderr: []};
  const wasm = await factory({print: line => printed.stdout.push(line), printErr: line => printed.stderr.push(line)});
  return args => {
    printed.stdout = [], printed.stderr = [];
    const result = JSON.parse(wasm.ccall("loom_plan_json", "string", ["string"], [args.join("\n")]));
    const text = lines => lines.length ? lines.join("\n") + "\n" : "";
    return {...result, stdout: text(printed.stdout), stderr: text(printed.stderr)};
  };
}

// printf's "%.<d>f": a value exactly halfway goes to the even digit, where
// JavaScript's toFixed goes up (2.625 -> "2.62" in C, "2.63" in JS).
function fixed(x, d) {
  const scaled = x * 10 ** d;
  if (scaled - Math.floor(scaled) === 0.5 && Math.floor(scaled) % 2 === 0) return (Math.floor(scaled) / 10 ** d).toFixed(d);
  return x.toFixed(d);
}

// Bytes and seconds as loom_plan prints them (plan/report.cpp: bytes(), seconds()).
function formatBytes(b) {
  const KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;
  if (b >= GiB) return fixed(b / GiB, 2) + " GiB";
  if (b >= MiB) return fixed(b / MiB, 2) + " MiB";
  return fixed(b / KiB, 1) + " KiB";
}
function formatSeconds(s) {
  if (s >= 1) return fixed(s, 2) + " s";
  if (s >= 1e-3) return fixed(s * 1e3, 2) + " ms";
  return fixed(s * 1e6, 1) + " us";
}

if (typeof module !== "undefined") module.exports = {loadPlanner, fixed, formatBytes, formatSeconds};
