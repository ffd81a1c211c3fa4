#include "train/progress.h"

#include <cmath>
#include <cstdio>

namespace loom::train {

std::string format_duration(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  return buf;
}

// A JSON number, or null for inf/nan (which JSON cannot write: "-nan" would make the line invalid).
static std::string number(double x, const char* fmt) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

std::string json_line(const StepReport& r) {
  std::string out = "{\"step\": " + std::to_string(r.step) + ", \"loss\": " + number(r.loss, "%.17g") +
                    ", \"lr\": " + number(r.lr, "%.17g") + ", \"tokens_per_s\": " + number(r.tokens_per_s, "%.1f") +
                    ", \"ms\": " + number(r.ms, "%.3f") + ", \"grad_norm\": " + number(r.grad_norm, "%.9g") +
                    ", \"loss_scale\": " + number(r.loss_scale, "%.17g") +
                    ", \"skipped\": " + (r.skipped ? "true" : "false") +
                    ", \"live_mib\": " + number(r.live_mib, "%.3f") + ", \"peak_mib\": " + number(r.peak_mib, "%.3f");
  if (r.moe)
    out += ", \"moe_balance\": " + number(r.moe_balance, "%.9g") + ", \"moe_dropped\": " +
           number(r.moe_dropped, "%.9g") + ", \"moe_max_load\": " + number(r.moe_max_load, "%.9g");
  if (r.evaluated) out += ", \"val_loss\": " + (std::isfinite(r.val_loss) ? std::to_string(r.val_loss) : "null");
  return out + "}\n";
}

void print_progress(const StepReport& r, bool tty) {
  char skipped[96] = "";
  if (r.skipped)
    std::snprintf(skipped, sizeof skipped, " | overflow: step skipped, loss scale -> %.17g", r.next_loss_scale);
  // A terminal gets one line rewritten in place (\r); logs get whole lines.
  char moe[96] = "";
  if (r.moe)
    std::snprintf(moe, sizeof moe, " | balance %.3f, max load %.2f, dropped %.1f%%", r.moe_balance, r.moe_max_load,
                  100 * r.moe_dropped);
  std::printf("%sstep %5lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | ETA %s%s%s", tty ? "\r" : "",
              (long long)r.step + 1, (long long)r.steps, r.loss, r.lr, r.tokens_per_s,
              format_duration(r.eta_s).c_str(), moe, skipped);
  if (tty) {
    std::printf("   ");
    if (r.evaluated || r.skipped) std::printf("\n");
    if (r.evaluated) std::printf("  val loss %.4f\n", r.val_loss);
  } else {
    if (r.evaluated) std::printf(" | val loss %s", std::to_string(r.val_loss).c_str());
    std::printf("\n");
  }
  std::fflush(stdout);
}

}  // namespace loom::train
