/*
bench/gpu/attention_wmma.cu: the former tensor-core attention (nvcuda::wmma, m16n16k16), kept as the alternative
gpu_kernel_bench measures next to the shipped mma.sync kernels of engine/backends/cuda/kernels/attention_tc.cu.
nvcc only: listed with the kernels of ms_cuda_kernels (engine/backends/cuda/CMakeLists.txt, for their nvcc flags),
where only gpu_kernel_bench references it; not dispatched by the backend and not run on the CPU emulation.
Same spec, layouts and precision as attention_tc.cu (attention.cu is the spec); what differs is how the scores
reach the softmax. Header of the version as shipped until it was replaced:

Causal multi-head self-attention on tensor cores (nvcuda::wmma, m16n16k16) for bf16 / fp16 activations, forward and
backward, flash-attention 2 style. The spec is attention.cu (its layouts, equations and accumulation contract hold
here unchanged); it takes what attention_tc_eligible() (attention_tc.cuh) admits.
Layout: qkv/dqkv (B, T, 3*C), out/dout (B, T, C), head-major; lse (B, NH, T) fp32; HS in {16, 32, 48, 64}.

Precision: every matrix product runs on the tensor cores with S (bf16 / fp16) operands and fp32 accumulators:
  S = Q K^T, dP = dO V^T     operands Q, K, V, dO as stored;
  O += P V, dV += P^T dO     P rounded to S first (as FlashAttention does);
  dQ += dS K, dK += dS^T Q   dS rounded to S first.
Scale, causal mask, online softmax (running max m and sum l per row), exp, D = rowsum(dO * O) and dS = P (dP - D) are
fp32, done by ordinary threads on the fp32 score tile the mma stored to shared memory: fragment elements are never
indexed (their mapping is unspecified), so everything per row goes through shared memory. l sums the fp32 P (so lse
is as exact as the fp32 kernels'), V is weighted by P rounded. out and dqkv are rounded once, on store.

Tiles: a block of kWarps = 4 warps owns kBr = 64 rows (16 per warp) and walks kBc = 64-row tiles of the other side;
K/V (forward, dQ) or Q/dO (dK/dV) tiles are staged in shared memory with 16-byte loads, rows past T zero-filled.
  forward  (query tile): Q held as matrix_a fragments; per key tile each warp computes its (16, 64) scores into its
           fp32 tile, the softmax rescales its (16, HS) fp32 O in shared memory by exp(m_old - m_new) and writes P,
           then O is loaded as an accumulator, += P V, stored back. O / l and lse = m + log l at the end.
  dQ       (query tile): Q, dO as fragments, dQ in accumulator fragments (no rescaling in the backward);
           per key tile: S -> P = exp(S * scale - lse) (kept in registers), dP -> dS -> dQ += dS K.
  dK/dV    (key tile): K, V as fragments, dK, dV in accumulators; per query tile from the diagonal on, the
           transposed products S^T = K Q^T and dP^T = V dO^T, so each warp's P^T / dS^T rows are its own keys
           and dV += P^T dO, dK += dS^T Q need nothing from other warps.
dQ and dK/dV are separate kernels that both recompute P: no atomics, every run gives the same bits.
Query tiles run longest first (blockIdx.x reversed) so the causal triangle's long rows do not finish last.
16-row mma subtiles a warp's causal mask hides entirely are skipped.
Shared memory (bytes, HS = 64): forward 62464, dQ 45056, dK/dV 54784, dynamic (opted in past 48 KiB with
cudaFuncSetAttribute). Row strides are padded (+8 elements for S tiles, +4 floats for fp32 tiles) against bank
conflicts and keep every fragment pointer 256-bit aligned, as mma.h requires.
Status: was correct on the CPU emulation (tests/ops/test_cuda_emu_attention_tc.cpp, before the mma.sync rewrite);
not measured on a GPU. Its successor keeps S, P and O in registers, which wmma's unspecified fragment mapping
forbids.
*/
#include "bench/gpu/attention_wmma.h"
#include "engine/backends/cuda/kernels/attention_tc.cuh"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#define MS_TC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#define MS_UNROLL _Pragma("unroll")
#else
#define MS_UNROLL
#define MS_TC_SHARED(name) unsigned char* name = static_cast<unsigned char*>(::ms::cuda_emu::dynamic_shared())
#endif

namespace ms::bench {
using namespace ::ms::cuda;
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBr = 16 * kWarps;     // rows a block owns, 16 per warp
constexpr int kBc = 64;              // rows of the tiles it walks
constexpr int kLdS = kBc + 4;        // row stride of a warp's (16, kBc) fp32 score tile
constexpr int kLdP = kBc + 8;        // row stride of a warp's (16, kBc) P / dS tile in S
constexpr int kLanePairs = kBc / 2;  // score columns per lane: lanes 2r and 2r+1 share row r, alternating columns
static_assert(kBr == kBc, "the causal loops start and stop at tile boundaries of both sides");

// Shared-memory carve-up for head size HS; every piece a multiple of 128 bytes.
template <int HS>
struct Smem {
    static constexpr int kLdT = HS + 8;  // row stride of a (64, HS) tile in S
    static constexpr int kLdO = HS + 4;  // row stride of a warp's (16, HS) fp32 O tile
    static constexpr size_t kTile = size_t{kBc} * kLdT * 2;
    static constexpr size_t kScore = 16 * kLdS * 4;  // per warp
    static constexpr size_t kProb = 16 * kLdP * 2;   // per warp
    static constexpr size_t kOut = 16 * kLdO * 4;    // per warp
    static constexpr size_t kForward = 2 * kTile + kWarps * (kScore + kOut + kProb);
    static constexpr size_t kBackwardDq = 2 * kTile + kWarps * (kScore + kProb);
    static constexpr size_t kBackwardDkv = 2 * kTile + kWarps * (kScore + 2 * kProb) + 2 * kBr * 4;
};

template <class S>
struct WmmaType;
template <>
struct WmmaType<bf16> {
    using type = __nv_bfloat16;
};
template <>
struct WmmaType<fp16> {
    using type = half;
};

template <class S>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, typename WmmaType<S>::type, wmma::row_major>;
template <class S>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, typename WmmaType<S>::type, wmma::row_major>;
template <class S>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, typename WmmaType<S>::type, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// ms::bf16 / fp16 storage seen as the CUDA type of the same bits.
template <class S>
__device__ __forceinline__ const typename WmmaType<S>::type* wmma_ptr(const S* p) {
    return reinterpret_cast<const typename WmmaType<S>::type*>(p);
}

// One warp's 16 rows of A B^T into fp32 shared memory: for each 16-column subtile j in [j_begin, j_end),
// out[:, 16 j .. 16 j + 16) = sum over the kF 16-wide slices f of a[f] x (rows 16 j .. 16 j + 16 of B, slice f)^T,
// B row-major with leading dimension ld_b (read as a col_major matrix_b: element (d, row) at b[row * ld_b + d]).
// The S = Q K^T, dP = dO V^T, S^T = K Q^T and dP^T = V dO^T products of the kernels below.
template <class S, int kF>
__device__ __forceinline__ void warp_abt(float* out, int ld_out, const FragA<S> (&a)[kF], const S* b, int ld_b,
                                         int j_begin, int j_end) {
    for (int j = j_begin; j < j_end; ++j) {
        FragAcc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int f = 0; f < kF; ++f) {
            FragBCol<S> b_frag;
            wmma::load_matrix_sync(b_frag, wmma_ptr(b + 16 * j * ld_b + 16 * f), ld_b);
            wmma::mma_sync(acc, a[f], b_frag, acc);
        }
        wmma::store_matrix_sync(out + 16 * j, acc, ld_out, wmma::mem_row_major);
    }
}

__device__ __forceinline__ void copy16(void* dst, const void* src) {
#if defined(__CUDACC__)
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#else
    std::memcpy(dst, src, 16);
#endif
}
__device__ __forceinline__ void zero16(void* dst) {
#if defined(__CUDACC__)
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
#else
    std::memset(dst, 0, 16);
#endif
}

// Rows row0 .. row0+63 of the (T, HS) head slice at src (row stride `stride`) into the (64, kLdT) tile dst, in
// 16-byte packs by the whole block; rows past T are zero, so they add nothing and make nothing NaN.
template <class S, int HS>
__device__ __forceinline__ void load_tile(S* dst, const S* src, int row0, int T, int64_t stride) {
    constexpr int kPacks = HS / 8;
    for (int i = threadIdx.x; i < kBc * kPacks; i += kThreads) {
        const int r = i / kPacks, c = (i % kPacks) * 8;
        S* d = dst + r * Smem<HS>::kLdT + c;
        if (row0 + r < T) {
            copy16(d, src + static_cast<int64_t>(row0 + r) * stride + c);
        } else {
            zero16(d);
        }
    }
}

// dO . O of one row, split over the lane pair (2r, 2r+1): do_row in shared memory, o_row in global memory (null for
// a row past T: 0). Every lane of the warp must call it (the shuffle).
template <class S, int HS>
__device__ __forceinline__ float pair_row_dot(const S* do_row, const S* o_row, int half) {
    float acc = 0.0f;
    if (o_row != nullptr) {
        for (int c = 8 * half; c < HS; c += 16) {
            alignas(16) S o[8];
            copy16(o, o_row + c);
            for (int e = 0; e < 8; ++e) acc += to_float(do_row[c + e]) * to_float(o[e]);
        }
    }
    return acc + __shfl_xor_sync(0xffffffffu, acc, 1);
}

// Row r of a warp's (16, HS) fp32 tile (row stride ld) times `factor`, rounded to S, into dst (global, 16-byte
// aligned), split over the lane pair.
template <class S, int HS>
__device__ __forceinline__ void pair_store_row(S* dst, const float* row, float factor, int half) {
    for (int c = 8 * half; c < HS; c += 16) {
        alignas(16) S v[8];
        for (int e = 0; e < 8; ++e) v[e] = from_float<S>(row[c + e] * factor);
        copy16(dst + c, v);
    }
}

// ----------------------------------------------------------------------------
// CUDA kernels

// grid (query tiles, NH, B), block kThreads.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_wmma_forward_kernel(S* __restrict__ out, float* __restrict__ lse, const S* __restrict__ qkv, int T,
                                  int NH, float scale) {
    using L = Smem<HS>;
    constexpr int kLdT = L::kLdT, kLdO = L::kLdO, kF = HS / 16;
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    S* s_k = reinterpret_cast<S*>(smem);  // (kBc, kLdT); stages Q first
    S* s_v = reinterpret_cast<S*>(smem + L::kTile);
    float* s_s = reinterpret_cast<float*>(smem + 2 * L::kTile + warp * L::kScore);  // (16, kLdS) this warp's
    float* s_o = reinterpret_cast<float*>(smem + 2 * L::kTile + kWarps * L::kScore + warp * L::kOut);  // (16, kLdO)
    S* s_p = reinterpret_cast<S*>(smem + 2 * L::kTile + kWarps * (L::kScore + L::kOut) + warp * L::kProb);
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBr;
    const int w0 = q0 + 16 * warp;  // the warp's first query row
    const int64_t C = static_cast<int64_t>(NH) * HS, stride = 3 * C;
    const S* q_base = qkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS;

    load_tile<S, HS>(s_k, q_base, q0, T, stride);
    __syncthreads();
    FragA<S> q_frag[kF];
    for (int f = 0; f < kF; ++f) wmma::load_matrix_sync(q_frag[f], wmma_ptr(s_k + 16 * warp * kLdT + 16 * f), kLdT);
    for (int i = lane; i < 16 * HS; i += 32) s_o[i / HS * kLdO + i % HS] = 0.0f;

    // softmax state of row r = lane / 2, both lanes of the pair keep the same copy
    const int r = lane / 2, half = lane % 2;
    const int query = w0 + r;
    float m = -INFINITY, l = 0.0f;
    for (int k0 = 0; k0 <= q0; k0 += kBc) {
        __syncthreads();  // every warp is done with the previous K, V tiles (and the Q staging)
        load_tile<S, HS>(s_k, q_base + C, k0, T, stride);
        load_tile<S, HS>(s_v, q_base + 2 * C, k0, T, stride);
        __syncthreads();
        // j: 16-key subtile; skipped where every key is after every query of the warp
        const int live_subtiles = k0 + kBc <= w0 ? kBc / 16 : (w0 + 16 - k0 + 15) / 16;
        warp_abt<S, kF>(s_s, kLdS, q_frag, s_k, kLdT, 0, live_subtiles);
        __syncwarp();

        // online softmax of row r over this tile's visible keys (key k0 is visible to every row: m is finite)
        const float* s_row = s_s + r * kLdS;
        float tile_max = -INFINITY;
        MS_UNROLL
        for (int i = 0; i < kLanePairs; ++i) {
            const int c = 2 * i + half;
            if (k0 + c <= query) tile_max = fmaxf(tile_max, s_row[c]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        const float m_new = fmaxf(m, tile_max * scale);
        const float correction = __expf(m - m_new);  // 0 on the first tile, where m = -inf and l = O = 0
        S* p_row = s_p + r * kLdP;
        float sum = 0.0f;
        MS_UNROLL
        for (int i = 0; i < kLanePairs; ++i) {
            const int c = 2 * i + half;
            const float p = k0 + c <= query ? __expf(s_row[c] * scale - m_new) : 0.0f;
            p_row[c] = from_float<S>(p);
            sum += p;
        }
        l = l * correction + sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        m = m_new;
        float* o_row = s_o + r * kLdO;
        for (int c = half; c < HS; c += 2) o_row[c] *= correction;
        __syncwarp();

        // O += P V
        FragAcc o_frag[kF];
        for (int f = 0; f < kF; ++f) wmma::load_matrix_sync(o_frag[f], s_o + 16 * f, kLdO, wmma::mem_row_major);
        for (int j = 0; j < live_subtiles; ++j) {
            FragA<S> p_frag;
            wmma::load_matrix_sync(p_frag, wmma_ptr(s_p + 16 * j), kLdP);
            for (int f = 0; f < kF; ++f) {
                FragBRow<S> v_frag;
                wmma::load_matrix_sync(v_frag, wmma_ptr(s_v + 16 * j * kLdT + 16 * f), kLdT);
                wmma::mma_sync(o_frag[f], p_frag, v_frag, o_frag[f]);
            }
        }
        for (int f = 0; f < kF; ++f) wmma::store_matrix_sync(s_o + 16 * f, o_frag[f], kLdO, wmma::mem_row_major);
        __syncwarp();  // the next tile's rescale (and the output below) read rows other lanes' stores wrote
    }
    if (query >= T) return;
    pair_store_row<S, HS>(out + (static_cast<int64_t>(b) * T + query) * C + static_cast<int64_t>(h) * HS,
                          s_o + r * kLdO, 1.0f / l, half);
    if (half == 0) lse[(static_cast<int64_t>(b) * NH + h) * T + query] = m + logf(l);
}

// dQ of one query tile: grid (query tiles, NH, B), block kThreads.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_wmma_backward_dq_kernel(S* __restrict__ dqkv, const S* __restrict__ dout, const S* __restrict__ qkv,
                                      const S* __restrict__ out, const float* __restrict__ lse, int T, int NH,
                                      float scale) {
    using L = Smem<HS>;
    constexpr int kLdT = L::kLdT, kF = HS / 16;
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    S* s_k = reinterpret_cast<S*>(smem);                                            // (kBc, kLdT); stages Q first
    S* s_v = reinterpret_cast<S*>(smem + L::kTile);                                 // stages dO first
    float* s_s = reinterpret_cast<float*>(smem + 2 * L::kTile + warp * L::kScore);  // (16, kLdS): S, then dP
    S* s_ds = reinterpret_cast<S*>(smem + 2 * L::kTile + kWarps * L::kScore + warp * L::kProb);  // (16, kLdP)
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBr;
    const int w0 = q0 + 16 * warp;
    const int64_t C = static_cast<int64_t>(NH) * HS, stride = 3 * C;
    const S* q_base = qkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS;
    const S* do_base = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const S* o_base = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;

    load_tile<S, HS>(s_k, q_base, q0, T, stride);
    load_tile<S, HS>(s_v, do_base, q0, T, C);
    __syncthreads();
    FragA<S> q_frag[kF], do_frag[kF];
    for (int f = 0; f < kF; ++f) {
        wmma::load_matrix_sync(q_frag[f], wmma_ptr(s_k + 16 * warp * kLdT + 16 * f), kLdT);
        wmma::load_matrix_sync(do_frag[f], wmma_ptr(s_v + 16 * warp * kLdT + 16 * f), kLdT);
    }
    const int r = lane / 2, half = lane % 2;
    const int query = w0 + r;
    const float D = pair_row_dot<S, HS>(s_v + (16 * warp + r) * kLdT, query < T ? o_base + query * C : nullptr, half);
    const float row_lse = query < T ? lse[(static_cast<int64_t>(b) * NH + h) * T + query] : 0.0f;

    FragAcc dq[kF];
    for (int f = 0; f < kF; ++f) wmma::fill_fragment(dq[f], 0.0f);
    for (int k0 = 0; k0 <= q0; k0 += kBc) {
        __syncthreads();  // every warp is done with the previous K, V tiles (and the Q, dO staging)
        load_tile<S, HS>(s_k, q_base + C, k0, T, stride);
        load_tile<S, HS>(s_v, q_base + 2 * C, k0, T, stride);
        __syncthreads();
        const int live_subtiles = k0 + kBc <= w0 ? kBc / 16 : (w0 + 16 - k0 + 15) / 16;
        warp_abt<S, kF>(s_s, kLdS, q_frag, s_k, kLdT, 0, live_subtiles);  // S = Q K^T
        __syncwarp();
        float p[kLanePairs];
        const float* s_row = s_s + r * kLdS;
        MS_UNROLL
        for (int i = 0; i < kLanePairs; ++i) {
            const int c = 2 * i + half;
            p[i] = query < T && k0 + c <= query ? __expf(s_row[c] * scale - row_lse) : 0.0f;
        }
        __syncwarp();  // every lane has read S before dP overwrites it
        warp_abt<S, kF>(s_s, kLdS, do_frag, s_v, kLdT, 0, live_subtiles);  // dP = dO V^T
        __syncwarp();
        S* ds_row = s_ds + r * kLdP;
        MS_UNROLL
        for (int i = 0; i < kLanePairs; ++i) {
            const int c = 2 * i + half;
            // masked entries: p = 0, and dP there may be stale (a skipped subtile), so no 0 * NaN
            ds_row[c] = from_float<S>(p[i] != 0.0f ? p[i] * (s_row[c] - D) : 0.0f);
        }
        __syncwarp();
        for (int j = 0; j < live_subtiles; ++j) {  // dQ += dS K
            FragA<S> ds_frag;
            wmma::load_matrix_sync(ds_frag, wmma_ptr(s_ds + 16 * j), kLdP);
            for (int f = 0; f < kF; ++f) {
                FragBRow<S> k_frag;
                wmma::load_matrix_sync(k_frag, wmma_ptr(s_k + 16 * j * kLdT + 16 * f), kLdT);
                wmma::mma_sync(dq[f], ds_frag, k_frag, dq[f]);
            }
        }
    }
    for (int f = 0; f < kF; ++f) wmma::store_matrix_sync(s_s + 16 * f, dq[f], kLdS, wmma::mem_row_major);
    __syncwarp();
    if (query >= T) return;
    pair_store_row<S, HS>(dqkv + (static_cast<int64_t>(b) * T + query) * stride + static_cast<int64_t>(h) * HS,
                          s_s + r * kLdS, scale, half);
}

// dK and dV of one key tile: grid (key tiles, NH, B), block kThreads; warp w owns keys k0 + 16w .. + 15.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_wmma_backward_dkv_kernel(S* __restrict__ dqkv, const S* __restrict__ dout, const S* __restrict__ qkv,
                                       const S* __restrict__ out, const float* __restrict__ lse, int T, int NH,
                                       float scale) {
    using L = Smem<HS>;
    constexpr int kLdT = L::kLdT, kF = HS / 16;
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    S* s_q = reinterpret_cast<S*>(smem);                                            // (kBr, kLdT); stages K first
    S* s_do = reinterpret_cast<S*>(smem + L::kTile);                                // stages V first
    float* s_s = reinterpret_cast<float*>(smem + 2 * L::kTile + warp * L::kScore);  // (16, kLdS): S^T, then dP^T
    S* s_pt = reinterpret_cast<S*>(smem + 2 * L::kTile + kWarps * L::kScore + warp * L::kProb);  // (16, kLdP)
    S* s_dst = reinterpret_cast<S*>(smem + 2 * L::kTile + kWarps * (L::kScore + L::kProb) + warp * L::kProb);
    float* s_lse = reinterpret_cast<float*>(smem + 2 * L::kTile + kWarps * (L::kScore + 2 * L::kProb));  // (kBr)
    float* s_d = s_lse + kBr;                                                                            // (kBr)
    const int h = blockIdx.y, b = blockIdx.z;
    const int k0 = blockIdx.x * kBc;  // the longest key tiles (most query tiles) have the lowest index
    const int w0 = k0 + 16 * warp;    // the warp's first key
    const int64_t C = static_cast<int64_t>(NH) * HS, stride = 3 * C;
    const S* q_base = qkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS;
    const S* do_base = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const S* o_base = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const float* lse_row = lse + (static_cast<int64_t>(b) * NH + h) * T;

    load_tile<S, HS>(s_q, q_base + C, k0, T, stride);
    load_tile<S, HS>(s_do, q_base + 2 * C, k0, T, stride);
    __syncthreads();
    FragA<S> k_frag[kF], v_frag[kF];
    for (int f = 0; f < kF; ++f) {
        wmma::load_matrix_sync(k_frag[f], wmma_ptr(s_q + 16 * warp * kLdT + 16 * f), kLdT);
        wmma::load_matrix_sync(v_frag[f], wmma_ptr(s_do + 16 * warp * kLdT + 16 * f), kLdT);
    }
    FragAcc dk[kF], dv[kF];
    for (int f = 0; f < kF; ++f) {
        wmma::fill_fragment(dk[f], 0.0f);
        wmma::fill_fragment(dv[f], 0.0f);
    }
    const int r = lane / 2, half = lane % 2;
    const int key = w0 + r;
    for (int q0 = k0; q0 < T; q0 += kBr) {
        __syncthreads();  // every warp is done with the previous Q, dO tiles, lse and D (and the K, V staging)
        load_tile<S, HS>(s_q, q_base, q0, T, stride);
        load_tile<S, HS>(s_do, do_base, q0, T, C);
        __syncthreads();
        {  // lse and D of the tile's rows: row threadIdx.x / 2, over the lane pair
            const int row = threadIdx.x / 2, query = q0 + row;
            const float D =
                pair_row_dot<S, HS>(s_do + row * kLdT, query < T ? o_base + query * C : nullptr, threadIdx.x % 2);
            if (threadIdx.x % 2 == 0) {
                s_d[row] = D;
                s_lse[row] = query < T ? lse_row[query] : 0.0f;
            }
        }
        __syncthreads();
        // j: 16-query subtile; skipped where every query is before every key of the warp
        const int first_live = q0 + kBr <= w0 ? kBr / 16 : (w0 - q0 > 0 ? (w0 - q0) / 16 : 0);
        warp_abt<S, kF>(s_s, kLdS, k_frag, s_q, kLdT, first_live, kBr / 16);  // S^T = K Q^T
        __syncwarp();
        float p[kLanePairs];
        const float* s_row = s_s + r * kLdS;
        S* pt_row = s_pt + r * kLdP;
        MS_UNROLL
        for (int i = 0; i < kLanePairs; ++i) {
            const int c = 2 * i + half, query = q0 + c;
            p[i] = query < T && key <= query ? __expf(s_row[c] * scale - s_lse[c]) : 0.0f;
            pt_row[c] = from_float<S>(p[i]);
        }
        __syncwarp();  // every lane has read S^T before dP^T overwrites it
        warp_abt<S, kF>(s_s, kLdS, v_frag, s_do, kLdT, first_live, kBr / 16);  // dP^T = V dO^T
        __syncwarp();
        S* dst_row = s_dst + r * kLdP;
        MS_UNROLL
        for (int i = 0; i < kLanePairs; ++i) {
            const int c = 2 * i + half;
            dst_row[c] = from_float<S>(p[i] != 0.0f ? p[i] * (s_row[c] - s_d[c]) : 0.0f);
        }
        __syncwarp();
        for (int j = first_live; j < kBr / 16; ++j) {  // dV += P^T dO, dK += dS^T Q
            FragA<S> pt_frag, dst_frag;
            wmma::load_matrix_sync(pt_frag, wmma_ptr(s_pt + 16 * j), kLdP);
            wmma::load_matrix_sync(dst_frag, wmma_ptr(s_dst + 16 * j), kLdP);
            for (int f = 0; f < kF; ++f) {
                FragBRow<S> b_frag;
                wmma::load_matrix_sync(b_frag, wmma_ptr(s_do + 16 * j * kLdT + 16 * f), kLdT);
                wmma::mma_sync(dv[f], pt_frag, b_frag, dv[f]);
                wmma::load_matrix_sync(b_frag, wmma_ptr(s_q + 16 * j * kLdT + 16 * f), kLdT);
                wmma::mma_sync(dk[f], dst_frag, b_frag, dk[f]);
            }
        }
    }
    S* dk_row = dqkv + (static_cast<int64_t>(b) * T + key) * stride + C + static_cast<int64_t>(h) * HS;
    for (int f = 0; f < kF; ++f) wmma::store_matrix_sync(s_s + 16 * f, dk[f], kLdS, wmma::mem_row_major);
    __syncwarp();
    if (key < T) pair_store_row<S, HS>(dk_row, s_s + r * kLdS, scale, half);
    __syncwarp();  // every lane has read dK before dV overwrites it
    for (int f = 0; f < kF; ++f) wmma::store_matrix_sync(s_s + 16 * f, dv[f], kLdS, wmma::mem_row_major);
    __syncwarp();
    if (key < T) pair_store_row<S, HS>(dk_row + C, s_s + r * kLdS, 1.0f, half);
}

// ----------------------------------------------------------------------------
// launch helpers

template <class Kernel>
void opt_in_shared(Kernel kernel, size_t bytes) {
    if (bytes > (48u << 10)) {
        MS_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    }
}

dim3 tile_grid(int B, int T, int NH) {
    return dim3(static_cast<unsigned>(ceil_div(T, kBr)), static_cast<unsigned>(NH), static_cast<unsigned>(B));
}

template <class S, int HS>
void forward_hs(S* out, float* lse, const S* qkv, int B, int T, int NH, cudaStream_t stream) {
    const size_t bytes = Smem<HS>::kForward;
    opt_in_shared(attention_wmma_forward_kernel<S, HS>, bytes);
    ms_launch(attention_wmma_forward_kernel<S, HS>, tile_grid(B, T, NH), dim3(kThreads), bytes, stream, out, lse, qkv,
              T, NH, 1.0f / sqrtf(static_cast<float>(HS)));
    MS_CUDA_LAUNCH_CHECK();
}

template <class S, int HS>
void backward_hs(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                 cudaStream_t stream) {
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    opt_in_shared(attention_wmma_backward_dq_kernel<S, HS>, Smem<HS>::kBackwardDq);
    ms_launch(attention_wmma_backward_dq_kernel<S, HS>, tile_grid(B, T, NH), dim3(kThreads), Smem<HS>::kBackwardDq,
              stream, dqkv, dout, qkv, out, lse, T, NH, scale);
    MS_CUDA_LAUNCH_CHECK();
    opt_in_shared(attention_wmma_backward_dkv_kernel<S, HS>, Smem<HS>::kBackwardDkv);
    ms_launch(attention_wmma_backward_dkv_kernel<S, HS>, tile_grid(B, T, NH), dim3(kThreads), Smem<HS>::kBackwardDkv,
              stream, dqkv, dout, qkv, out, lse, T, NH, scale);
    MS_CUDA_LAUNCH_CHECK();
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class S>
void attention_wmma_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    launch_attention_tc("wmma", B, T, NH, HS, {out, qkv},
                        [&](auto hs) { forward_hs<S, decltype(hs)::value>(out, lse, qkv, B, T, NH, stream); });
}

template <class S>
void attention_wmma_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                             int HS, cudaStream_t stream) {
    launch_attention_tc("wmma", B, T, NH, HS, {dqkv, dout, qkv, out}, [&](auto hs) {
        backward_hs<S, decltype(hs)::value>(dqkv, dout, qkv, out, lse, B, T, NH, stream);
    });
}

#define MS_INSTANTIATE(S)                                                                                        \
    template void attention_wmma_forward<S>(S*, float*, const S*, int, int, int, int, cudaStream_t);             \
    template void attention_wmma_backward<S>(S*, const S*, const S*, const S*, const float*, int, int, int, int, \
                                             cudaStream_t);
MS_INSTANTIATE(::ms::bf16)
MS_INSTANTIATE(::ms::fp16)
#undef MS_INSTANTIATE

}  // namespace ms::bench
