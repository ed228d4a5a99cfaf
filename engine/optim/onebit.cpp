// onebit.cpp: 1-bit Adam's compressed momentum all-reduce (onebit.h has the layout and the two phases).
#include "engine/optim/onebit.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "engine/core/check.h"

namespace ms {

namespace {

int32_t* as_words(uint32_t* p) { return reinterpret_cast<int32_t*>(p); }

}  // namespace

int64_t OneBitLayout::served_elements(int server) const {
    const size_t s = static_cast<size_t>(server);
    if (first_chunk[s] == first_chunk[s + 1]) return 0;
    const OneBitChunk& first = chunks[static_cast<size_t>(first_chunk[s])];
    const OneBitChunk& last = chunks[static_cast<size_t>(first_chunk[s + 1] - 1)];
    return last.error_offset + last.elems - first.error_offset;
}

int64_t OneBitLayout::wire_bytes() const {
    if (dp == 1) return 0;
    return static_cast<int64_t>(sizeof(uint32_t)) * (dp + 1) * block_words;
}

double OneBitLayout::ideal_wire_bytes(int server) const {
    if (dp == 1) return 0;
    const size_t s = static_cast<size_t>(server);
    const double served_chunks = static_cast<double>(first_chunk[s + 1] - first_chunk[s]);
    const double phase1 = static_cast<double>(elements) / 8 + 4.0 * static_cast<double>(chunks.size());
    const double phase2 = static_cast<double>(served_elements(server)) / 8 + 4.0 * served_chunks;
    return phase1 + phase2;
}

OneBitLayout onebit_layout(const std::vector<ParamInfo>& table, int64_t padded, int64_t chunk_elems, int dp) {
    MS_CHECK(chunk_elems > 0, "1-bit Adam: chunk_elems must be positive, got {}", chunk_elems);
    MS_CHECK(dp >= 1, "1-bit Adam: the data-parallel size must be at least 1, got {}", dp);
    OneBitLayout l;
    l.dp = dp;
    for (size_t p = 0; p < table.size(); ++p) {
        const ParamInfo& info = table[p];
        MS_CHECK(info.offset >= 0 && info.numel >= 0 && info.offset + info.numel <= padded,
                 "1-bit Adam: parameter '{}' [{}, {}) lies outside the flat buffer of {} elements", info.name,
                 info.offset, info.offset + info.numel, padded);
        for (int64_t begin = 0; begin < info.numel; begin += chunk_elems) {
            OneBitChunk c;
            c.param = static_cast<int>(p);
            c.param_offset = begin;
            c.flat_offset = info.offset + begin;
            c.elems = std::min(chunk_elems, info.numel - begin);
            c.error_offset = l.elements;
            l.elements += c.elems;
            l.chunks.push_back(c);
        }
    }
    // A chunk goes to the server whose 1/dp of the elements holds its midpoint: contiguous runs, non-decreasing in
    // the chunk index, each within one chunk of elements / dp.
    for (OneBitChunk& c : l.chunks) {
        const int64_t mid2 = 2 * c.error_offset + c.elems;  // twice the midpoint
        c.server = static_cast<int>(std::min<int64_t>(dp - 1, mid2 * dp / (2 * l.elements)));
    }
    l.first_chunk.resize(static_cast<size_t>(dp) + 1);
    for (int s = 0; s <= dp; ++s) {
        const auto first =
            std::partition_point(l.chunks.begin(), l.chunks.end(), [s](const OneBitChunk& c) { return c.server < s; });
        l.first_chunk[static_cast<size_t>(s)] = first - l.chunks.begin();
    }
    for (int s = 0; s < dp; ++s) {
        const int64_t first = l.first_chunk[static_cast<size_t>(s)], end = l.first_chunk[static_cast<size_t>(s) + 1];
        int64_t words = end - first;  // the scales come first
        for (int64_t i = first; i < end; ++i) {
            OneBitChunk& c = l.chunks[static_cast<size_t>(i)];
            c.scale_word = i - first;
            c.sign_word = words;
            words += sign_words(c.elems);
        }
        l.block_words = std::max(l.block_words, words);
    }
    return l;
}

std::vector<OneBitBuffer> onebit_buffers(const OneBitLayout& layout) {
    const bool on = layout.dp > 1;
    // server_error holds the largest server's share on every rank, so that every rank of a stage allocates the same
    // (the memory plan is per stage): at most one chunk more than a rank's own share
    int64_t served = 0;
    for (int s = 0; s < layout.dp; ++s) served = std::max(served, layout.served_elements(s));
    const size_t staging = on ? static_cast<size_t>(layout.dp * layout.block_words) * sizeof(uint32_t) : 0;
    return {
        {on ? static_cast<size_t>(layout.elements) * sizeof(float) : 0, MemCategory::kOptimizer, "onebit_worker_error"},
        {on ? static_cast<size_t>(served) * sizeof(float) : 0, MemCategory::kOptimizer, "onebit_server_error"},
        {staging, MemCategory::kComm, "onebit_send"},
        {staging, MemCategory::kComm, "onebit_recv"},
    };
}

std::vector<size_t> onebit_allocation_sizes(const std::vector<ParamInfo>& table, int64_t padded, int64_t chunk_elems,
                                            int dp_size) {
    std::vector<size_t> sizes;
    for (const OneBitBuffer& b : onebit_buffers(onebit_layout(table, padded, chunk_elems, dp_size)))
        if (b.bytes > 0) sizes.push_back(b.bytes);
    return sizes;
}

float compress_chunk(std::span<float> y, uint32_t* bits) {
    const size_t k = y.size();
    if (k == 0) return 0.0f;
    double squares = 0;
    for (float v : y) squares += static_cast<double>(v) * static_cast<double>(v);
    const float scale = static_cast<float>(std::sqrt(squares) / std::sqrt(static_cast<double>(k)));
    for (size_t w = 0; w * 32 < k; ++w) {
        uint32_t word = 0;
        const size_t end = std::min(k, w * 32 + 32);
        for (size_t i = w * 32; i < end; ++i) {
            const bool positive = y[i] >= 0.0f;
            word |= static_cast<uint32_t>(positive) << (i - w * 32);
            y[i] -= positive ? scale : -scale;
        }
        bits[w] = word;
    }
    return scale;
}

void decompress_chunk(float scale, const uint32_t* bits, std::span<float> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = (bits[i / 32] >> (i % 32)) & 1u ? scale : -scale;
}

OneBitAllReduce::OneBitAllReduce(const std::vector<ParamInfo>& table, int64_t padded, int64_t chunk_elems,
                                 Communicator& dp, Arena* arena)
    : layout_(onebit_layout(table, padded, chunk_elems, dp.size())), dp_(dp), rank_(dp.rank()) {
    const std::vector<OneBitBuffer> b = onebit_buffers(layout_);
    worker_error_ = MemoryBlock(b[0].bytes, arena, b[0].category, b[0].name);
    server_error_ = MemoryBlock(b[1].bytes, arena, b[1].category, b[1].name);
    send_ = MemoryBlock(b[2].bytes, arena, b[2].category, b[2].name);
    recv_ = MemoryBlock(b[3].bytes, arena, b[3].category, b[3].name);
}

std::span<float> OneBitAllReduce::worker_error() const {
    return {worker_error_.as<float>(), worker_error_.size() / sizeof(float)};
}

std::span<float> OneBitAllReduce::server_error() const {
    return {server_error_.as<float>(), static_cast<size_t>(layout_.dp > 1 ? layout_.served_elements(rank_) : 0)};
}

std::span<const OneBitChunk> OneBitAllReduce::served_chunks() const {
    if (layout_.dp == 1) return {};
    const size_t s = static_cast<size_t>(rank_);
    return std::span<const OneBitChunk>(layout_.chunks)
        .subspan(static_cast<size_t>(layout_.first_chunk[s]),
                 static_cast<size_t>(layout_.first_chunk[s + 1] - layout_.first_chunk[s]));
}

void OneBitAllReduce::run(float* m) {
    const int dp = layout_.dp;
    if (dp == 1) return;
    const size_t B = static_cast<size_t>(layout_.block_words), all = static_cast<size_t>(dp) * B;
    uint32_t* send = send_.as<uint32_t>();
    uint32_t* recv = recv_.as<uint32_t>();

    // Phase 1 (worker): y = m + error, compressed into server c.server's block; the residual stays in error.
    float* worker_error = worker_error_.as<float>();
    for (const OneBitChunk& c : layout_.chunks) {
        float* y = worker_error + c.error_offset;
        const float* mc = m + c.flat_offset;
        for (int64_t i = 0; i < c.elems; ++i) y[i] += mc[i];
        uint32_t* block = send + static_cast<size_t>(c.server) * B;
        block[c.scale_word] =
            std::bit_cast<uint32_t>(compress_chunk({y, static_cast<size_t>(c.elems)}, block + c.sign_word));
    }
    dp_.all_to_all(std::span<const int32_t>(as_words(send), all), std::span<int32_t>(as_words(recv), all),
                   Priority::kLow)
        .wait();

    // Phase 2 (server): the workers' decompressed chunks summed in rank order into m (free since phase 1), averaged,
    // plus the server's residual, compressed into the first block of send.
    const std::span<const OneBitChunk> served = served_chunks();
    float* server_error = server_error_.as<float>();
    int64_t served_words = 0;
    const float divisor = static_cast<float>(dp);
    for (const OneBitChunk& c : served) {
        float* acc = m + c.flat_offset;
        for (int r = 0; r < dp; ++r) {
            const uint32_t* block = recv + static_cast<size_t>(r) * B;
            const float scale = std::bit_cast<float>(block[c.scale_word]);
            const uint32_t* bits = block + c.sign_word;
            for (int64_t i = 0; i < c.elems; ++i) {
                const float v = (bits[i / 32] >> (i % 32)) & 1u ? scale : -scale;
                acc[i] = r == 0 ? v : acc[i] + v;
            }
        }
        float* z = server_error + (c.error_offset - served.front().error_offset);
        for (int64_t i = 0; i < c.elems; ++i) z[i] = acc[i] / divisor + z[i];
        send[c.scale_word] =
            std::bit_cast<uint32_t>(compress_chunk({z, static_cast<size_t>(c.elems)}, send + c.sign_word));
        served_words = c.sign_word + sign_words(c.elems);
    }
    std::fill(send + served_words, send + B, 0u);  // phase 1's bytes past this server's block
    dp_.all_gather(std::span<const int32_t>(as_words(send), B), std::span<int32_t>(as_words(recv), all), Priority::kLow)
        .wait();

    // Every rank: every server's chunks decompressed into m.
    for (const OneBitChunk& c : layout_.chunks) {
        const uint32_t* block = recv + static_cast<size_t>(c.server) * B;
        decompress_chunk(std::bit_cast<float>(block[c.scale_word]), block + c.sign_word,
                         {m + c.flat_offset, static_cast<size_t>(c.elems)});
    }
}

}  // namespace ms
