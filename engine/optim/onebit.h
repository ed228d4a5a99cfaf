// onebit.h: the compressed momentum all-reduce of 1-bit Adam (Tang et al. 2021; DeepSpeed's OnebitAdam), with
// error feedback on the workers and on the servers. The optimizer calls run() once per step after its warm-up.
//
// Chunks (canonical, so that a pipeline layout does not change them): each parameter of the table is cut into
// consecutive pieces of at most chunk_elems elements, piece j = its elements [j * chunk_elems, ...). The padding of
// the flat buffer between and after parameters belongs to no chunk: run() neither reads nor writes it. Chunks are
// numbered in table order, and the chunks are assigned to the dp ranks (the servers) as contiguous runs balanced by
// element count; this partition has nothing to do with ZeRO-1's shards.
//
// Compression of one chunk y of k elements (compress_chunk): scale = ||y||_2 / sqrt(k), the sum of squares taken in
// double, element by element in order; a sign bit per element (1: y >= 0, so sign(0) = +1; 0: y < 0); y is replaced
// by its residual y - scale * sign(y) in fp32. Every result of a chunk depends only on that chunk's elements, so a
// table holding a subset of the parameters (a pipeline stage) gives the same bits for each of them.
//
// run(m), on every dp rank (worker w, server s):
//   phase 1  worker_error += m (y = m + error); compress every chunk in place (worker_error becomes the residual);
//            all_to_all of the packed blocks: server s receives from every worker the scales and bits of its chunks
//   phase 2  for each served element: z = (sum over workers r in rank order of scale_r * sign_r) / dp + server_error
//            (the sum in fp32, into m, which phase 1 no longer needs); compress z in place into server_error;
//            all_gather of the servers' blocks; every rank decompresses every chunk into m.
// So m ends identical on every dp rank. dp == 1 is an exact no-op: run() leaves m as it is, and nothing is allocated.
//
// Wire format: one block of block_words uint32 words per server, the same size for every server (all_to_all and
// all_gather move equal blocks): the block's chunk scales (fp32 bits, one word each, in chunk order), then each
// chunk's sign bits from a word boundary (element i of a chunk: word i / 32, bit i % 32; unused high bits 0), then
// zeros up to block_words. Collectives go out as int32 (the typed collectives' integer type) at Priority::kLow.
//
// Buffers, allocated once, in this order (onebit_buffers; a zero-sized one is not allocated):
//   worker_error  (chunk elements) fp32   kOptimizer  every chunk, packed in chunk order
//   server_error  (served elements) fp32  kOptimizer  this rank's served chunks, packed in chunk order (room for
//                                                     the largest server's, so every rank allocates the same)
//   send          (dp * block_words)      kComm       phase 1's blocks by server; phase 2's block in its first one
//   recv          (dp * block_words)      kComm       phase 1's blocks by worker; then phase 2's blocks by server
// A run allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "engine/model/gpt.h"
#include "memory/arena.h"
#include "memory/memory_block.h"

namespace ms {

// One chunk: elements [param_offset, param_offset + elems) of parameter `param`.
struct OneBitChunk {
    int param = 0;             // index in the table
    int64_t param_offset = 0;  // first element within the parameter: j * chunk_elems
    int64_t flat_offset = 0;   // first element in the flat buffer
    int64_t elems = 0;         // k: 1 .. chunk_elems
    int64_t error_offset = 0;  // first element in worker_error: the elements of the chunks before it
    int server = 0;            // the dp rank that serves it
    int64_t scale_word = 0;    // its scale's word in its server's block
    int64_t sign_word = 0;     // its first sign word in its server's block
};

// The chunks and the wire layout of one (table, chunk_elems, dp size): the same on every rank of a dp group.
struct OneBitLayout {
    std::vector<OneBitChunk> chunks;   // in table order, then piece order
    std::vector<int64_t> first_chunk;  // (dp + 1): server s serves chunks [first_chunk[s], first_chunk[s + 1])
    int64_t elements = 0;              // over every chunk
    int64_t block_words = 0;           // the largest server's block: scales + sign words
    int dp = 1;

    int64_t served_elements(int server) const;
    // Bytes a rank sends per run(), as the communicator counts them (an all_to_all counts its whole input, the
    // block to itself included; an all_gather its own block): 4 * (dp + 1) * block_words; 0 with dp == 1.
    int64_t wire_bytes() const;
    // The same without block padding and with sign bits packed across chunks: 1 bit per element and 4 bytes per
    // scale, for every chunk (phase 1) and for `server`'s chunks (phase 2); 0 with dp == 1.
    double ideal_wire_bytes(int server) const;
};

// padded: the flat buffer's length; every parameter must lie inside it.
OneBitLayout onebit_layout(const std::vector<ParamInfo>& table, int64_t padded, int64_t chunk_elems, int dp);

struct OneBitBuffer {
    size_t bytes = 0;
    MemCategory category = MemCategory::kOptimizer;
    const char* name = "";
};
// worker_error, server_error (the largest server's share: the same on every rank), send, recv (sizes in bytes, 0 for
// each with dp == 1), in allocation order.
std::vector<OneBitBuffer> onebit_buffers(const OneBitLayout& layout);
// The sizes of the allocations OneBitAllReduce makes, in its order: onebit_buffers' nonzero sizes.
std::vector<size_t> onebit_allocation_sizes(const std::vector<ParamInfo>& table, int64_t padded, int64_t chunk_elems,
                                            int dp_size);

// 32-bit words holding the sign bits of k elements.
inline int64_t sign_words(int64_t k) { return (k + 31) / 32; }
// Compresses y (k elements) in place: returns its scale, writes sign_words(k) words of bits (unused bits 0) and
// leaves the residual y - scale * sign(y) in y.
float compress_chunk(std::span<float> y, uint32_t* bits);
// out[i] = bit i ? scale : -scale.
void decompress_chunk(float scale, const uint32_t* bits, std::span<float> out);

class OneBitAllReduce {
  public:
    // dp: the data-parallel group; arena: where the buffers come from (nullptr: host buffers).
    OneBitAllReduce(const std::vector<ParamInfo>& table, int64_t padded, int64_t chunk_elems, Communicator& dp,
                    Arena* arena = nullptr);
    OneBitAllReduce(const OneBitAllReduce&) = delete;
    OneBitAllReduce& operator=(const OneBitAllReduce&) = delete;

    // m: the flat momentum buffer (padded elements). Afterwards every chunk element of m holds the compressed
    // average, the same on every dp rank; the padding is untouched. Blocks until both phases are complete.
    void run(float* m);

    const OneBitLayout& layout() const { return layout_; }
    // Every chunk's residual (layout().chunks[c].error_offset), and this rank's served chunks' residuals
    // (served_chunks(), packed in order). Empty with dp == 1.
    std::span<float> worker_error() const;
    std::span<float> server_error() const;
    std::span<const OneBitChunk> served_chunks() const;
    int64_t wire_bytes() const { return layout_.wire_bytes(); }
    double ideal_wire_bytes() const { return layout_.ideal_wire_bytes(rank_); }

  private:
    OneBitLayout layout_;
    Communicator& dp_;
    int rank_ = 0;
    MemoryBlock worker_error_;  // (elements) fp32
    MemoryBlock server_error_;  // (served elements) fp32
    MemoryBlock send_;          // (dp * block_words) uint32
    MemoryBlock recv_;          // (dp * block_words) uint32
};

}  // namespace ms
