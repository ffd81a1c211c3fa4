// From a pipeline's stages to one full model state, and back. A model cut into
// stages (parallel/model_chunks.h) is still one model: to save it, print a text
// sample from it or evaluate it in one process, its pieces are gathered into
// the state dict the whole GPT would have; to resume, each stage takes back
// its own entries from such a dict. Megatron saves one file per stage instead
// (mp_rank_XX_YYY); one full dict makes the checkpoint the same file whatever
// the pp size, readable by a single-process GPT (and by PyTorch).
//
//   stage 0  wte wpe blocks.0 blocks.1     ─┐
//   stage 1  blocks.2 blocks.3             ─┼─> pp rank 0: wte wpe blocks.0..3 ln_f
//   stage 2  blocks.4 ln_f wte (the copy)  ─┘   (the last stage's wte copy is left out)
#pragma once

#include "nn/module.h"
#include "parallel/comm/process_group.h"
#include "parallel/model_chunks.h"

namespace loom::parallel {

// Collective over pp_group (stage order: pp rank s holds stage s). state is
// what this stage contributes: stage.state_dict() by default, or under tensor
// parallelism the stage's shards already joined into full tensors (the
// caller's job: parallel/model.h). Returns on pp rank 0 the full GPT's state
// dict - the names and order of nn::GPT(cfg).named_parameters(), wte.weight
// once, the first stage's - as fresh copies owned by the caller, each in its
// parameter's dtype; on every other rank an empty list.
nn::NamedTensors gather_stage_states(ModelChunks& stage, ProcessGroup& pp_group, const nn::NamedTensors* state = nullptr);

// Copies into the stage the entries of a full-model state dict that belong to
// it, by name (the last stage's wte copy from wte.weight), dtype converted.
// Entries of other stages are ignored. Throws loom::Error naming every entry
// the stage needs and `full` lacks, or a mis-shaped one, before copying anything.
void load_stage_state(ModelChunks& stage, const nn::NamedTensors& full);

}  // namespace loom::parallel
