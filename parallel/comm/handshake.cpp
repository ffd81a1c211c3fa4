#include "parallel/comm/handshake.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

#include <unistd.h>

#include "tensor/error.h"

namespace loom::parallel {

namespace {

// "name=value" records separated by '\n' (names and values may not hold '\n';
// they are escaped as "\\n" so a value can be anything).
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '=') out += "\\=";
    else if (c == '\\') out += "\\\\";
    else out += c;
  }
  return out;
}

std::string serialize(const RunFields& fields) {
  std::string s;
  for (const auto& [name, value] : fields) s += escape(name) + "=" + escape(value) + "\n";
  return s;
}

// Inverse of serialize: the escaped '=' and '\n' never split a record.
RunFields parse(const std::string& s) {
  RunFields out;
  std::string cur[2];
  int part = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\\' && i + 1 < s.size()) {
      char n = s[++i];
      cur[part] += n == 'n' ? '\n' : n;
    } else if (c == '=' && part == 0) {
      part = 1;
    } else if (c == '\n') {
      out.emplace_back(cur[0], cur[1]);
      cur[0].clear(), cur[1].clear(), part = 0;
    } else {
      cur[part] += c;
    }
  }
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// "ranks 0, 1 on h0; rank 2 on h1": where each rank of the group runs, so that a
// disagreement across machines names the machine to fix. A collective, called
// only when the (identical) gathered fields differ, so every rank calls it or none.
std::string rank_hosts(ProcessGroup& group) {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) std::snprintf(name, sizeof name, "(unknown)");
  std::vector<std::string> hosts = all_gather_strings(group, name);
  std::vector<std::pair<std::string, std::vector<int>>> by_host;  // in the order of each host's lowest rank
  for (size_t r = 0; r < hosts.size(); ++r) {
    auto same = std::find_if(by_host.begin(), by_host.end(), [&](const auto& e) { return e.first == hosts[r]; });
    if (same == by_host.end()) by_host.push_back({hosts[r], {int(r)}});
    else same->second.push_back(int(r));
  }
  std::string s;
  for (const auto& [host, ranks] : by_host) s += (s.empty() ? "" : "; ") + rank_list(ranks) + " on " + host;
  return s;
}

}  // namespace

// Lengths first (one int64 each), then the bytes padded to the longest, one
// int32 per byte (loom's dtypes have no byte type).
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine) {
  const int n = group.size();
  Tensor len = full({1}, double(mine.size()), kInt64);
  Tensor lens = zeros({n}, kInt64);
  group.all_gather(lens, len);
  std::vector<int64_t> l = lens.to_vector<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(l.begin(), l.end()));
  std::vector<int32_t> padded(size_t(longest), 0);
  for (size_t i = 0; i < mine.size(); ++i) padded[i] = int32_t(static_cast<unsigned char>(mine[i]));
  Tensor all = zeros({int64_t(n) * longest}, kInt32);
  group.all_gather(all, from_vector(padded));
  std::vector<int32_t> bytes = all.to_vector<int32_t>();
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < l[size_t(r)]; ++i) out[size_t(r)] += char(bytes[size_t(r * longest + i)]);
  return out;
}

void check_ranks_agree(ProcessGroup& group, const RunFields& fields, const std::string& what,
                       const std::string& hint) {
  if (group.size() == 1) return;
  std::vector<std::string> raw = all_gather_strings(group, serialize(fields));
  // field name -> value -> ranks; a rank that lacks a field holds "(missing)".
  std::vector<std::string> order;
  std::set<std::string> known;
  std::vector<std::map<std::string, std::string>> per_rank(raw.size());
  for (size_t r = 0; r < raw.size(); ++r)
    for (auto& [name, value] : parse(raw[r])) {
      if (known.insert(name).second) order.push_back(name);
      per_rank[r][name] = value;
    }
  std::string diffs;
  for (const std::string& name : order) {
    std::vector<std::pair<std::string, std::vector<int>>> values;  // in the order of the lowest rank holding each
    for (size_t r = 0; r < raw.size(); ++r) {
      auto it = per_rank[r].find(name);
      const std::string v = it == per_rank[r].end() ? "(missing)" : "'" + it->second + "'";
      auto same = std::find_if(values.begin(), values.end(), [&](const auto& e) { return e.first == v; });
      if (same == values.end()) values.push_back({v, {int(r)}});
      else same->second.push_back(int(r));
    }
    if (values.size() == 1) continue;
    diffs += "\n  " + name + ":";
    for (const auto& [value, ranks] : values) diffs += " " + value + " on " + rank_list(ranks) + ";";
    diffs.pop_back();
  }
  if (!diffs.empty()) diffs += "\n  hosts: " + rank_hosts(group);
  LOOM_CHECK(diffs.empty(), "ranks disagree on the ", what, " (group ", group.name(), ", size ", group.size(),
             "); ", hint, ":", diffs);
}

void Fingerprint::add(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;  // xor the byte in, times the FNV prime
}

std::string Fingerprint::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string fingerprint(const void* data, size_t bytes) {
  Fingerprint f;
  f.add(data, bytes);
  return f.hex();
}

}  // namespace loom::parallel
