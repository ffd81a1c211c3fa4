#include "parallel/pipeline_parallel/send_release.h"

#include <map>
#include <tuple>

namespace loom::parallel {

// Where op `kind` on chunk c of stage s sends its output (F: the activation, B: the input gradient).
Link sends_to(char kind, int s, int c, int p, ChunkLayout layout) {
  const bool v = layout == ChunkLayout::V;
  // W sends nothing; the V's turn (chunk 0's F, chunk 1's B on the last stage) is in memory.
  if (kind == 'W' || (v && s == p - 1 && (kind == 'F') == (c == 0))) return {};
  const int to = (kind == 'F') == (!v || c == 0) ? s + 1 : s - 1;  // F on chunk 0 and B on chunk 1 go down
  return to >= 0 && to < p ? Link{to, c} : Link{};
}

// Where op `kind` on chunk c of stage s receives its input from.
Link receives_from(char kind, int s, int c, int p, ChunkLayout layout) {
  const bool v = layout == ChunkLayout::V, from_above = (kind == 'F') == (!v || c == 0);  // from stage s - 1
  if (kind == 'W' || (v && !from_above && s == p - 1)) return {};  // the turn is in memory
  const int from = from_above ? s - 1 : s + 1;
  return from >= 0 && from < p ? Link{from, c} : Link{};
}

std::vector<int> send_release_points(const std::vector<std::vector<ScheduledOp>>& orders, int stage,
                                     ChunkLayout layout) {
  const int p = int(orders.size());
  LOOM_CHECK(stage >= 0 && stage < p, "send_release_points: stage ", stage, " of ", p);
  // (kind, mb, chunk) -> its position in the stage's order
  std::vector<std::map<std::tuple<char, int, int>, int>> index(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s)
    for (size_t i = 0; i < orders[size_t(s)].size(); ++i) {
      const ScheduledOp& o = orders[size_t(s)][i];
      index[size_t(s)][{o.kind, o.mb, o.chunk}] = int(i);
    }
  // heard[s][i][t]: the last op of rank t that op i of rank s has heard of when it starts (-1: none).
  std::vector<std::vector<std::vector<int>>> heard(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s)
      for (const std::vector<ScheduledOp>& order = orders[size_t(s)]; next[size_t(s)] < order.size();) {
        const ScheduledOp& o = order[next[size_t(s)]];
        std::vector<int> now = next[size_t(s)] == 0 ? std::vector<int>(size_t(p), -1) : heard[size_t(s)].back();
        if (const Link from = receives_from(o.kind, s, o.chunk, p, layout); from.stage >= 0) {
          const auto it = index[size_t(from.stage)].find({o.kind, o.mb, from.chunk});
          LOOM_CHECK(it != index[size_t(from.stage)].end(), "send_release_points: ", o.kind, o.mb, ".", o.chunk,
                     " on stage ", s, " receives from stage ", from.stage, ", whose order has no such op");
          if (size_t(it->second) >= next[size_t(from.stage)]) break;  // not sent yet: the next sweep
          const std::vector<int>& sent = heard[size_t(from.stage)][size_t(it->second)];
          for (int t = 0; t < p; ++t) now[size_t(t)] = std::max(now[size_t(t)], sent[size_t(t)]);
        }
        now[size_t(s)] = int(next[size_t(s)]++);
        heard[size_t(s)].push_back(std::move(now));
        progress = true;
      }
  }
  for (int s = 0; s < p; ++s)
    LOOM_CHECK(next[size_t(s)] == orders[size_t(s)].size(), "send_release_points: stage ", s,
               "'s order cannot run with the others (an op waits for one that never comes)");

  const std::vector<ScheduledOp>& mine = orders[size_t(stage)];
  std::vector<int> release(mine.size(), -1);
  for (size_t i = 0; i < mine.size(); ++i) {
    const Link to = sends_to(mine[i].kind, stage, mine[i].chunk, p, layout);
    if (to.stage < 0) continue;
    const auto it = index[size_t(to.stage)].find({mine[i].kind, mine[i].mb, to.chunk});
    LOOM_CHECK(it != index[size_t(to.stage)].end(), "send_release_points: no op on stage ", to.stage, " takes ",
               mine[i].kind, mine[i].mb, ".", mine[i].chunk, " of stage ", stage);
    size_t k = i + 1;
    while (k < mine.size() && heard[size_t(stage)][k][size_t(to.stage)] < it->second) ++k;
    release[i] = int(k);
  }
  return release;
}

}  // namespace loom::parallel
