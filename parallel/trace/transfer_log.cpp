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

TransferLog::Watch::Watch(std::string name, int64_t bytes) : bytes(bytes) {
  if (!trace::enabled()) return;
  name_ = std::move(name);
  start_us_ = trace::now_us();
}

TransferLog::Watch& TransferLog::Watch::operator=(Watch&& o) noexcept {
  done();
  bytes = o.bytes, name_ = std::move(o.name_), start_us_ = o.start_us_;
  o.start_us_ = -1;
  return *this;
}

void TransferLog::Watch::done() {
  if (start_us_ >= 0) trace::record(str(name_, " (", bytes / 1024, " KiB)"), start_us_, trace::now_us(), trace::kComm);
  start_us_ = -1;
}

namespace {
std::string transfer_name(const char* verb, int mb, int chunk) {
  return chunk < 0 ? str(verb, " mb", mb) : str(verb, " mb", mb, ".", chunk);
}
}  // namespace

TransferLog::Watch TransferLog::sent(const char* verb, int peer_stage, int mb, int chunk, const Tensor& payload) const {
  print(verb, "->", peer_stage, mb, payload);
  return Watch(transfer_name(verb, mb, chunk), int64_t(payload.nbytes()));
}

TransferLog::Watch TransferLog::receiving(const char* verb, int mb, int chunk) const {
  return Watch(transfer_name(verb, mb, chunk), 0);
}

void TransferLog::received(Watch& w, const char* verb, int peer_stage, int mb, const Tensor& t) const {
  print(verb, "<-", peer_stage, mb, t);
  w.bytes = int64_t(t.nbytes());
  w.done();
}

void TransferLog::print(const char* verb, const char* arrow, int peer_stage, int mb, const Tensor& t) const {
  if (!verbose_) return;
  std::fprintf(stderr, "[rank %d] %s %s stage %d mb %d %s %s\n", world().rank(), verb, arrow, peer_stage, mb,
               shape_str(t.shape()).c_str(), dtype_name(t.dtype()));
}

}  // namespace loom::parallel
