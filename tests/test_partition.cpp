// Cutting the GPT's layer list into pipeline stages (parallel/pipeline_parallel/partition.h):
// uniform and balanced partitions on inputs whose answer is worked out by hand,
// the interleaved chunk layout, and the errors; the GPT's per-layer parameter
// counts that the balanced partition weighs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/model_chunks.h"

using namespace loom;
using namespace loom::parallel;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

using Ranges = std::vector<LayerRange>;

}  // namespace

TEST(PartitionUniform, EightLayersOverFourStagesGetTwoEach) {
  StagePartition p = partition_uniform(8, 4);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0], (Ranges{{0, 2}}));
  EXPECT_EQ(p[1], (Ranges{{2, 4}}));
  EXPECT_EQ(p[2], (Ranges{{4, 6}}));
  EXPECT_EQ(p[3], (Ranges{{6, 8}}));
}

TEST(PartitionUniform, ChunksAreDealtOutRoundRobin) {
  // 8 layers, pp 2, 2 chunks: parts [0,2) [2,4) [4,6) [6,8) are virtual stages 0..3;
  // virtual stage c × 2 + s is chunk c of stage s.
  StagePartition p = partition_uniform(8, 2, 2);
  EXPECT_EQ(p[0], (Ranges{{0, 2}, {4, 6}}));
  EXPECT_EQ(p[1], (Ranges{{2, 4}, {6, 8}}));
}

TEST(PartitionUniform, TheVGoesDownAndComesBackUp) {
  // 8 layers, pp 2 in a V: stage 0 holds parts 0 and 3 (both ends), stage 1 parts 1 and 2 (the turn).
  StagePartition p = partition_uniform(8, 2, 2, ChunkLayout::V);
  EXPECT_EQ(p[0], (Ranges{{0, 2}, {6, 8}}));
  EXPECT_EQ(p[1], (Ranges{{2, 4}, {4, 6}}));
  StagePartition q = partition_uniform(6, 3, 2, ChunkLayout::V);
  EXPECT_EQ(q[0], (Ranges{{0, 1}, {5, 6}}));
  EXPECT_EQ(q[2], (Ranges{{2, 3}, {3, 4}}));
  EXPECT_THAT([] { partition_uniform(9, 3, 3, ChunkLayout::V); },
              ThrowsMessage<Error>(HasSubstr("the V layout holds 2 chunks per stage, got 3")));
}

TEST(PartitionUniform, OneStageTakesEverything) { EXPECT_EQ(partition_uniform(6, 1)[0], (Ranges{{0, 6}})); }

TEST(PartitionUniform, FewerLayersThanStagesIsAnError) {
  EXPECT_THAT([] { partition_uniform(3, 4); },
              ThrowsMessage<Error>(AllOf(HasSubstr("partition_uniform: 3 layers cannot fill pp_size 4"),
                                         HasSubstr("= 4 stages"))));
  EXPECT_THAT([] { partition_uniform(7, 2, 4); }, ThrowsMessage<Error>(HasSubstr("7 layers cannot fill")));
}

TEST(PartitionUniform, TheRemainderGoesToTheFirstStages) {
  // The GPT of --layers 5 is 7 items (embedding, 5 blocks, head): pp 2 -> [4, 3].
  StagePartition p = partition_uniform(7, 2);
  EXPECT_EQ(p[0], (Ranges{{0, 4}}));
  EXPECT_EQ(p[1], (Ranges{{4, 7}}));
  // 6 over 4: two stages of 2, then two of 1.
  p = partition_uniform(6, 4);
  EXPECT_EQ(p[0], (Ranges{{0, 2}}));
  EXPECT_EQ(p[1], (Ranges{{2, 4}}));
  EXPECT_EQ(p[2], (Ranges{{4, 5}}));
  EXPECT_EQ(p[3], (Ranges{{5, 6}}));
  // With chunks the extra goes to the first virtual stages: 9 over pp 2 x v 2
  // is parts [0,3) [3,5) [5,7) [7,9), dealt out stage 0: {[0,3), [5,7)}, stage 1: {[3,5), [7,9)}.
  p = partition_uniform(9, 2, 2);
  EXPECT_EQ(p[0], (Ranges{{0, 3}, {5, 7}}));
  EXPECT_EQ(p[1], (Ranges{{3, 5}, {7, 9}}));
}

TEST(PartitionBalanced, EqualWeightsGiveTheUniformSplit) {
  EXPECT_EQ(balanced_boundaries(std::vector<int64_t>(8, 1), 4), (std::vector<int64_t>{0, 2, 4, 6, 8}));
}

TEST(PartitionBalanced, HeavyEndsAreBalancedAgainstLightMiddles) {
  // [10 1 1 | 1 1 10]: both halves weigh 12, the best possible.
  EXPECT_EQ(balanced_boundaries({10, 1, 1, 1, 1, 10}, 2), (std::vector<int64_t>{0, 3, 6}));
  // [5 1 | 1 1 1 1 1 1 | 1 5]: three parts of 6.
  EXPECT_EQ(balanced_boundaries({5, 1, 1, 1, 1, 1, 1, 1, 1, 5}, 3), (std::vector<int64_t>{0, 2, 8, 10}));
}

TEST(PartitionBalanced, EveryPartGetsALayerEvenWhenOneLayerDominates) {
  // The best maximum is 100 (the heavy layer alone); [1 1 1 1] would fit in one
  // part, but three parts are needed, so the tail is cut one layer per part.
  EXPECT_EQ(balanced_boundaries({1, 1, 1, 1, 100}, 3), (std::vector<int64_t>{0, 3, 4, 5}));
}

TEST(PartitionBalanced, GptByParameterCount) {
  // V 32, block 16, C 32, 5 blocks: embedding 1536, block 12704, head 1088.
  nn::GPTConfig cfg{32, 16, 5, 2, 32, 0.0, 1};
  std::vector<int64_t> w = gpt_layer_param_counts(cfg);
  ASSERT_EQ(w, (std::vector<int64_t>{1536, 12704, 12704, 12704, 12704, 12704, 1088}));
  // pp 2: prefix sums 1536 14240 26944 39648 ...; cutting after 3 layers gives
  // max(26944, 39200) = 39200, after 4 max(39648, 26496) = 39648: cut after 3.
  StagePartition p2 = partition_balanced(w, 2);
  EXPECT_EQ(p2[0], (Ranges{{0, 3}}));
  EXPECT_EQ(p2[1], (Ranges{{3, 7}}));
  // pp 4: five blocks in four parts put two blocks together (25408); the
  // embedding rides with one block: [e b] [b b] [b b] [h].
  StagePartition p4 = partition_balanced(w, 4);
  EXPECT_EQ(p4[0], (Ranges{{0, 2}}));
  EXPECT_EQ(p4[1], (Ranges{{2, 4}}));
  EXPECT_EQ(p4[2], (Ranges{{4, 6}}));
  EXPECT_EQ(p4[3], (Ranges{{6, 7}}));
}

TEST(PartitionBalanced, ChunksFollowTheVirtualStageOrder) {
  // Four parts: limit 11 still needs five ([10 1] [1 1 1] [10] [10] [10]), 12
  // gives [10 1 1] [1 1 10] [10] [10]; virtual stage c × 2 + s is chunk c of stage s.
  StagePartition p = partition_balanced({10, 1, 1, 1, 1, 10, 10, 10}, 2, 2);
  EXPECT_EQ(p[0], (Ranges{{0, 3}, {6, 7}}));
  EXPECT_EQ(p[1], (Ranges{{3, 6}, {7, 8}}));
}

TEST(PartitionBalanced, Errors) {
  EXPECT_THAT([] { partition_balanced({1, 1, 1}, 2, 2); },
              ThrowsMessage<Error>(HasSubstr("partition_balanced: 3 layers cannot fill pp_size 2 x num_chunks 2")));
  EXPECT_THAT([] { partition_balanced({1, -1, 1}, 2); },
              ThrowsMessage<Error>(HasSubstr("weight of layer 1 is negative (-1)")));
}
