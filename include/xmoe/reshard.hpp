// Resharding expert-parallel MoE checkpoints saved per rank as safetensors (Tutel's tutel.checkpoint gather
// and scatter).
//
// Convention for a checkpoint of N ranks holding E global experts:
//  - every rank's file carries the string metadata `_num_global_experts` = E, `_world_size` = N and
//    `_rank` = r. Writers here always add them; readers tolerate `_world_size`/`_rank` being absent (the rank
//    is then the file's position in the list) and, where `_num_global_experts` is absent, infer E as
//    N × (local expert count), i.e. assume the E % N == 0 layout.
//  - Expert tensors are those named "experts.*" (or "*.experts.*", as Tutel matches them); every other
//    tensor is shared and identical on every rank.
//  - E % N == 0: rank r's expert tensor is [E/N, ...], global experts [r·E/N, (r+1)·E/N).
//  - N % E == 0, d = N / E: rank r's expert tensor is [1, ...] holding flat chunk r % d of expert r / d
//    (Tutel: "split contiguously into N equal pieces; every non-1 dim must be divisible by d"). The per-rank
//    shape is the expert's shape with its FIRST non-1 dim after dim 0 divided by d, e.g. fc1_w [1, H, M] →
//    [1, H/d, M], fc1_bias [1, H] → [1, H/d]. A C-order array split along its first non-1 dim is exactly a
//    flat contiguous split, so this equals Tutel's flat chunking.
//    Because that shape alone cannot always be inverted (a shard [1, 1, M] comes from [1, d, M] or from
//    [1, 1, d·M]), scatter also records each expert tensor's per-expert shape (dims after dim 0) in metadata
//    `_expert_shape.<tensor>` = "[H, M]". Gather uses it when present; otherwise it multiplies the shard's
//    first non-1 dim after dim 0 by d (the last dim if all are 1) — the element count is right either way.
//
//    A tensor whose shards split a later dim (xmoe's SwiGLU down_proj [E, M, H] is split along its hidden dim
//    H, not M) says so in metadata `_expert_split_dim.<tensor>` = "2" (dims counted from the expert dim 0);
//    the layer's save() writes it for every built-in expert tensor, gather and scatter carry it along and
//    split / merge along that dim (only that dim then needs to be divisible by d).
//
// Without `_expert_split_dim`, a rank's bytes are piece r of the global tensor's bytes split into N equal
// contiguous pieces; with it, piece r is strided. Resharding works on raw bytes and handles every safetensors
// dtype (F32, BF16, F8_*, U8, ...).
// Errors are xmoe::Error naming the file, rank and tensor.
#pragma once
#include <string>
#include <vector>

namespace xmoe {

inline constexpr const char* kMetaNumGlobalExperts = "_num_global_experts";
inline constexpr const char* kMetaWorldSize = "_world_size";
inline constexpr const char* kMetaRank = "_rank";
inline constexpr const char* kMetaExpertShapePrefix = "_expert_shape.";
inline constexpr const char* kMetaExpertSplitDimPrefix = "_expert_split_dim.";

// True for "experts.*" and "*.experts.*".
bool is_expert_tensor_name(const std::string& name);

// Tutel's apply_rank_size_from_pattern: replaces every "{rank}" and "{size}". A pattern without "{rank}" is
// an error when size > 1 (every rank would use the same file).
std::string expand_rank_pattern(const std::string& pattern, int rank, int size);

// Merges the per-rank files (inputs[r] is rank r) into one checkpoint with [E, ...] expert tensors, written
// as a 1-rank checkpoint (metadata `_world_size` 1, `_rank` 0). Checks that every rank has the same tensor
// names and dtypes, consistent shapes and E, and identical shared tensors (Tutel takes the last rank's).
// Other string metadata is taken from the last rank.
void reshard_gather(const std::vector<std::string>& inputs, const std::string& output);

// Splits a merged checkpoint into output_size rank files named by expand_rank_pattern(output_pattern, r, N),
// for E % N == 0 or N % E == 0. Other string metadata is kept; parent directories are created.
void reshard_scatter(const std::string& input, int output_size, const std::string& output_pattern);

}  // namespace xmoe
