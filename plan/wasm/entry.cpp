// loom_plan in the browser (docs/site/planner.md): the same program, not a
// copy. plan/loom_plan.cpp is compiled unchanged to WebAssembly with its main
// renamed loom_plan_main (plan/CMakeLists.txt), so the page's choices go in as
// the flags a shell would pass, and are parsed, checked and refused by the
// CLI's own code; what it prints is the CLI's printout. To draw the plan as
// well, the link wraps report() (wasm-ld --wrap): the wrapper below keeps the
// plan it is handed, as JSON, then prints exactly as the CLI does.
//
//   loom_plan_json("--model\ngpt2-124m\n--machine\nh100\n--dp\n8")   (one argument a line)
//   -> {"exit": 0, "plan": {"machine": ..., "stages": [...], "step": {...}, "schedule_svg": "<svg ..."}}
//   (the printout goes to stdout and stderr, which docs/site/loom_plan.js collects)
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "plan/report.h"
#include "plan/wasm/schedule_picture.h"

using namespace loom::plan;

int loom_plan_main(int argc, char** argv);  // plan/loom_plan.cpp's main

namespace {

std::string plan_json;  // the plan report() was handed in this call, "" if loom_plan refused first

// A JSON object written field by field: doubles with 17 digits, so the page
// reads the very numbers loom_plan computed.
struct Json {
  std::string s = "{";
  Json& field(const char* key, double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return raw(key, buf);
  }
  Json& field(const char* key, const std::string& v) {
    std::string q = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') q += '\\', q += c;
      else if (c == '\n') q += "\\n";
      else if (static_cast<unsigned char>(c) < 0x20) q += ' ';
      else q += c;
    }
    return raw(key, q + "\"");
  }
  Json& raw(const char* key, const std::string& v) {
    s += (s.size() > 1 ? ",\"" : "\"") + std::string(key) + "\":" + v;
    return *this;
  }
  std::string str() const { return s + "}"; }
};

std::string stage_json(const StagePlan& sp) {
  const RankMemory& r = sp.memory;
  Json mem;  // bytes, by kind; "gathered" is ZeRO-3's buffer of gathered units
  mem.field("params", double(r.params)).field("grads", double(r.grads)).field("optimizer", double(r.optimizer));
  mem.field("activations", r.activations).field("gathered", double(r.gathered)).field("total", r.total());
  Json j;
  j.field("num_params", double(r.num_params)).raw("memory", mem.str());
  j.field("forward_s", sp.compute.forward_s).field("backward_s", sp.compute.backward_s);
  return j.field("micro_batch_s", sp.micro_batch_s).str();
}

std::string to_json(const Grid& g, const Batch& b, const Machine& mc, const StepPlan& s) {
  Json machine;
  machine.field("name", mc.name).field("memory_gib", mc.memory_gib);
  std::string stages = "[";
  for (const StagePlan& sp : s.stages) stages += (stages.size() > 1 ? "," : "") + stage_json(sp);
  Json step;  // seconds: step = compute + tp + pp + cp + ep + bubble + cores + dp exposed + embedding + optimizer
  step.field("step_s", s.step_s).field("pipeline_s", s.pipeline_s).field("compute_s", s.compute_s);
  step.field("tp_s", s.tp_s).field("pp_s", s.pp_s).field("cp_s", s.cp_s).field("ep_s", s.ep_s);
  step.field("bubble_s", s.bubble_s);
  step.field("cores_s", s.cores_s).field("dp_exposed_s", s.dp_exposed_s).field("embedding_s", s.embedding_s);
  step.field("optimizer_s", s.optimizer_s).field("mfu", s.mfu).field("hfu", s.hfu);
  step.field("tokens_per_s", s.tokens_per_s);
  Json j;
  j.raw("machine", machine.str()).field("world", g.world()).field("micro_batches", double(b.micro_batches));
  j.raw("stages", stages + "]").raw("step", step.str()).field("binds", s.binds);
  return j.field("schedule_svg", schedule_picture(g, b, s)).str();
}

}  // namespace

// report() as loom_plan calls it, renamed by the linker: --wrap=<report's
// mangled name> sends loom_plan's call here, and __real_<name> is the original.
#define LOOM_REPORT_SYMBOL "_ZN4loom4plan6reportERKNS0_10ModelShapeERKNS0_4GridERKNS0_5BatchERKNS0_7MachineERKNS0_8StepPlanEd"
std::string real_report(const ModelShape&, const Grid&, const Batch&, const Machine&, const StepPlan&, double)
    __asm__("__real_" LOOM_REPORT_SYMBOL);
std::string report_and_keep(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, const StepPlan& s,
                            double train_tokens) __asm__("__wrap_" LOOM_REPORT_SYMBOL);
std::string report_and_keep(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, const StepPlan& s,
                            double train_tokens) {
  plan_json = to_json(g, b, mc, s);
  return real_report(m, g, b, mc, s, train_tokens);
}

extern "C" const char* loom_plan_json(const char* args) {
  std::vector<std::string> words{"loom_plan"};
  std::istringstream in(args);
  for (std::string w; std::getline(in, w);) words.push_back(w);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  plan_json.clear();
  const int exit_code = loom_plan_main(int(words.size()), argv.data());
  std::cout.flush(), std::cerr.flush(), std::fflush(stdout), std::fflush(stderr);
  static std::string out;
  out = "{\"exit\":" + std::to_string(exit_code) + ",\"plan\":" + (plan_json.empty() ? "null" : plan_json) + "}";
  return out.c_str();
}
