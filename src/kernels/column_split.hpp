// How a product's output columns are shared among the threads of one call (the linear driver's and the
// layers' that run several weights as one product).
#pragma once
#include <cstdint>
#include <functional>

namespace xmoe::kernels {

// body(u0, u1) over units [0, units) of an m-row product's output columns, whose weights take `bytes`, on
// `threads` threads (the calling thread alone when 1).
//
// Products of up to kDynamicRowsMax rows (decode) are bound by how fast each thread streams its share of the
// weights, and that rate varies from thread to thread and moment to moment (the page cache, the other thread,
// the hypervisor): with one equal share per thread, one thread waited 1.5–3 ms of lm_head's 21–23 ms at batch
// 1 on Sapphire Rapids. They are cut into chunks (at least one per thread, at most kChunksPerThread, each at
// least kChunkBytes of weights, since a chunk copies its x rows and starts its weight stream cold) handed out
// in order as threads free up. The least size does not grow with the rows: a chunk's x copy and its compute
// both grow with them. (It was kChunkBytes per x row, so 16 rows cut q_proj's 16 MiB into only 4 chunks, and
// at batch 16 the two threads waited 8-9 ms a decode step in the attention projections.) Bigger products
// (prefill) copy their x rows once per call and take one equal share per thread. Which thread computes a
// column never changes its bits. The first exception thrown by a body is rethrown after the team joins.
constexpr int64_t kDynamicRowsMax = 16;
constexpr int64_t kChunkBytes = int64_t(256) << 10;
constexpr int64_t kChunksPerThread = 8;
void split_columns(int threads, int64_t m, int64_t units, int64_t bytes,
                   const std::function<void(int64_t, int64_t)>& body);

}  // namespace xmoe::kernels
