#include "parallel/teach/teach_break.h"

#include "tensor/error.h"

namespace loom::teach {

namespace {

Break g_break = Break::None;

const char* kNames[] = {"none", "dp-allreduce-param", "dp-divide-twice", "skip-tied-sync", "found-inf-wrong-group",
                         "recompute-fresh-dropout",
                         "zero3-free-before-backward", "ring-no-max-correction", "tp-kv-rows-of-rank-0",
                         "zb-sync-at-b", "moe-aux-unscaled"};

}  // namespace

Break parse_break(const std::string& name) {
  for (int i = 0; i < int(sizeof kNames / sizeof kNames[0]); ++i)
    if (name == kNames[i]) return Break(i);
  std::string all;
  for (const char* n : kNames) all += str(all.empty() ? "" : ", ", n);
  throw Error(str("--teach-break: unknown bug '", name, "'; one of: ", all));
}

const char* break_name(Break b) { return kNames[int(b)]; }

void set_break(Break b) { g_break = b; }

bool broken(Break b) { return b != Break::None && g_break == b; }

}  // namespace loom::teach
