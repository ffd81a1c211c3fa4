// Cutting a model's ordered list of layers into pipeline stages. The GPT is
// [embedding, block_0 .. block_{L-1}, head] (nn/gpt.h); a stage owns one or
// more contiguous [start, end) ranges of that list.
//
// Chunks (virtual stages, Megatron's interleaved schedule): with num_chunks = v
// the list is cut into pp_size × v consecutive parts, and part k goes to stage
// k % pp_size as its chunk k / pp_size, i.e. chunk c of stage s is virtual stage
// c × pp_size + s. With 8 layers, pp 2, v 2:
//   parts  [0,2) [2,4) [4,6) [6,8)
//   stage 0: {[0,2), [4,6)}     stage 1: {[2,4), [6,8)}
// so a micro-batch visits stage 0, 1, 0, 1. With v = 1 (the default) each stage
// gets one range, the plain GPipe / 1F1B layout.
//
// The V (ZB-V and DualPipeV, v = 2; PyTorch's generate_stage_to_rank_mapping
// style "v"): part k goes down the ranks and back up, stage s holding parts s
// and 2p - 1 - s. With 8 layers, pp 2:
//   stage 0: {[0,2), [6,8)}     stage 1: {[2,4), [4,6)}
// so a micro-batch visits stage 0, 1, 1, 0: the first and the last layer sit
// on stage 0, and the turn of the V (parts p - 1 and p) on stage p - 1, which
// hands its chunk 0's output to its chunk 1 without a transfer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::parallel {

struct LayerRange {
  int64_t start = 0, end = 0;  // [start, end)
  int64_t size() const { return end - start; }
  bool operator==(const LayerRange&) const = default;
};

// ranges[s][c]: the layers of stage s's chunk c.
using StagePartition = std::vector<std::vector<LayerRange>>;

// Which parts a stage's chunks are (see above).
enum class ChunkLayout { Interleaved, V };
// The layout a --schedule runs on: V for "zb-v" and "dualpipev", else Interleaved.
ChunkLayout schedule_chunk_layout(const std::string& schedule);
// Whether a --schedule splits each backward into B (input gradient) and W (weights'): the zero-bubble
// ones, "zb-h1", "zb-v" and "dualpipev".
bool schedule_splits_backward(const std::string& schedule);

// Equal parts by count: every virtual stage gets num_items / (pp_size × num_chunks)
// layers, and the first num_items % (pp_size × num_chunks) of them one more
// (7 layers, pp 2 -> [0,4) [4,7)). Errors: fewer items than virtual stages; a
// V of other than 2 chunks.
StagePartition partition_uniform(int64_t num_items, int pp_size, int num_chunks = 1,
                                 ChunkLayout layout = ChunkLayout::Interleaved);

// Parts of nearly equal weight (weights[i] = parameter count of layer i): the
// smallest possible maximum part weight, found by binary search (the approach
// of DeepSpeed's partition_balanced), every part non-empty. Errors: fewer items
// than virtual stages, or a negative weight; a V of other than 2 chunks.
StagePartition partition_balanced(const std::vector<int64_t>& weights, int pp_size, int num_chunks = 1,
                                  ChunkLayout layout = ChunkLayout::Interleaved);

// The contiguous cut of `weights` into exactly num_parts non-empty parts that
// minimises the largest part's weight: part boundaries [b_0 = 0, b_1, ..., b_k = n].
// Exposed for tests; partition_balanced deals its parts out to the stages.
std::vector<int64_t> balanced_boundaries(const std::vector<int64_t>& weights, int num_parts);

}  // namespace loom::parallel
