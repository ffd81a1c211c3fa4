#include "parallel/trace/transfer_log.h"

#include <cstdio>
#include <cstdlib>

#include "parallel/comm/distributed.h"
#include "parallel/trace/trace.h"

namespace loom::parallel {

TransferLog::TransferLog() {
  const char* v = std::getenv("LOOM_VERBOSE");
  verbose_ = v && *v && std::string(v) != "0";
}

TransferLog::Span TransferLog::open(const char* verb, int mb, int chunk) const {
  if (!trace::enabled()) return {};
  return {chunk < 0 ? str(verb, " mb", mb) : str(verb, " mb", mb, ".", chunk), trace::now_us()};
}

void TransferLog::close(const Span& span, int64_t bytes) const {
  if (!trace::enabled() || span.name.empty()) return;
  trace::record(str(span.name, " (", bytes / 1024, " KiB)"), span.start_us, trace::now_us(), trace::kComm);
}

void TransferLog::print(const char* verb, const char* arrow, int peer_stage, int mb, const Tensor& t) const {
  if (!verbose_) return;
  std::fprintf(stderr, "[rank %d] %s %s stage %d mb %d %s %s\n", world().rank(), verb, arrow, peer_stage, mb,
               shape_str(t.shape()).c_str(), dtype_name(t.dtype()));
}

}  // namespace loom::parallel
