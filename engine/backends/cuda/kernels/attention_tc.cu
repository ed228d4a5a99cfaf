/*
Causal multi-head self-attention on tensor cores for bf16 / fp16 activations, forward and backward, FlashAttention-2
style on the PTX mma.sync m16n8k16 instruction (wrappers and fragment layouts: cuda/mma.cuh). The spec is
attention.cu (its layouts, equations and accumulation contract hold here unchanged); attention.cu's launchers
dispatch here when attention_tc_eligible() (attention_tc.cuh) holds.
Layout: qkv/dqkv (B, T, 3*C), out/dout (B, T, C), head-major; lse (B, NH, T) fp32; HS in {16, 32, 48, 64}; any
B, NH and T >= 1 (tiles past T are zero-filled and masked).

Precision: every matrix product runs on the tensor cores with S (bf16 / fp16) operands and fp32 accumulators:
  S = Q K^T, dP = dO V^T     operands Q, K, V, dO as stored;
  O += P V, dV += P^T dO     P rounded to S first (as FlashAttention does);
  dQ += dS K, dK += dS^T Q   dS rounded to S first.
Scale, causal mask, online softmax (running max m and sum l per row), exp, D = rowsum(dO * O) and dS = P (dP - D) are
fp32 on the accumulator registers. The mma's documented fragment layout puts row g = lane / 4 and g + 8 of a 16-row
tile in each lane and a row's columns in the 4 lanes of a quad, so a row max or sum is a lane-local loop plus two
__shfl_xor_sync (1, 2); and the accumulator layout of two adjacent 8-column blocks, rounded and packed pairwise, is
the A operand of the next product, so P and dS never leave registers (nor does O). exp is exp2f on scores pre-scaled
by scale * log2(e). l sums the fp32 P (so lse is as exact as the fp32 kernels'); V is weighted by P rounded. out and
dqkv are rounded once, on store.

Tiles: a block of kWarps = 4 warps owns 16 kMt rows per warp and walks kBc = 64-row tiles of the other side; kMt = 2
m16 tiles per warp (128-row blocks, as FlashAttention-2) for the forward and dQ, so each B fragment a warp loads feeds
two mma per 8 columns (half the ldmatrix traffic per mma of kMt = 1: mma.sync kernels tend to be bound by shared
memory), and kMt = 1 (64 keys) for dK/dV, whose dK and dV accumulators would not fit 255 registers twice. Tiles are
staged in shared memory by 16-byte cp.async (rows past T zero-filled), double-buffered: the next walked tile's copies
are issued right after the barrier that frees its buffer and land while the current one is used (one __syncthreads
per walked tile; dK/dV has a second one for lse and D). B operands come from shared memory by ldmatrix.x4 (K, V, Q, dO
rows as the (n, k) operand of an A B^T product) or ldmatrix.x4.trans (V, K, dO, Q as the (k, n) operand of P V, dS K,
P^T dO, dS^T Q); A operands (Q, dO, K, V of the warp's own rows) once per block.
  forward  (query tile): per key tile S (32 x 64 per warp: 64 fp32 registers a lane), mask, online softmax, O (32 x
           HS: HS registers) rescaled by exp(m_old - m_new) and += P V. O / l and lse = m + log l at the end.
  dQ       (query tile): per 16-key block of each key tile S -> P = exp(S * scale - lse), dP = dO V^T,
           dS = P (dP - D), dQ += dS K. No row reduction crosses blocks in the backward, so S and dP live one 16-wide
           block at a time (16 registers per m16 tile, not 64).
  dK/dV    (key tile): per 16-query block of each query tile from the diagonal on, the transposed products
           S^T = K Q^T and dP^T = V dO^T, so each warp's P^T / dS^T rows are its own keys and dV += P^T dO,
           dK += dS^T Q need nothing from other warps; lse and D of the query tile's rows go through shared memory.
dQ and dK/dV are separate kernels that both recompute P: no atomics, every run gives the same bits.
Query tiles run longest first (blockIdx.x reversed) so the causal triangle's long rows do not finish last. Tiles
and 16-row sub-blocks a warp's causal mask hides entirely are skipped; the mask is applied only on tiles that
straddle the diagonal (and past T).
Shared memory (bytes, HS = 64; row stride HS + 8 elements, so ldmatrix's 8 row addresses hit distinct banks and stay
16-byte aligned): forward 55296 (Q, 2 x K, V), dQ 73728 (Q, dO, 2 x K, V), dK/dV 55808 (K, V, 2 x Q, dO, lse, D),
dynamic (opted in past 48 KiB with cudaFuncSetAttribute).
Registers (ptxas, sm_90, HS = 64): forward 220, dQ 223, dK/dV 167, no spills (with kMt = 1 everywhere: 125, 123,
167). kMtForward / kMtDq are the knobs to compare on a GPU.
Status: correct on the CPU emulation (tests/ops/test_cuda_emu_attention_tc.cpp; its cp.async copies land only at the
wait_group that covers them, so a missing wait shows); not run on a GPU (tests/gpu/test_gpu_attention.cpp is ready).
Room left: HS 128, a fused dQ/dK/dV backward with a deterministic dQ reduction (the two backward kernels both
recompute S and dP: 7 products where FlashAttention-2 does 5), wgmma (sm_90) instead of mma.sync. The former
nvcuda::wmma version (scores through shared memory) is bench/gpu/attention_wmma.cu, for comparison in
gpu_kernel_bench.
*/
#include "engine/backends/cuda/kernels/attention_tc.cuh"
#include "engine/backends/cuda/mma.cuh"

#if defined(__CUDACC__)
#define MS_UNROLL _Pragma("unroll")
#define MS_TC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#else
#define MS_UNROLL
#define MS_TC_SHARED(name) unsigned char* name = static_cast<unsigned char*>(::ms::cuda_emu::dynamic_shared())
#endif

namespace ms::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBc = 64;  // rows of the tiles a block walks
// m16 tiles per warp: a block owns 16 kMt kWarps rows. Every B fragment a warp loads from shared memory feeds kMt
// mma per 8 columns, so two halve the ldmatrix traffic per mma of one (FlashAttention-2's 128-row tiles); dK/dV
// keeps one, as two would need more than 255 registers for its dK and dV accumulators.
constexpr int kMtForward = 2, kMtDq = 2, kMtDkv = 1;
__host__ __device__ constexpr int owned_rows(int mt) { return 16 * mt * kWarps; }
constexpr float kLog2e = 1.4426950408889634f;
// k0 > w0 means every key of the walked tile is after every row of the warp only if 16 kMt divides kBc
static_assert(kBc % (16 * kMtForward) == 0 && kBc % (16 * kMtDq) == 0 && kBc % (16 * kMtDkv) == 0,
              "a warp's 16 kMt rows start at a multiple of 16 kMt, which must divide kBc");

// Shared-memory carve-up for head size HS.
template <int HS>
struct Smem {
    static constexpr int kLd = HS + 8;  // row stride of a tile in S (elements)
    __host__ __device__ static constexpr size_t tile(int rows) { return size_t(rows) * kLd * 2; }
    static constexpr size_t kWalk = tile(kBc);
    // the walked tiles twice: the next one's copies run while the current one is used
    static constexpr size_t kForward = tile(owned_rows(kMtForward)) + 4 * kWalk;
    static constexpr size_t kBackwardDq = 2 * tile(owned_rows(kMtDq)) + 4 * kWalk;
    static constexpr size_t kBackwardDkv = 2 * tile(owned_rows(kMtDkv)) + 4 * kWalk + 2 * kBc * sizeof(float);
};

__device__ __forceinline__ void copy16(void* dst, const void* src) {
#if defined(__CUDACC__)
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#else
    std::memcpy(dst, src, 16);
#endif
}

// Issues the copy of rows row0 .. row0 + kRows - 1 of the (T, HS) head slice at src (row stride `stride`) into the
// (kRows, HS + 8) tile dst, in 16-byte cp.async by the whole block (the caller commits and waits); rows past T are
// zero, so they add nothing and make nothing NaN.
template <class S, int HS, int kRows>
__device__ __forceinline__ void load_tile(S* dst, const S* src, int row0, int T, int64_t stride) {
    constexpr int kPacks = HS / 8;
    for (int i = threadIdx.x; i < kRows * kPacks; i += kThreads) {
        const int r = i / kPacks, c = (i % kPacks) * 8;
        const bool live = row0 + r < T;
        cp_async16(dst + r * Smem<HS>::kLd + c, src + static_cast<int64_t>(live ? row0 + r : 0) * stride + c, live);
    }
}

// The A fragments of a warp's kMt m16 tiles (16 kMt rows from `rows`; kF = HS / 16 slices of 16 columns) of a
// row-major tile in shared memory.
template <class S, int HS, int kMt>
__device__ __forceinline__ void load_a(uint32_t (&a)[kMt][HS / 16][4], const S* rows, int lane) {
    constexpr int kLd = Smem<HS>::kLd;
    MS_UNROLL
    for (int mt = 0; mt < kMt; ++mt) {
        MS_UNROLL
        for (int f = 0; f < HS / 16; ++f) {
            ldmatrix_x4(a[mt][f], rows + (16 * mt + lane % 8 + 8 * ((lane / 8) % 2)) * kLd + 16 * f + 8 * (lane / 16));
        }
    }
}

// acc[mt][0], acc[mt][1] += a[mt] x (rows 0 .. 15 of b)^T for each m16 tile mt: b a row-major (n, k) tile in shared
// memory, so its 16 rows are two 8-column accumulator blocks. The S = Q K^T, dP = dO V^T, S^T = K Q^T,
// dP^T = V dO^T products, one 16-row block of the walked tile at a time.
template <class S, int HS, int kMt>
__device__ __forceinline__ void mma_abt(float (&acc)[kMt][2][4], const uint32_t (&a)[kMt][HS / 16][4], const S* b_rows,
                                        int lane) {
    constexpr int kLd = Smem<HS>::kLd;
    MS_UNROLL
    for (int f = 0; f < HS / 16; ++f) {
        uint32_t b[4];
        ldmatrix_x4(b, b_rows + (lane % 8 + 8 * (lane / 16)) * kLd + 16 * f + 8 * ((lane / 8) % 2));
        const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
        MS_UNROLL
        for (int mt = 0; mt < kMt; ++mt) {
            mma_m16n8k16<S>(acc[mt][0], a[mt][f], b_lo, acc[mt][0]);
            mma_m16n8k16<S>(acc[mt][1], a[mt][f], b_hi, acc[mt][1]);
        }
    }
}

// acc[mt] (16 x HS: HS / 8 accumulator blocks) += a[mt] x (rows 0 .. 15 of b) for each m16 tile mt: a[mt] the A
// fragment of a 16-wide k-slice, b a row-major (k, n) tile in shared memory read transposed. The P V, dS K, P^T dO,
// dS^T Q products.
template <class S, int HS, int kMt>
__device__ __forceinline__ void mma_ab(float (&acc)[kMt][HS / 8][4], const uint32_t (&a)[kMt][4], const S* b_rows,
                                       int lane) {
    constexpr int kLd = Smem<HS>::kLd;
    MS_UNROLL
    for (int f = 0; f < HS / 16; ++f) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, b_rows + (lane % 8 + 8 * ((lane / 8) % 2)) * kLd + 16 * f + 8 * (lane / 16));
        const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
        MS_UNROLL
        for (int mt = 0; mt < kMt; ++mt) {
            mma_m16n8k16<S>(acc[mt][2 * f], a[mt], b_lo, acc[mt][2 * f]);
            mma_m16n8k16<S>(acc[mt][2 * f + 1], a[mt], b_hi, acc[mt][2 * f + 1]);
        }
    }
}

// The A fragment of k-slice jj (columns 16 jj .. 16 jj + 15) of a (16, kBc) accumulator tile, rounded to S.
template <class S>
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack2<S>(lo[0], lo[1]);
    a[1] = pack2<S>(lo[2], lo[3]);
    a[2] = pack2<S>(hi[0], hi[1]);
    a[3] = pack2<S>(hi[2], hi[3]);
}

template <int M, int N>
__device__ __forceinline__ void zero(float (&acc)[M][N][4]) {
    MS_UNROLL
    for (int mt = 0; mt < M; ++mt) {
        MS_UNROLL
        for (int j = 0; j < N; ++j) {
            MS_UNROLL
            for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.0f;
        }
    }
}

// Rows g and g + 8 (r = 0, 1) of a warp's (16, HS) accumulator tile, times factor[r], rounded to S, into rows
// row0 + g, row0 + 8 + g of dst (row stride `stride`), skipping rows at or past T.
template <class S, int HS>
__device__ __forceinline__ void store_rows(S* dst, int64_t stride, int row0, int T, const float (&acc)[HS / 8][4],
                                           const float (&factor)[2], int lane) {
    const int g = lane >> 2, t = lane % 4;
    MS_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + g + 8 * r;
        if (row >= T) continue;
        S* d = dst + static_cast<int64_t>(row) * stride + 2 * t;
        MS_UNROLL
        for (int j = 0; j < HS / 8; ++j) {
            const uint32_t v = pack2<S>(acc[j][2 * r] * factor[r], acc[j][2 * r + 1] * factor[r]);
#if defined(__CUDACC__)
            *reinterpret_cast<uint32_t*>(d + 8 * j) = v;
#else
            std::memcpy(d + 8 * j, &v, 4);
#endif
        }
    }
}

// dO . O of global row `row` (0 past T), split over the 4 lanes of the quad: do_row in shared memory.
template <class S, int HS>
__device__ __forceinline__ float quad_row_dot(const S* do_row, const S* o_row, bool live, int t) {
    float acc = 0.0f;
    if (live) {
        for (int c = 8 * t; c < HS; c += 32) {
            alignas(16) S o[8];
            copy16(o, o_row + c);
            for (int e = 0; e < 8; ++e) acc += to_float(do_row[c + e]) * to_float(o[e]);
        }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    return acc + __shfl_xor_sync(0xffffffffu, acc, 2);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ----------------------------------------------------------------------------
// CUDA kernels

// grid (query tiles of owned_rows(kMtForward), NH, B), block kThreads.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_tc_forward_kernel(S* __restrict__ out, float* __restrict__ lse, const S* __restrict__ qkv, int T, int NH,
                                float scale) {
    using L = Smem<HS>;
    constexpr int kLd = L::kLd, kF = HS / 16, kMt = kMtForward, kBr = owned_rows(kMt), kJ = kBc / 16;
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane % 4;
    S* s_q = reinterpret_cast<S*>(smem);                  // (kBr, kLd)
    S* s_kv = reinterpret_cast<S*>(smem + L::tile(kBr));  // 2 x [K (kBc, kLd), V (kBc, kLd)]
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBr;
    const int w0 = q0 + 16 * kMt * warp;  // the warp's first query row; it owns rows w0 + 16 mt + g (+ 8)
    const int64_t C = static_cast<int64_t>(NH) * HS, stride = 3 * C;
    const S* q_base = qkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS;
    const float scale_log2 = scale * kLog2e;

    const int k_end = q0 + kBr < T ? q0 + kBr : T;  // keys past the block's last row are masked for all of its rows
    load_tile<S, HS, kBr>(s_q, q_base, q0, T, stride);
    cp_async_commit();
    load_tile<S, HS, kBc>(s_kv, q_base + C, 0, T, stride);
    load_tile<S, HS, kBc>(s_kv + kBc * kLd, q_base + 2 * C, 0, T, stride);
    cp_async_commit();
    cp_async_wait<1>();  // Q (K, V tile 0 may still be in flight)
    __syncthreads();
    uint32_t qa[kMt][kF][4];
    load_a<S, HS, kMt>(qa, s_q + 16 * kMt * warp * kLd, lane);

    float o[kMt][HS / 8][4];
    zero(o);
    float m[kMt][2], l[kMt][2];  // per row (16 mt + g, + 8): running max in units of scale_log2; this lane's share
    MS_UNROLL                    // of the running sum (the quad's add up at the end)
        for (int mt = 0; mt < kMt; ++mt) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    for (int k0 = 0, buf = 0; k0 < k_end; k0 += kBc, buf ^= 1) {
        cp_async_wait<0>();
        __syncthreads();  // this K, V tile has landed, and every warp is done with the previous one (buffer buf ^ 1)
        if (k0 + kBc < k_end) {  // prefetch the next tile into buffer buf ^ 1
            S* next = s_kv + (buf ^ 1) * 2 * kBc * kLd;
            load_tile<S, HS, kBc>(next, q_base + C, k0 + kBc, T, stride);
            load_tile<S, HS, kBc>(next + kBc * kLd, q_base + 2 * C, k0 + kBc, T, stride);
            cp_async_commit();
        }
        // every key after every row of the warp (k0 and w0 are multiples of 16 kMt, so k0 <= w0 otherwise: key k0
        // is visible to every row and m is finite)
        if (k0 > w0) continue;
        const S* s_k = s_kv + buf * 2 * kBc * kLd;
        const S* s_v = s_k + kBc * kLd;

        float s[kJ][kMt][2][4];  // [16-key block][m16 tile][8-key block]
        MS_UNROLL
        for (int jj = 0; jj < kJ; ++jj) {
            zero(s[jj]);
            if (k0 + 16 * jj <= w0 + 16 * kMt - 1) mma_abt<S, HS, kMt>(s[jj], qa, s_k + 16 * jj * kLd, lane);
        }
        const bool diagonal = k0 + kBc - 1 > w0;
        float tile_max[kMt][2];
        MS_UNROLL
        for (int mt = 0; mt < kMt; ++mt) {
            tile_max[mt][0] = tile_max[mt][1] = -INFINITY;
            MS_UNROLL
            for (int jj = 0; jj < kJ; ++jj) {
                MS_UNROLL
                for (int j = 0; j < 2; ++j) {
                    MS_UNROLL
                    for (int i = 0; i < 4; ++i) {
                        const int row = w0 + 16 * mt + g + 8 * (i / 2), key = k0 + 16 * jj + 8 * j + 2 * t + i % 2;
                        float& x = s[jj][mt][j][i];
                        x = diagonal && key > row ? -INFINITY : x * scale_log2;
                        tile_max[mt][i / 2] = fmaxf(tile_max[mt][i / 2], x);
                    }
                }
            }
        }
        MS_UNROLL
        for (int mt = 0; mt < kMt; ++mt) {
            float correction[2];
            MS_UNROLL
            for (int r = 0; r < 2; ++r) {
                const float m_new = fmaxf(m[mt][r], quad_max(tile_max[mt][r]));
                correction[r] = exp2f(m[mt][r] - m_new);  // 0 on the first tile, where m = -inf and l = O = 0
                m[mt][r] = m_new;
                l[mt][r] *= correction[r];
            }
            MS_UNROLL
            for (int jj = 0; jj < kJ; ++jj) {
                MS_UNROLL
                for (int j = 0; j < 2; ++j) {
                    MS_UNROLL
                    for (int i = 0; i < 4; ++i) {
                        float& x = s[jj][mt][j][i];
                        x = exp2f(x - m[mt][i / 2]);  // masked: exp2(-inf) = 0
                        l[mt][i / 2] += x;
                    }
                }
            }
            MS_UNROLL
            for (int j = 0; j < HS / 8; ++j) {
                MS_UNROLL
                for (int i = 0; i < 4; ++i) o[mt][j][i] *= correction[i / 2];
            }
        }
        MS_UNROLL
        for (int jj = 0; jj < kJ; ++jj) {  // O += P V
            if (k0 + 16 * jj > w0 + 16 * kMt - 1) continue;
            uint32_t pa[kMt][4];
            MS_UNROLL
            for (int mt = 0; mt < kMt; ++mt) to_a<S>(pa[mt], s[jj][mt][0], s[jj][mt][1]);
            mma_ab<S, HS, kMt>(o, pa, s_v + 16 * jj * kLd, lane);
        }
    }
    float* lse_row = lse + (static_cast<int64_t>(b) * NH + h) * T;
    MS_UNROLL
    for (int mt = 0; mt < kMt; ++mt) {
        float inv_l[2];
        MS_UNROLL
        for (int r = 0; r < 2; ++r) {
            l[mt][r] = quad_sum(l[mt][r]);
            inv_l[r] = 1.0f / l[mt][r];
        }
        store_rows<S, HS>(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS, C, w0 + 16 * mt, T,
                          o[mt], inv_l, lane);
        MS_UNROLL
        for (int r = 0; r < 2; ++r) {
            const int row = w0 + 16 * mt + g + 8 * r;
            if (t == 0 && row < T) lse_row[row] = m[mt][r] / kLog2e + logf(l[mt][r]);
        }
    }
}

// dQ of one query tile: grid (query tiles of owned_rows(kMtDq), NH, B), block kThreads.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_tc_backward_dq_kernel(S* __restrict__ dqkv, const S* __restrict__ dout, const S* __restrict__ qkv,
                                    const S* __restrict__ out, const float* __restrict__ lse, int T, int NH,
                                    float scale) {
    using L = Smem<HS>;
    constexpr int kLd = L::kLd, kF = HS / 16, kMt = kMtDq, kBr = owned_rows(kMt), kJ = kBc / 16;
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane % 4;
    S* s_q = reinterpret_cast<S*>(smem);  // (kBr, kLd)
    S* s_do = reinterpret_cast<S*>(smem + L::tile(kBr));
    S* s_kv = reinterpret_cast<S*>(smem + 2 * L::tile(kBr));  // 2 x [K (kBc, kLd), V (kBc, kLd)]
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBr;
    const int w0 = q0 + 16 * kMt * warp;
    const int64_t C = static_cast<int64_t>(NH) * HS, stride = 3 * C;
    const S* q_base = qkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS;
    const S* do_base = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const S* o_base = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const float scale_log2 = scale * kLog2e;

    const int k_end = q0 + kBr < T ? q0 + kBr : T;
    load_tile<S, HS, kBr>(s_q, q_base, q0, T, stride);
    load_tile<S, HS, kBr>(s_do, do_base, q0, T, C);
    cp_async_commit();
    load_tile<S, HS, kBc>(s_kv, q_base + C, 0, T, stride);
    load_tile<S, HS, kBc>(s_kv + kBc * kLd, q_base + 2 * C, 0, T, stride);
    cp_async_commit();
    cp_async_wait<1>();  // Q, dO (K, V tile 0 may still be in flight)
    __syncthreads();
    uint32_t qa[kMt][kF][4], doa[kMt][kF][4];
    load_a<S, HS, kMt>(qa, s_q + 16 * kMt * warp * kLd, lane);
    load_a<S, HS, kMt>(doa, s_do + 16 * kMt * warp * kLd, lane);
    float D[kMt][2], lse2[kMt][2];  // rows 16 mt + g, + 8; lse in units of log2
    MS_UNROLL
    for (int mt = 0; mt < kMt; ++mt) {
        MS_UNROLL
        for (int r = 0; r < 2; ++r) {
            const int local = 16 * kMt * warp + 16 * mt + g + 8 * r, row = q0 + local;
            D[mt][r] = quad_row_dot<S, HS>(s_do + local * kLd, o_base + static_cast<int64_t>(row) * C, row < T, t);
            lse2[mt][r] = row < T ? lse[(static_cast<int64_t>(b) * NH + h) * T + row] * kLog2e : 0.0f;
        }
    }

    float dq[kMt][HS / 8][4];
    zero(dq);
    for (int k0 = 0, buf = 0; k0 < k_end; k0 += kBc, buf ^= 1) {
        cp_async_wait<0>();
        __syncthreads();  // this K, V tile has landed, and every warp is done with the previous one (buffer buf ^ 1)
        if (k0 + kBc < k_end) {
            S* next = s_kv + (buf ^ 1) * 2 * kBc * kLd;
            load_tile<S, HS, kBc>(next, q_base + C, k0 + kBc, T, stride);
            load_tile<S, HS, kBc>(next + kBc * kLd, q_base + 2 * C, k0 + kBc, T, stride);
            cp_async_commit();
        }
        if (k0 > w0) continue;
        const S* s_k = s_kv + buf * 2 * kBc * kLd;
        const S* s_v = s_k + kBc * kLd;

        // one 16-key block at a time: nothing crosses blocks in the backward, and S, dP of one block are 16 kMt
        // registers instead of 64 kMt
        MS_UNROLL
        for (int jj = 0; jj < kJ; ++jj) {
            if (k0 + 16 * jj > w0 + 16 * kMt - 1) continue;
            float s[kMt][2][4], dp[kMt][2][4];
            zero(s);
            zero(dp);
            mma_abt<S, HS, kMt>(s, qa, s_k + 16 * jj * kLd, lane);    // S = Q K^T
            mma_abt<S, HS, kMt>(dp, doa, s_v + 16 * jj * kLd, lane);  // dP = dO V^T
            uint32_t dsa[kMt][4];
            MS_UNROLL
            for (int mt = 0; mt < kMt; ++mt) {
                MS_UNROLL
                for (int j = 0; j < 2; ++j) {
                    MS_UNROLL
                    for (int i = 0; i < 4; ++i) {
                        const int row = w0 + 16 * mt + g + 8 * (i / 2), key = k0 + 16 * jj + 8 * j + 2 * t + i % 2;
                        const float p =
                            key <= row && row < T ? exp2f(s[mt][j][i] * scale_log2 - lse2[mt][i / 2]) : 0.0f;
                        s[mt][j][i] = p * (dp[mt][j][i] - D[mt][i / 2]);  // dS
                    }
                }
                to_a<S>(dsa[mt], s[mt][0], s[mt][1]);
            }
            mma_ab<S, HS, kMt>(dq, dsa, s_k + 16 * jj * kLd, lane);  // dQ += dS K
        }
    }
    const float factor[2] = {scale, scale};
    MS_UNROLL
    for (int mt = 0; mt < kMt; ++mt) {
        store_rows<S, HS>(dqkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS, stride,
                          w0 + 16 * mt, T, dq[mt], factor, lane);
    }
}

// dK and dV of one key tile: grid (key tiles of owned_rows(kMtDkv), NH, B), block kThreads; warp w owns keys
// k0 + 16w .. + 15.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_tc_backward_dkv_kernel(S* __restrict__ dqkv, const S* __restrict__ dout, const S* __restrict__ qkv,
                                     const S* __restrict__ out, const float* __restrict__ lse, int T, int NH,
                                     float scale) {
    using L = Smem<HS>;
    constexpr int kLd = L::kLd, kF = HS / 16, kMt = kMtDkv, kBr = owned_rows(kMt), kJ = kBc / 16;
    static_assert(kMt == 1, "one m16 tile of keys per warp");
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane % 4;
    S* s_k = reinterpret_cast<S*>(smem);  // (kBr, kLd)
    S* s_v = reinterpret_cast<S*>(smem + L::tile(kBr));
    S* s_qdo = reinterpret_cast<S*>(smem + 2 * L::tile(kBr));  // 2 x [Q (kBc, kLd), dO (kBc, kLd)]
    float* s_lse2 = reinterpret_cast<float*>(smem + 2 * L::tile(kBr) + 4 * L::kWalk);  // (kBc): lse * log2(e)
    float* s_d = s_lse2 + kBc;                                                         // (kBc): D
    const int h = blockIdx.y, b = blockIdx.z;
    const int k0 = blockIdx.x * kBr;  // the longest key tiles (most query tiles) have the lowest index
    const int w0 = k0 + 16 * warp;    // the warp's first key; it owns keys w0 + g and w0 + g + 8
    const int64_t C = static_cast<int64_t>(NH) * HS, stride = 3 * C;
    const S* q_base = qkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS;
    const S* do_base = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const S* o_base = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const float* lse_row = lse + (static_cast<int64_t>(b) * NH + h) * T;
    const float scale_log2 = scale * kLog2e;

    const int q_begin = k0 / kBc * kBc;
    load_tile<S, HS, kBr>(s_k, q_base + C, k0, T, stride);
    load_tile<S, HS, kBr>(s_v, q_base + 2 * C, k0, T, stride);
    cp_async_commit();
    load_tile<S, HS, kBc>(s_qdo, q_base, q_begin, T, stride);
    load_tile<S, HS, kBc>(s_qdo + kBc * kLd, do_base, q_begin, T, C);
    cp_async_commit();
    cp_async_wait<1>();  // K, V (Q, dO tile 0 may still be in flight)
    __syncthreads();
    uint32_t ka[kMt][kF][4], va[kMt][kF][4];
    load_a<S, HS, kMt>(ka, s_k + 16 * warp * kLd, lane);
    load_a<S, HS, kMt>(va, s_v + 16 * warp * kLd, lane);

    float dk[kMt][HS / 8][4], dv[kMt][HS / 8][4];
    zero(dk);
    zero(dv);
    for (int q0 = q_begin, buf = 0; q0 < T; q0 += kBc, buf ^= 1) {
        cp_async_wait<0>();
        __syncthreads();  // this Q, dO tile has landed; every warp is done with the previous one, lse and D
        if (q0 + kBc < T) {
            S* next = s_qdo + (buf ^ 1) * 2 * kBc * kLd;
            load_tile<S, HS, kBc>(next, q_base, q0 + kBc, T, stride);
            load_tile<S, HS, kBc>(next + kBc * kLd, do_base, q0 + kBc, T, C);
            cp_async_commit();
        }
        const S* s_q = s_qdo + buf * 2 * kBc * kLd;
        const S* s_do = s_q + kBc * kLd;
        for (int row = threadIdx.x / 4; row < kBc; row += kThreads / 4) {  // lse and D of the tile's rows, by quads
            const int query = q0 + row;
            const float D = quad_row_dot<S, HS>(s_do + row * kLd, o_base + static_cast<int64_t>(query) * C, query < T,
                                                threadIdx.x % 4);
            if (threadIdx.x % 4 == 0) {
                s_d[row] = D;
                s_lse2[row] = query < T ? lse_row[query] * kLog2e : 0.0f;
            }
        }
        __syncthreads();
        if (q0 + kBc - 1 < w0) continue;  // every query before every key of the warp

        MS_UNROLL
        for (int jj = 0; jj < kJ; ++jj) {  // one 16-query block at a time, as in the dQ kernel
            if (q0 + 16 * jj + 15 < w0) continue;
            float s[kMt][2][4], dp[kMt][2][4];
            zero(s);
            zero(dp);
            mma_abt<S, HS, kMt>(s, ka, s_q + 16 * jj * kLd, lane);    // S^T = K Q^T
            mma_abt<S, HS, kMt>(dp, va, s_do + 16 * jj * kLd, lane);  // dP^T = V dO^T
            MS_UNROLL
            for (int j = 0; j < 2; ++j) {
                MS_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const int key = w0 + g + 8 * (i / 2), c = 16 * jj + 8 * j + 2 * t + i % 2, query = q0 + c;
                    const float p = key <= query && query < T ? exp2f(s[0][j][i] * scale_log2 - s_lse2[c]) : 0.0f;
                    s[0][j][i] = p;                            // P^T
                    dp[0][j][i] = p * (dp[0][j][i] - s_d[c]);  // dS^T
                }
            }
            uint32_t pa[kMt][4], dsa[kMt][4];
            to_a<S>(pa[0], s[0][0], s[0][1]);
            mma_ab<S, HS, kMt>(dv, pa, s_do + 16 * jj * kLd, lane);  // dV += P^T dO
            to_a<S>(dsa[0], dp[0][0], dp[0][1]);
            mma_ab<S, HS, kMt>(dk, dsa, s_q + 16 * jj * kLd, lane);  // dK += dS^T Q
        }
    }
    S* dk_base = dqkv + static_cast<int64_t>(b) * T * stride + C + static_cast<int64_t>(h) * HS;
    const float dk_factor[2] = {scale, scale}, dv_factor[2] = {1.0f, 1.0f};
    store_rows<S, HS>(dk_base, stride, w0, T, dk[0], dk_factor, lane);
    store_rows<S, HS>(dk_base + C, stride, w0, T, dv[0], dv_factor, lane);
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

dim3 tile_grid(int B, int T, int NH, int rows) {
    return dim3(static_cast<unsigned>(ceil_div(T, rows)), static_cast<unsigned>(NH), static_cast<unsigned>(B));
}

template <class S, int HS>
void forward_hs(S* out, float* lse, const S* qkv, int B, int T, int NH, cudaStream_t stream) {
    const size_t bytes = Smem<HS>::kForward;
    opt_in_shared(attention_tc_forward_kernel<S, HS>, bytes);
    ms_launch(attention_tc_forward_kernel<S, HS>, tile_grid(B, T, NH, owned_rows(kMtForward)), dim3(kThreads), bytes,
              stream, out, lse, qkv, T, NH, 1.0f / sqrtf(static_cast<float>(HS)));
    MS_CUDA_LAUNCH_CHECK();
}

template <class S, int HS>
void backward_hs(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                 cudaStream_t stream) {
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    opt_in_shared(attention_tc_backward_dq_kernel<S, HS>, Smem<HS>::kBackwardDq);
    ms_launch(attention_tc_backward_dq_kernel<S, HS>, tile_grid(B, T, NH, owned_rows(kMtDq)), dim3(kThreads),
              Smem<HS>::kBackwardDq, stream, dqkv, dout, qkv, out, lse, T, NH, scale);
    MS_CUDA_LAUNCH_CHECK();
    opt_in_shared(attention_tc_backward_dkv_kernel<S, HS>, Smem<HS>::kBackwardDkv);
    ms_launch(attention_tc_backward_dkv_kernel<S, HS>, tile_grid(B, T, NH, owned_rows(kMtDkv)), dim3(kThreads),
              Smem<HS>::kBackwardDkv, stream, dqkv, dout, qkv, out, lse, T, NH, scale);
    MS_CUDA_LAUNCH_CHECK();
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class S>
void attention_tc_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    launch_attention_tc("tensor cores", B, T, NH, HS, {out, qkv},
                        [&](auto hs) { forward_hs<S, decltype(hs)::value>(out, lse, qkv, B, T, NH, stream); });
}

template <class S>
void attention_tc_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                           int HS, cudaStream_t stream) {
    launch_attention_tc("tensor cores", B, T, NH, HS, {dqkv, dout, qkv, out}, [&](auto hs) {
        backward_hs<S, decltype(hs)::value>(dqkv, dout, qkv, out, lse, B, T, NH, stream);
    });
}

#define MS_INSTANTIATE(S)                                                                                      \
    template void attention_tc_forward<S>(S*, float*, const S*, int, int, int, int, cudaStream_t);             \
    template void attention_tc_backward<S>(S*, const S*, const S*, const S*, const float*, int, int, int, int, \
                                           cudaStream_t);
MS_INSTANTIATE(::ms::bf16)
MS_INSTANTIATE(::ms::fp16)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
