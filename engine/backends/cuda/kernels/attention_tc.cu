/*
Causal self-attention (multi-head or grouped-query) on tensor cores for bf16 / fp16 activations, forward and backward,
FlashAttention-2 style on the PTX mma.sync m16n8k16 instruction (wrappers and fragment layouts: cuda/mma.cuh). The spec
is attention.cu (its layouts, equations and accumulation contract hold here unchanged); attention.cu's launchers
dispatch here when attention_tc_eligible() (attention_tc.cuh) holds.
Layout: qkv/dqkv (B, T, (NH + 2*NKV)*HS) with rows [Q | K | V] of NH, NKV, NKV heads, out/dout (B, T, NH*HS),
head-major; lse (B, NH, T) fp32; HS in {16, 32, 48, 64}; any B, NH, NKV dividing NH, and T >= 1 (tiles past T are
zero-filled and masked). Query head h reads key/value head h / G, G = NH / NKV. The forward and dQ kernels run per
query head and read their key/value head's K and V; the dK/dV and fused kernels run per key tile of a key/value head
and walk the query tiles of its G query heads in head order (the double buffer prefetching across a head boundary
as within a head), adding into the same dK, dV accumulators: G = 1 is multi-head attention, step for step. The
fused kernel's dQ adds, semaphores and dq_acc are per query head, so its ordering argument below holds per query
head unchanged (key tile j + 1 of a key/value head serves every query head of the group before key tile j does).

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
dqkv are rounded once, on store. The fused backward sums dQ per key tile in the mma's fp32 accumulators and across
key tiles in an fp32 buffer (descending key tiles), the split one in one accumulator chain (ascending keys): the
same products, so dQ differs between the two by at most one unit in the last place of S.

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
  fused    (key tile j; the default backward, one kernel, 5 products per tile pair where split does 7): the dK/dV
           kernel's walk and steps (dkv_step, shared, so dK and dV are the split kernels' bits), plus per walked
           query tile i the tile's share of dQ: dS^T, rounded to S as for dK, goes to shared memory (64 x 64, row
           stride 72); after a __syncthreads warp w forms dQ rows 16w .. 16w + 15 of tile i as dS K_j over the 64
           keys (A = dS by ldmatrix.x4.trans of dS^T, B = K by ldmatrix.x4.trans as in dQ: 32 fp32 registers at
           HS 64, live only in this phase) and adds them to the fp32 dq_acc (B, NH, T, HS) in scratch.
The split backward (dQ kernel, then dK/dV kernel; MS_CUDA_ATTENTION_BWD=split, attention.cu) has no cross-block
traffic at all. The fused one keeps dQ deterministic by a fixed order of the adds, not atomics: query tile i gets
key tiles i, i - 1, .., 0 (descending). The first (j = i, the diagonal) writes dq_acc without reading, the middle
ones read, add, write (ld/st.global.cg: through L2, as L1 is not coherent across SMs), the last (j = 0) writes
dQ * scale rounded once to S into dqkv (no conversion kernel; dQ rounded once, as split). A per-(b, h, query tile)
int32 semaphore counts the adds: key tile j waits until it is i - j (one thread spins on ld.acquire.gpu just
before the barrier that publishes dS^T, so the wait costs no extra barrier), adds, then __threadfence,
__syncthreads, st.release.gpu of i - j + 1 (common.cuh's wait_until_equal / release_store). Each block walks its
query tiles ascending, so key tile j + 1 added to tile i one walked tile before key tile j needs it: in steady
state nothing waits. A GPU does not promise to start blocks in blockIdx order, so a block takes its work item from
a ticket (atomicAdd on an int in scratch, as CUB's decoupled look-back): ticket t is key tile n - 1 - t / (B NH) of
head t % (B NH) (n = ceil(T / 64) key tiles), so every block waits only on work whose ticket was taken earlier, by
a block that is running or done: no deadlock whatever the dispatch order or occupancy. The ticket and the
semaphores are zeroed by a cudaMemsetAsync on the stream at each launch. Tickets go key tile by key tile over all
heads (j-major) rather than head by head: a model of the grid as 396 slots (132 SMs x 3) running unit-time tiles
ends, at B NH = 48 and 16 tiles, after 24 tile-times j-major and 27 head by head, against 16.5 for perfect balance.
Costs: the longest walks (key tile 0) take the last tickets, so the grid ends on full-length walks (the split dK/dV
kernel runs them first); dq_acc moves 2 x 4 HS bytes per query row and key tile (what FlashAttention-2's fp32
atomicAdd dQ moves too); 2 more barriers per walked tile than dK/dV. On the CPU emulation blocks run one at a time
in blockIdx order (ticket = blockIdx.x there): a wait that does not already hold aborts with a message instead of
hanging (cuda_emu.h), and a test takes the tickets in reverse to see it abort.
Query tiles run longest first (blockIdx.x reversed) so the causal triangle's long rows do not finish last. Tiles
and 16-row sub-blocks a warp's causal mask hides entirely are skipped (in the fused kernel their dS^T is stored as
0, and the dQ product skips 16-key slices past the warp's queries); the mask is applied only on tiles that straddle
the diagonal (and past T).
Shared memory (bytes, HS = 64; row stride HS + 8 elements, so ldmatrix's 8 row addresses hit distinct banks and stay
16-byte aligned): forward 55296 (Q, 2 x K, V), dQ 73728 (Q, dO, 2 x K, V), dK/dV 55808 (K, V, 2 x Q, dO, lse, D),
fused 65040 (dK/dV's, dS^T 9216, the ticket; 28176 / 40464 / 52752 at HS 16 / 32 / 48), dynamic (opted in past
48 KiB with cudaFuncSetAttribute). Scratch (fused): B NH T HS fp32 + (1 + B NH ceil(T / 64)) int32.
Registers: the fused kernel is capped for 3 blocks per SM on sm_90 (MS_FUSED_MIN_BLOCKS: 3 x 65 KB of shared memory
fit in 227 KB, and 3 x 128 threads at up to 170 registers in 64 K). What ptxas gives each kernel, and what has and has
not run on a GPU, is in docs/gpu.md; kMtForward / kMtDq / MS_FUSED_MIN_BLOCKS are the knobs to compare on a GPU.
The Hopper forward (attention_tc_forward_wgmma, sm_90a, HS 64): the forward's walk and equations with the products on
wgmma.mma_async m64n64k16 (cuda/wgmma.cuh): one warpgroup (the same 128 threads) owns 128 query rows as two m64 tiles;
per 64-key tile S = Q K^T takes Q and K from shared memory by descriptor, O += P V takes P from registers (the D
fragment of two 8-key blocks is the A fragment of a 16-key slice, as with mma.sync) and V as an MN-major operand.
Tiles are staged by cp.async in the no-swizzle core-matrix layout (WgSmem), each thread fencing its copies for
wgmma's async proxy before the barrier. Two schedules (WgmmaSchedule, the kernel's comment): serial, and the softmax
of tile j overlapping P_{j-1} V_{j-1} on the tensor cores (FlashAttention-3's overlap within a warpgroup). Room left
there: the backward on wgmma, a producer warp with TMA, two warpgroups ping-ponging.
Room left: HS 128, a ticket order that starts the long key tiles earlier. The former nvcuda::wmma version (scores
through shared memory) is bench/gpu/attention_wmma.cu, for comparison in gpu_kernel_bench.
*/
#include "engine/backends/cuda/kernels/attention_tc.cuh"
#include "engine/backends/cuda/mma.cuh"
#include "engine/backends/cuda/wgmma.cuh"

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
    // the fused backward: the dK/dV kernel's, dS^T (owned_rows(kMtDkv) keys x kBc queries) and the work item
    static constexpr int kLdDs = kBc + 8;
    static constexpr size_t kBackwardFused = kBackwardDkv + size_t(owned_rows(kMtDkv)) * kLdDs * 2 + 16;
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

// Query heads per key/value head, as a kernel is instantiated for: one (multi-head attention, NKV = NH: the group walk
// compiles away and the kernels keep the registers they had without grouped-query attention, the fused one within its
// cap, MS_FUSED_MIN_BLOCKS) or NH / NKV.
enum class HeadGroups : int { kOne, kGrouped };

// NKV as a kernel instantiated for kGroups sees it: NH for kOne.
template <HeadGroups kGroups>
__device__ __forceinline__ int kv_heads(int NH, int NKV) {
    return kGroups == HeadGroups::kOne ? NH : NKV;
}

// ----------------------------------------------------------------------------
// CUDA kernels

// grid (query tiles of owned_rows(kMtForward), NH, B), block kThreads.
template <class S, int HS, HeadGroups kGroups>
__global__ void __launch_bounds__(kThreads)
    attention_tc_forward_kernel(S* __restrict__ out, float* __restrict__ lse, const S* __restrict__ qkv, int T, int NH,
                                int NKV, float scale) {
    using L = Smem<HS>;
    constexpr int kLd = L::kLd, kF = HS / 16, kMt = kMtForward, kBr = owned_rows(kMt), kJ = kBc / 16;
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane % 4;
    S* s_q = reinterpret_cast<S*>(smem);                  // (kBr, kLd)
    S* s_kv = reinterpret_cast<S*>(smem + L::tile(kBr));  // 2 x [K (kBc, kLd), V (kBc, kLd)]
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBr;
    const int w0 = q0 + 16 * kMt * warp;  // the warp's first query row; it owns rows w0 + 16 mt + g (+ 8)
    const int64_t C = static_cast<int64_t>(NH) * HS;
    const QkvHead<S> qh = qkv_head(qkv, b, h, T, NH, kv_heads<kGroups>(NH, NKV), HS);
    const int64_t stride = qh.stride;
    const float scale_log2 = scale * kLog2e;

    const int k_end = q0 + kBr < T ? q0 + kBr : T;  // keys past the block's last row are masked for all of its rows
    load_tile<S, HS, kBr>(s_q, qh.q, q0, T, stride);
    cp_async_commit();
    load_tile<S, HS, kBc>(s_kv, qh.k, 0, T, stride);
    load_tile<S, HS, kBc>(s_kv + kBc * kLd, qh.v, 0, T, stride);
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
            load_tile<S, HS, kBc>(next, qh.k, k0 + kBc, T, stride);
            load_tile<S, HS, kBc>(next + kBc * kLd, qh.v, k0 + kBc, T, stride);
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
template <class S, int HS, HeadGroups kGroups>
__global__ void __launch_bounds__(kThreads)
    attention_tc_backward_dq_kernel(S* __restrict__ dqkv, const S* __restrict__ dout, const S* __restrict__ qkv,
                                    const S* __restrict__ out, const float* __restrict__ lse, int T, int NH, int NKV,
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
    const int64_t C = static_cast<int64_t>(NH) * HS;
    const QkvHead<S> qh = qkv_head(qkv, b, h, T, NH, kv_heads<kGroups>(NH, NKV), HS);
    const int64_t stride = qh.stride;
    const S* do_base = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const S* o_base = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const float scale_log2 = scale * kLog2e;

    const int k_end = q0 + kBr < T ? q0 + kBr : T;
    load_tile<S, HS, kBr>(s_q, qh.q, q0, T, stride);
    load_tile<S, HS, kBr>(s_do, do_base, q0, T, C);
    cp_async_commit();
    load_tile<S, HS, kBc>(s_kv, qh.k, 0, T, stride);
    load_tile<S, HS, kBc>(s_kv + kBc * kLd, qh.v, 0, T, stride);
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
            load_tile<S, HS, kBc>(next, qh.k, k0 + kBc, T, stride);
            load_tile<S, HS, kBc>(next + kBc * kLd, qh.v, k0 + kBc, T, stride);
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
        // from b and h rather than qh.q held across the walk: one 64-bit register fewer
        store_rows<S, HS>(dqkv + static_cast<int64_t>(b) * T * stride + static_cast<int64_t>(h) * HS, stride,
                          w0 + 16 * mt, T, dq[mt], factor, lane);
    }
}

// Where query head h of sequence b starts in the backward's tensors: Q at q (row stride (NH + 2 NKV) HS, as in dqkv),
// dO at dout and O at out (row stride C = NH HS), its lse row (T). Its key/value head's K and V: qkv_head, held only
// while they are loaded and stored (registers are tight in the fused kernel).
template <class S>
struct HeadRows {
    int64_t C, stride;
    const S* q;
    const S* dout;
    const S* out;
    const float* lse;
};

template <class S>
__device__ __forceinline__ HeadRows<S> head_rows(const S* qkv, const S* dout, const S* out, const float* lse, int b,
                                                 int h, int T, int NH, int NKV, int HS) {
    const QkvHead<S> qh = qkv_head(qkv, b, h, T, NH, NKV, HS);
    const int64_t C = static_cast<int64_t>(NH) * HS, head = static_cast<int64_t>(h) * HS;
    return {C,
            qh.stride,
            qh.q,
            dout + static_cast<int64_t>(b) * T * C + head,
            out + static_cast<int64_t>(b) * T * C + head,
            lse + (static_cast<int64_t>(b) * NH + h) * T};
}

// The next query head of the same key/value head: its Q, dO and O columns HS further, its lse row T further.
template <class S, int HS>
__device__ __forceinline__ void next_query_head(HeadRows<S>& hr, int T) {
    hr.q += HS;
    hr.dout += HS;
    hr.out += HS;
    hr.lse += T;
}

// The per-key-tile backward's shared steps, for the dK/dV kernel and the fused kernel alike (so both compute dK and dV
// with the same operations in the same order, and give the same bits).

// lse (in units of log2) and D = dO . O of the walked tile's kBc rows from q0 into s_lse2, s_d, by quads (0 past T).
template <class S, int HS>
__device__ __forceinline__ void stage_lse_d(float* s_lse2, float* s_d, const S* s_do, const HeadRows<S>& hr, int q0,
                                            int T) {
    for (int row = threadIdx.x / 4; row < kBc; row += kThreads / 4) {
        const int query = q0 + row;
        const float D = quad_row_dot<S, HS>(s_do + row * Smem<HS>::kLd, hr.out + static_cast<int64_t>(query) * hr.C,
                                            query < T, threadIdx.x % 4);
        if (threadIdx.x % 4 == 0) {
            s_d[row] = D;
            s_lse2[row] = query < T ? hr.lse[query] * kLog2e : 0.0f;
        }
    }
}

// One 16-query block jj of the walked Q, dO tile against the warp's 16 keys w0 .. w0 + 15: S^T = K Q^T,
// dP^T = V dO^T, P^T and dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q. dsa gets dS^T rounded to S (the A
// fragment of the dK product: rows are the keys, columns the 16 queries).
template <class S, int HS>
__device__ __forceinline__ void dkv_step(float (&dk)[1][HS / 8][4], float (&dv)[1][HS / 8][4], uint32_t (&dsa)[1][4],
                                         const uint32_t (&ka)[1][HS / 16][4], const uint32_t (&va)[1][HS / 16][4],
                                         const S* s_q, const S* s_do, const float* s_lse2, const float* s_d, int jj,
                                         int w0, int q0, int T, float scale_log2, int lane) {
    constexpr int kLd = Smem<HS>::kLd;
    const int g = lane >> 2, t = lane % 4;
    float s[1][2][4], dp[1][2][4];
    zero(s);
    zero(dp);
    mma_abt<S, HS, 1>(s, ka, s_q + 16 * jj * kLd, lane);    // S^T = K Q^T
    mma_abt<S, HS, 1>(dp, va, s_do + 16 * jj * kLd, lane);  // dP^T = V dO^T
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
    uint32_t pa[1][4];
    to_a<S>(pa[0], s[0][0], s[0][1]);
    mma_ab<S, HS, 1>(dv, pa, s_do + 16 * jj * kLd, lane);  // dV += P^T dO
    to_a<S>(dsa[0], dp[0][0], dp[0][1]);
    mma_ab<S, HS, 1>(dk, dsa, s_q + 16 * jj * kLd, lane);  // dK += dS^T Q
}

__device__ __forceinline__ void store_u32(void* p, uint32_t v) {
#if defined(__CUDACC__)
    *reinterpret_cast<uint32_t*>(p) = v;
#else
    std::memcpy(p, &v, 4);
#endif
}

// dq_acc's two floats at p, read / written through L2 (ld.global.cg / st.global.cg): another block wrote them, and
// L1 is not coherent across SMs.
__device__ __forceinline__ void load_l2(const float* p, float& x, float& y) {
#if defined(__CUDACC__)
    const float2 v = __ldcg(reinterpret_cast<const float2*>(p));
    x = v.x;
    y = v.y;
#else
    x = p[0];
    y = p[1];
#endif
}
__device__ __forceinline__ void store_l2(float* p, float x, float y) {
#if defined(__CUDACC__)
    __stcg(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
    p[0] = x;
    p[1] = y;
#endif
}

// The dK/dV and fused kernels' start: K and V of the key tile at k0 (of kvh's key/value head) into shared memory and
// from there into the warp's A fragments (ka, va), and the first walked Q, dO tile (rows q0 .. of hr's query head)
// into buffer 0 of s_qdo, left in flight.
template <class S, int HS>
__device__ __forceinline__ void dkv_load_key_tile(uint32_t (&ka)[kMtDkv][HS / 16][4],
                                                  uint32_t (&va)[kMtDkv][HS / 16][4], S* s_k, S* s_v, S* s_qdo,
                                                  const QkvHead<S>& kvh, const HeadRows<S>& hr, int k0, int q0, int T,
                                                  int warp, int lane) {
    constexpr int kLd = Smem<HS>::kLd, kBr = owned_rows(kMtDkv);
    load_tile<S, HS, kBr>(s_k, kvh.k, k0, T, hr.stride);
    load_tile<S, HS, kBr>(s_v, kvh.v, k0, T, hr.stride);
    cp_async_commit();
    load_tile<S, HS, kBc>(s_qdo, hr.q, q0, T, hr.stride);
    load_tile<S, HS, kBc>(s_qdo + kBc * kLd, hr.dout, q0, T, hr.C);
    cp_async_commit();
    cp_async_wait<1>();  // K, V (Q, dO tile 0 may still be in flight)
    __syncthreads();
    load_a<S, HS, kMtDkv>(ka, s_k + 16 * warp * kLd, lane);
    load_a<S, HS, kMtDkv>(va, s_v + 16 * warp * kLd, lane);
}

// The top of the walked Q, dO tile at q0 (in buffer buf of s_qdo): waits until its copies have landed and every warp
// is done with the previous tile (and what the walk staged for it), then issues the next tile's copies into the other
// buffer: the head's next tile, or past its last one the next query head's first (at q_begin) unless this is the
// group's last head. Returns the tile's Q; its dO follows at + kBc kLd.
template <class S, int HS>
__device__ __forceinline__ const S* dkv_walk_tile(S* s_qdo, const HeadRows<S>& hr, int q0, int q_begin, bool last_head,
                                                  int buf, int T) {
    constexpr int kLd = Smem<HS>::kLd;
    cp_async_wait<0>();
    __syncthreads();
    S* next = s_qdo + (buf ^ 1) * 2 * kBc * kLd;
    if (q0 + kBc < T) {
        load_tile<S, HS, kBc>(next, hr.q, q0 + kBc, T, hr.stride);
        load_tile<S, HS, kBc>(next + kBc * kLd, hr.dout, q0 + kBc, T, hr.C);
        cp_async_commit();
    } else if (!last_head) {  // next_query_head's Q and dO
        load_tile<S, HS, kBc>(next, hr.q + HS, q_begin, T, hr.stride);
        load_tile<S, HS, kBc>(next + kBc * kLd, hr.dout + HS, q_begin, T, hr.C);
        cp_async_commit();
    }
    return s_qdo + buf * 2 * kBc * kLd;
}

// The dK/dV and fused kernels' end: the warp's dK (times scale) and dV rows w0 .. w0 + 15 into dqkv, rounded once, at
// the columns of kvh's K and V in qkv (dqkv has qkv's layout).
template <class S, int HS>
__device__ __forceinline__ void dkv_store(S* dqkv, const S* qkv, const QkvHead<S>& kvh, int T, int w0,
                                          const float (&dk)[kMtDkv][HS / 8][4], const float (&dv)[kMtDkv][HS / 8][4],
                                          float scale, int lane) {
    const float dk_factor[2] = {scale, scale}, dv_factor[2] = {1.0f, 1.0f};
    store_rows<S, HS>(dqkv + (kvh.k - qkv), kvh.stride, w0, T, dk[0], dk_factor, lane);
    store_rows<S, HS>(dqkv + (kvh.v - qkv), kvh.stride, w0, T, dv[0], dv_factor, lane);
}

// dK and dV of one key tile of a key/value head: grid (key tiles of owned_rows(kMtDkv), NKV, B), block kThreads; warp w
// owns keys k0 + 16w .. + 15. The walk covers the group's query heads one after the other.
template <class S, int HS, HeadGroups kGroups>
__global__ void __launch_bounds__(kThreads)
    attention_tc_backward_dkv_kernel(S* __restrict__ dqkv, const S* __restrict__ dout, const S* __restrict__ qkv,
                                     const S* __restrict__ out, const float* __restrict__ lse, int T, int NH, int NKV,
                                     float scale) {
    using L = Smem<HS>;
    constexpr int kLd = L::kLd, kF = HS / 16, kMt = kMtDkv, kBr = owned_rows(kMt), kJ = kBc / 16;
    static_assert(kMt == 1, "one m16 tile of keys per warp");
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    S* s_k = reinterpret_cast<S*>(smem);  // (kBr, kLd)
    S* s_v = reinterpret_cast<S*>(smem + L::tile(kBr));
    S* s_qdo = reinterpret_cast<S*>(smem + 2 * L::tile(kBr));  // 2 x [Q (kBc, kLd), dO (kBc, kLd)]
    float* s_lse2 = reinterpret_cast<float*>(smem + 2 * L::tile(kBr) + 4 * L::kWalk);  // (kBc): lse * log2(e)
    float* s_d = s_lse2 + kBc;                                                         // (kBc): D
    NKV = kv_heads<kGroups>(NH, NKV);
    const int kv = blockIdx.y, b = blockIdx.z, G = kGroups == HeadGroups::kOne ? 1 : NH / NKV;
    const int k0 = blockIdx.x * kBr;  // the longest key tiles (most query tiles) have the lowest index
    const int w0 = k0 + 16 * warp;    // the warp's first key; it owns keys w0 + g and w0 + g + 8
    HeadRows<S> hr = head_rows(qkv, dout, out, lse, b, kv * G, T, NH, NKV, HS);  // the group's first query head
    const float scale_log2 = scale * kLog2e;

    const int q_begin = k0 / kBc * kBc;
    uint32_t ka[kMt][kF][4], va[kMt][kF][4];
    dkv_load_key_tile<S, HS>(ka, va, s_k, s_v, s_qdo, qkv_head(qkv, b, kv * G, T, NH, NKV, HS), hr, k0, q_begin, T,
                             warp, lane);

    float dk[kMt][HS / 8][4], dv[kMt][HS / 8][4];
    zero(dk);
    zero(dv);
    int buf = 0;
    for (int head = 0; head < G; ++head, next_query_head<S, HS>(hr, T)) {
        for (int q0 = q_begin; q0 < T; q0 += kBc, buf ^= 1) {
            // this Q, dO tile has landed; every warp is done with the previous one, lse and D
            const S* s_q =
                dkv_walk_tile<S, HS>(s_qdo, hr, q0, q_begin, kGroups == HeadGroups::kOne || head == G - 1, buf, T);
            const S* s_do = s_q + kBc * kLd;
            stage_lse_d<S, HS>(s_lse2, s_d, s_do, hr, q0, T);
            __syncthreads();
            if (q0 + kBc - 1 < w0) continue;  // every query before every key of the warp

            MS_UNROLL
            for (int jj = 0; jj < kJ; ++jj) {  // one 16-query block at a time, as in the dQ kernel
                if (q0 + 16 * jj + 15 < w0) continue;
                uint32_t dsa[kMt][4];
                dkv_step<S, HS>(dk, dv, dsa, ka, va, s_q, s_do, s_lse2, s_d, jj, w0, q0, T, scale_log2, lane);
            }
        }
    }
    dkv_store<S, HS>(dqkv, qkv, qkv_head(qkv, b, kv * G, T, NH, NKV, HS), T, w0, dk, dv, scale, lane);
}

// Blocks per SM the fused backward's registers are capped for: 3 on sm_90 (<= 170 registers; its 65 KB of shared memory
// fit 3 times in 227 KB, as the dK/dV kernel's 167 registers do), 1 elsewhere (sm_80's 164 KB fit 2 blocks whatever
// the registers, and a cap there would only add spills).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MS_FUSED_MIN_BLOCKS 3
#else
#define MS_FUSED_MIN_BLOCKS 1
#endif

// The order in which the fused kernel's blocks take their work items (tickets).
enum class WorkOrder : int {
    kDependenciesFirst,  // per (b, h), key tile j + 1 before key tile j: a block only waits on earlier tickets
    kReversed,           // key tile 0 first: waits on blocks that have not started (the emulation's death test)
};

// The fused backward of one key tile of a key/value head: dK and dV as the dK/dV kernel, and the tile's share of dQ,
// dS K_j for every query tile i of every query head h of the group it visits, added to the fp32 dq_acc (B, NH, T, HS)
// after key tiles i, i - 1, .., j + 1 (semaphore i of query head h counts them); key tile 0 adds last and writes dQ,
// rounded once, into dqkv. 1-D grid of (key tiles) x NKV x B blocks of kThreads; sync[0] is the work ticket,
// sync[1 + (b NH + h) tiles + i] the semaphores (zero at launch).
template <class S, int HS, HeadGroups kGroups>
__global__ void __launch_bounds__(kThreads, MS_FUSED_MIN_BLOCKS)
    attention_tc_backward_kernel(S* __restrict__ dqkv, float* __restrict__ dq_acc, int* __restrict__ sync,
                                 const S* __restrict__ dout, const S* __restrict__ qkv, const S* __restrict__ out,
                                 const float* __restrict__ lse, int B, int T, int NH, int NKV, float scale,
                                 WorkOrder order) {
    using L = Smem<HS>;
    constexpr int kLd = L::kLd, kLdDs = L::kLdDs, kF = HS / 16, kMt = kMtDkv, kBr = owned_rows(kMt), kJ = kBc / 16;
    static_assert(kMt == 1 && kBr == kBc,
                  "key tiles as tall as query tiles: query tile i gets dQ from key tiles 0 .. i");
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane % 4;
    S* s_k = reinterpret_cast<S*>(smem);  // (kBr, kLd)
    S* s_v = reinterpret_cast<S*>(smem + L::tile(kBr));
    S* s_qdo = reinterpret_cast<S*>(smem + 2 * L::tile(kBr));  // 2 x [Q (kBc, kLd), dO (kBc, kLd)]
    float* s_lse2 = reinterpret_cast<float*>(smem + 2 * L::tile(kBr) + 4 * L::kWalk);  // (kBc): lse * log2(e)
    float* s_d = s_lse2 + kBc;                                                         // (kBc): D
    S* s_ds = reinterpret_cast<S*>(s_d + kBc);  // (kBr keys, kLdDs): dS^T of the walked tile, rounded to S
    int* s_item = reinterpret_cast<int*>(s_ds + kBr * kLdDs);

    // the work item: (b, key/value head kv, key tile j), key tiles of each key/value head from the last (shortest walk)
    // to 0
    if (threadIdx.x == 0) *s_item = atomicAdd(sync, 1);
    __syncthreads();
    NKV = kv_heads<kGroups>(NH, NKV);
    const int tiles = (T + kBr - 1) / kBr, heads = B * NKV, item = *s_item;
    const int G = kGroups == HeadGroups::kOne ? 1 : NH / NKV;
    const int j = order == WorkOrder::kDependenciesFirst ? tiles - 1 - item / heads : item / heads;
    const int b = item % heads / NKV, h0 = item % heads % NKV * G;  // h0: the group's first query head
    const int k0 = j * kBr, w0 = k0 + 16 * warp;
    HeadRows<S> hr = head_rows(qkv, dout, out, lse, b, h0, T, NH, NKV, HS);
    const float scale_log2 = scale * kLog2e;

    uint32_t ka[kMt][kF][4], va[kMt][kF][4];
    dkv_load_key_tile<S, HS>(ka, va, s_k, s_v, s_qdo, qkv_head(qkv, b, h0, T, NH, NKV, HS), hr, k0, k0, T, warp, lane);

    float dk[kMt][HS / 8][4], dv[kMt][HS / 8][4];
    zero(dk);
    zero(dv);
    int buf = 0;
    for (int head = 0; head < G; ++head, next_query_head<S, HS>(hr, T)) {  // one walk for kOne
        const int h = h0 + head;
        for (int q0 = k0; q0 < T; q0 += kBc, buf ^= 1) {
            // this Q, dO tile has landed; every warp is done with the previous one, lse, D and dS^T
            const S* s_q =
                dkv_walk_tile<S, HS>(s_qdo, hr, q0, k0, kGroups == HeadGroups::kOne || head == G - 1, buf, T);
            const S* s_do = s_q + kBc * kLd;
            stage_lse_d<S, HS>(s_lse2, s_d, s_do, hr, q0, T);
            __syncthreads();

            MS_UNROLL
            for (int jj = 0; jj < kJ; ++jj) {  // dK, dV as the dK/dV kernel; dS^T (0 where masked) into s_ds
                uint32_t dsa[kMt][4] = {};
                if (q0 + 16 * jj + 15 >= w0) {
                    dkv_step<S, HS>(dk, dv, dsa, ka, va, s_q, s_do, s_lse2, s_d, jj, w0, q0, T, scale_log2, lane);
                }
                S* ds = s_ds + (16 * warp + g) * kLdDs + 16 * jj + 2 * t;  // the A fragment's layout (mma.cuh)
                store_u32(ds, dsa[0][0]);
                store_u32(ds + 8 * kLdDs, dsa[0][1]);
                store_u32(ds + 8, dsa[0][2]);
                store_u32(ds + 8 * kLdDs + 8, dsa[0][3]);
            }
            // query tile i's dQ has key tiles i .. j + 1 added (none for the diagonal tile, i = j); one wait per block,
            // before the barrier that publishes dS^T, in steady state already satisfied (key tile j + 1 added its share
            // one walked tile earlier)
            const int i = q0 / kBc;
            int* sems =
                sync + 1 + (static_cast<int64_t>(b) * NH + h) * tiles;  // (tiles): contributions to query tile i
            if (threadIdx.x == 0) wait_until_equal(sems + i, i - j);
            __syncthreads();

            // dQ of the warp's 16 queries qw .. qw + 15 from this key tile: dS K_j over the block's 64 keys, A = dS
            // from the dS^T rows of every warp (ldmatrix.trans of s_ds), B = K read transposed as in the dQ kernel
            const int qw = q0 + 16 * warp;
            float dq[1][HS / 8][4];
            zero(dq);
            if (qw < T) {
                MS_UNROLL
                for (int kk = 0; kk < kJ; ++kk) {
                    if (k0 + 16 * kk > qw + 15) continue;  // every key after every query of the warp: dS = 0
                    uint32_t dsa[1][4];
                    ldmatrix_x4_trans(dsa[0], s_ds + (16 * kk + 8 * (lane / 16) + lane % 8) * kLdDs + 16 * warp +
                                                  8 * ((lane / 8) % 2));
                    mma_ab<S, HS, 1>(dq, dsa, s_k + 16 * kk * kLd, lane);  // dQ_i += dS K_j
                }
            }
            // the ordered add: the first contributor (i = j) writes, the others read, add, write; the last (j = 0)
            // writes dQ * scale rounded to S into dqkv instead
            const bool first = i == j, last = j == 0;
            MS_UNROLL
            for (int r = 0; r < 2; ++r) {
                const int row = qw + g + 8 * r;
                if (row >= T) continue;
                // from the kernel's parameters rather than per-head base pointers held across the walk: two 64-bit
                // registers fewer under the sm_90 cap (MS_FUSED_MIN_BLOCKS)
                float* acc = dq_acc + ((static_cast<int64_t>(b) * NH + h) * T + row) * HS + 2 * t;  // (B, NH, T, HS)
                S* d = dqkv + (static_cast<int64_t>(b) * T + row) * hr.stride + h * HS + 2 * t;
                MS_UNROLL
                for (int jn = 0; jn < HS / 8; ++jn) {
                    float x = dq[0][jn][2 * r], y = dq[0][jn][2 * r + 1];
                    if (!first) {
                        float sum_x, sum_y;
                        load_l2(acc + 8 * jn, sum_x, sum_y);
                        x = sum_x + x;
                        y = sum_y + y;
                    }
                    if (last) {
                        store_u32(d + 8 * jn, pack2<S>(x * scale, y * scale));
                    } else {
                        store_l2(acc + 8 * jn, x, y);
                    }
                }
            }
            __threadfence();
            __syncthreads();  // the block's adds are visible device-wide before the semaphore says so
            if (threadIdx.x == 0 && !last) release_store(sems + i, i - j + 1);
        }
    }
    // the key/value head from the kernel's parameters, not held across the walk (registers, as for dq_acc above)
    dkv_store<S, HS>(dqkv, qkv, qkv_head(qkv, b, h0, T, NH, NKV, HS), T, w0, dk, dv, scale, lane);
}

// ----------------------------------------------------------------------------
// The Hopper forward (wgmma, sm_90a; attention_tc_forward_wgmma)

// m64 tiles per block: one warpgroup (kThreads) owns 64 kWgMt query rows, each wgmma of its walk a 64-row product.
constexpr int kWgMt = 2;
constexpr int kWgRows = 64 * kWgMt;
constexpr int kWgHS = kAttentionWgmmaHS;  // the head size it is instantiated for (GPT-2's 64)
// (K, V) tile buffers per schedule (the kernel's header)
__host__ __device__ constexpr int wg_stages(WgmmaSchedule schedule) {
    return schedule == WgmmaSchedule::kOverlapped ? 3 : 2;
}

// Shared memory of the wgmma forward: tiles in the no-swizzle core-matrix layout of wgmma.cuh, row r, column c of a
// (rows, HS) tile at byte (r / 8) kBand + (c / 8) kChunk + (r % 8) 16 + (c % 8) 2, so 16-byte column chunk c / 8 of
// rows 8 b .. 8 b + 7 is one 128-byte core matrix; a tile is K-major for Q and K (SBO kBand, LBO kChunk) and MN-major
// for V as the (keys, head) B operand of P V (SBO kChunk, LBO kBand). No padding: each core matrix is 128 contiguous
// bytes, which the tensor cores read without bank conflicts.
struct WgSmem {
    static constexpr uint32_t kChunk = 128;                // bytes between column chunks of a band
    static constexpr uint32_t kBand = kWgHS / 8 * kChunk;  // bytes between 8-row bands
    __host__ __device__ static constexpr size_t tile(int rows) { return size_t(rows) / 8 * kBand; }
    // Q and `stages` buffers of a (K, V) tile pair
    static constexpr size_t forward(int stages) { return tile(kWgRows) + 2 * size_t(stages) * tile(kBc); }
};

// As load_tile, into the core-matrix layout: copy i (16 bytes) goes to byte 16 i of the tile, which is row
// 8 (i / kWgHS) + i % 8, column chunk (i / 8) % (kWgHS / 8): consecutive threads fill consecutive 16 bytes of shared
// memory, and a warp reads 8 rows x 64 bytes of global memory (whole 32-byte sectors).
template <class S, int kRows>
__device__ __forceinline__ void load_tile_cm(S* dst, const S* src, int row0, int T, int64_t stride) {
    constexpr int kChunks = kWgHS / 8;
    for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
        const int r = 8 * (i / (8 * kChunks)) + i % 8, c = 8 * ((i / 8) % kChunks);
        const bool live = row0 + r < T;
        cp_async16(dst + 8 * i, src + static_cast<int64_t>(live ? row0 + r : 0) * stride + c, live);
    }
}

// The online softmax of one walked tile for the wgmma forward, on the S accumulators of m64 tile rows q0m + 16 warp +
// g (+ 8) (the mma.sync forward's equations and order, written out there over its [16-key block][m16 tile] layout; one
// helper for both, over an accessor, compiled to more registers in both kernels: docs/gpu.md): scale and mask s (in
// units of scale_log2), update the running max m and the running sum l (this thread's share), and leave exp2(s - m) in
// s; returns nothing in O, whose rescaling by `correction` the caller does once the products writing O are done.
__device__ __forceinline__ void wg_softmax(float (&s)[kBc / 8][4], float (&m)[2], float (&l)[2], float (&correction)[2],
                                           int q0m, int k0, float scale_log2, int warp, int g, int t) {
    const int r0 = q0m + 16 * warp + g;  // this thread's rows r0, r0 + 8
    const bool diagonal = k0 + kBc - 1 > q0m;
    float tile_max[2] = {-INFINITY, -INFINITY};
    MS_UNROLL
    for (int j = 0; j < kBc / 8; ++j) {
        MS_UNROLL
        for (int i = 0; i < 4; ++i) {
            const int row = r0 + 8 * (i / 2), key = k0 + 8 * j + 2 * t + i % 2;
            float& x = s[j][i];
            x = diagonal && key > row ? -INFINITY : x * scale_log2;
            tile_max[i / 2] = fmaxf(tile_max[i / 2], x);
        }
    }
    MS_UNROLL
    for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
        correction[r] = exp2f(m[r] - m_new);
        m[r] = m_new;
        l[r] *= correction[r];
    }
    MS_UNROLL
    for (int j = 0; j < kBc / 8; ++j) {
        MS_UNROLL
        for (int i = 0; i < 4; ++i) {
            float& x = s[j][i];
            x = exp2f(x - m[i / 2]);
            l[i / 2] += x;
        }
    }
}

// grid (query tiles of kWgRows, NH, B), block kThreads (one warpgroup). The forward kernel's walk, equations and
// rounding (P rounded to S for P V, l summing the fp32 P, O and lse as there), with the products on wgmma: per key
// tile S = Q K^T as HS / 16 m64n64k16 per m64 tile (A = Q, B = K, both from shared memory), then O += P V as
// kBc / 16 m64n64k16 (A = P from registers, B = V MN-major). Each product sums its 16 k in one instruction and the
// k-slices in order, as the mma.sync kernel does, so on the CPU emulation the two give the same bits.
// Schedules (WgmmaSchedule): kSerial issues S_j, waits, runs the softmax, issues P_j V_j and waits, with the tiles
// double-buffered; kOverlapped issues S_j and P_{j-1} V_{j-1} together, waits for S_j only and runs the softmax of
// tile j while the tensor cores still add P_{j-1} V_{j-1} (FlashAttention-3's overlap within a warpgroup), then
// waits for that and rescales O: the same operations on O in the same order, with three tile buffers (V_{j-1} in use,
// K_j in use, tile j + 1 landing).
// Every m64 tile runs every walked tile, with no branch around a wgmma (a branch there makes ptxas serialise the
// wgmma and hold more registers). On the block's last key tile the first m64 tile sees no key (k0 is past its rows):
// there its masked row max leaves m, l and O exactly as they were (correction exp2(0) = 1, P = 0), as its running
// max is already finite from key tile 0.
template <class S, HeadGroups kGroups, WgmmaSchedule kSchedule>
__global__ void __launch_bounds__(kThreads)
    attention_wgmma_forward_kernel(S* __restrict__ out, float* __restrict__ lse, const S* __restrict__ qkv, int T,
                                   int NH, int NKV, float scale) {
    constexpr int HS = kWgHS, kJ = kBc / 8;  // kJ 8-key accumulator blocks per walked tile
    constexpr bool kOverlap = kSchedule == WgmmaSchedule::kOverlapped;
    constexpr int kStages = wg_stages(kSchedule);
    using L = WgSmem;
    MS_TC_SHARED(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane % 4;
    S* s_q = reinterpret_cast<S*>(smem);            // (kWgRows, HS)
    unsigned char* s_kv = smem + L::tile(kWgRows);  // kStages x [K (kBc, HS), V (kBc, HS)]
    const auto k_tile = [&](int j) { return s_kv + (j % kStages) * 2 * L::tile(kBc); };
    const int h = blockIdx.y, b = blockIdx.z;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kWgRows;
    const int64_t C = static_cast<int64_t>(NH) * HS;
    const QkvHead<S> qh = qkv_head(qkv, b, h, T, NH, kv_heads<kGroups>(NH, NKV), HS);
    const int64_t stride = qh.stride;
    const float scale_log2 = scale * kLog2e;
    const auto load_kv = [&](int j) {
        load_tile_cm<S, kBc>(reinterpret_cast<S*>(k_tile(j)), qh.k, j * kBc, T, stride);
        load_tile_cm<S, kBc>(reinterpret_cast<S*>(k_tile(j) + L::tile(kBc)), qh.v, j * kBc, T, stride);
        cp_async_commit();
    };
    // O += P V over the kBc keys of walked tile j, for every m64 tile (issued, not waited)
    const auto issue_pv = [&](float(&o)[kWgMt][HS / 8][4], const uint32_t(&pa)[kWgMt][kBc / 16][4], int j) {
        wgmma_fence();
        MS_UNROLL
        for (int mt = 0; mt < kWgMt; ++mt) {
            wgmma_fence_operand(o[mt]);
            MS_UNROLL
            for (int jj = 0; jj < kBc / 16; ++jj) {
                wgmma_m64n64k16_rs_mn<S>(o[mt], pa[mt][jj],
                                         wgmma_desc(k_tile(j) + L::tile(kBc) + jj * 2 * L::kBand, L::kBand, L::kChunk),
                                         true);
            }
        }
        wgmma_commit();
    };

    const int k_end = q0 + kWgRows < T ? q0 + kWgRows : T, tiles = (k_end + kBc - 1) / kBc;
    load_tile_cm<S, kWgRows>(s_q, qh.q, q0, T, stride);
    load_kv(0);  // one group with Q

    float o[kWgMt][HS / 8][4];
    zero(o);
    float m[kWgMt][2], l[kWgMt][2];  // as the mma.sync forward's: rows 64 mt + 16 warp + g (+ 8)
    MS_UNROLL
    for (int mt = 0; mt < kWgMt; ++mt) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    uint32_t pa[kWgMt][kBc / 16][4];  // P of the last tile's softmax, rounded: live until the P V reading it is done
    for (int j = 0; j < tiles; ++j) {
        const int k0 = j * kBc;
        cp_async_wait<0>();
        fence_proxy_async_shared();  // what this thread's copies wrote is visible to wgmma (the async proxy)
        // tile j (and Q) have landed; every product reading the buffer tile j + 1 goes to is done (waited before)
        __syncthreads();
        if (j + 1 < tiles) load_kv(j + 1);

        float s[kWgMt][kJ][4];
        wgmma_fence();
        MS_UNROLL
        for (int mt = 0; mt < kWgMt; ++mt) {
            wgmma_fence_operand(s[mt]);
            MS_UNROLL
            for (int f = 0; f < HS / 16; ++f) {
                wgmma_m64n64k16_ss<S>(s[mt],
                                      wgmma_desc(smem + mt * L::tile(64) + f * 2 * L::kChunk, L::kChunk, L::kBand),
                                      wgmma_desc(k_tile(j) + f * 2 * L::kChunk, L::kChunk, L::kBand), f > 0);
            }
        }
        wgmma_commit();
        if (kOverlap && j > 0) {
            issue_pv(o, pa, j - 1);
            wgmma_wait<1>();  // S_j; P_{j-1} V_{j-1} may still run
        } else {
            wgmma_wait<0>();
        }
        float correction[kWgMt][2];
        MS_UNROLL
        for (int mt = 0; mt < kWgMt; ++mt) {
            wgmma_fence_operand(s[mt]);
            wg_softmax(s[mt], m[mt], l[mt], correction[mt], q0 + 64 * mt, k0, scale_log2, warp, g, t);
        }
        if (kOverlap) wgmma_wait<0>();  // P_{j-1} V_{j-1} is in O
        MS_UNROLL
        for (int mt = 0; mt < kWgMt; ++mt) {
            wgmma_fence_operand(o[mt]);
            MS_UNROLL
            for (int jj = 0; jj < HS / 8; ++jj) {
                MS_UNROLL
                for (int i = 0; i < 4; ++i) o[mt][jj][i] *= correction[mt][i / 2];
            }
            MS_UNROLL
            for (int jj = 0; jj < kBc / 16; ++jj) to_a<S>(pa[mt][jj], s[mt][2 * jj], s[mt][2 * jj + 1]);
        }
        if (!kOverlap) {
            issue_pv(o, pa, j);
            wgmma_wait<0>();
        }
    }
    if (kOverlap) {
        issue_pv(o, pa, tiles - 1);
        wgmma_wait<0>();
    }
    float* lse_row = lse + (static_cast<int64_t>(b) * NH + h) * T;
    MS_UNROLL
    for (int mt = 0; mt < kWgMt; ++mt) {
        wgmma_fence_operand(o[mt]);
        const int w0 = q0 + 64 * mt + 16 * warp;
        float inv_l[2];
        MS_UNROLL
        for (int r = 0; r < 2; ++r) {
            l[mt][r] = quad_sum(l[mt][r]);
            inv_l[r] = 1.0f / l[mt][r];
        }
        store_rows<S, HS>(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS, C, w0, T, o[mt], inv_l,
                          lane);
        MS_UNROLL
        for (int r = 0; r < 2; ++r) {
            const int row = w0 + g + 8 * r;
            if (t == 0 && row < T) lse_row[row] = m[mt][r] / kLog2e + logf(l[mt][r]);
        }
    }
}

#if defined(__CUDACC__)
// Writes 1 to *out when this file was compiled for sm_90a (wgmma), 0 otherwise (attention_wgmma_supported).
__global__ void wgmma_compiled_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}
#endif

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
void forward_hs(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, cudaStream_t stream) {
    const size_t bytes = Smem<HS>::kForward;
    const auto kernel = NKV == NH ? attention_tc_forward_kernel<S, HS, HeadGroups::kOne>
                                  : attention_tc_forward_kernel<S, HS, HeadGroups::kGrouped>;
    opt_in_shared(kernel, bytes);
    ms_launch(kernel, tile_grid(B, T, NH, owned_rows(kMtForward)), dim3(kThreads), bytes, stream, out, lse, qkv, T, NH,
              NKV, 1.0f / sqrtf(static_cast<float>(HS)));
    MS_CUDA_LAUNCH_CHECK();
}

template <class S, int HS>
void backward_split_hs(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                       int NKV, cudaStream_t stream) {
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    const bool one = NKV == NH;
    const auto dq_kernel = one ? attention_tc_backward_dq_kernel<S, HS, HeadGroups::kOne>
                               : attention_tc_backward_dq_kernel<S, HS, HeadGroups::kGrouped>;
    opt_in_shared(dq_kernel, Smem<HS>::kBackwardDq);
    ms_launch(dq_kernel, tile_grid(B, T, NH, owned_rows(kMtDq)), dim3(kThreads), Smem<HS>::kBackwardDq, stream, dqkv,
              dout, qkv, out, lse, T, NH, NKV, scale);
    MS_CUDA_LAUNCH_CHECK();
    const auto dkv_kernel = one ? attention_tc_backward_dkv_kernel<S, HS, HeadGroups::kOne>
                                : attention_tc_backward_dkv_kernel<S, HS, HeadGroups::kGrouped>;
    opt_in_shared(dkv_kernel, Smem<HS>::kBackwardDkv);
    ms_launch(dkv_kernel, tile_grid(B, T, NKV, owned_rows(kMtDkv)), dim3(kThreads), Smem<HS>::kBackwardDkv, stream,
              dqkv, dout, qkv, out, lse, T, NH, NKV, scale);
    MS_CUDA_LAUNCH_CHECK();
}

// scratch: dq_acc (B, NH, T, HS) fp32, then the ticket and the semaphores (attention_tc_backward_scratch_bytes),
// which this launch zeroes on the stream first.
template <class S, int HS>
void backward_fused_hs(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, void* scratch, int B,
                       int T, int NH, int NKV, WorkOrder order, cudaStream_t stream) {
    const int tiles = static_cast<int>(ceil_div(T, owned_rows(kMtDkv)));
    const int64_t blocks = int64_t{tiles} * B * NKV;
    MS_ASSERT(blocks <= 0x7fffffff, "attention (tensor cores, fused backward): %lld blocks are over the grid's limit",
              static_cast<long long>(blocks));
    float* dq_acc = static_cast<float*>(scratch);
    int* sync = reinterpret_cast<int*>(dq_acc + int64_t{B} * NH * T * HS);
    MS_CUDA_CHECK(cudaMemsetAsync(sync, 0, (1 + size_t(B) * NH * tiles) * sizeof(int), stream));
    const auto kernel = NKV == NH ? attention_tc_backward_kernel<S, HS, HeadGroups::kOne>
                                  : attention_tc_backward_kernel<S, HS, HeadGroups::kGrouped>;
    opt_in_shared(kernel, Smem<HS>::kBackwardFused);
    ms_launch(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), Smem<HS>::kBackwardFused, stream, dqkv,
              dq_acc, sync, dout, qkv, out, lse, B, T, NH, NKV, 1.0f / sqrtf(static_cast<float>(HS)), order);
    MS_CUDA_LAUNCH_CHECK();
}

template <class S, WgmmaSchedule kSchedule>
void forward_wgmma(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, cudaStream_t stream) {
    const auto kernel = NKV == NH ? attention_wgmma_forward_kernel<S, HeadGroups::kOne, kSchedule>
                                  : attention_wgmma_forward_kernel<S, HeadGroups::kGrouped, kSchedule>;
    const size_t bytes = WgSmem::forward(wg_stages(kSchedule));
    opt_in_shared(kernel, bytes);
    ms_launch(kernel, tile_grid(B, T, NH, kWgRows), dim3(kThreads), bytes, stream, out, lse, qkv, T, NH, NKV,
              1.0f / sqrtf(static_cast<float>(kWgHS)));
    MS_CUDA_LAUNCH_CHECK();
}

// NKV dividing NH (the grids' key/value head axis and the group walks rely on it).
void check_kv_heads(int NH, int NKV) {
    MS_ASSERT(NKV > 0 && NH % NKV == 0, "attention (tensor cores): NKV = %d key/value heads do not divide NH = %d", NKV,
              NH);
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

size_t attention_tc_backward_scratch_bytes(int B, int T, int NH, int HS) {
    const size_t heads = size_t(B) * NH, tiles = static_cast<size_t>(ceil_div(T, owned_rows(kMtDkv)));
    return heads * T * HS * sizeof(float) + (1 + heads * tiles) * sizeof(int);
}

template <class S>
void attention_tc_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, int HS,
                          cudaStream_t stream) {
    check_kv_heads(NH, NKV);
    launch_attention_tc("tensor cores", B, T, NH, HS, {out, qkv},
                        [&](auto hs) { forward_hs<S, decltype(hs)::value>(out, lse, qkv, B, T, NH, NKV, stream); });
}

bool attention_wgmma_supported() {
#if defined(__CUDACC__)
    static const bool supported = [] {
        int device = 0, major = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major != 9) {
            return false;
        }
        int* flag = nullptr;
        int compiled = 0;
        MS_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
        ms_launch(wgmma_compiled_kernel, dim3(1), dim3(1), 0, nullptr, flag);
        const bool ran = cudaGetLastError() == cudaSuccess &&
                         cudaMemcpy(&compiled, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
        MS_CUDA_CHECK(cudaFree(flag));
        return ran && compiled == 1;
    }();
    return supported;
#else
    return true;  // the CPU emulation runs wgmma
#endif
}

template <class S>
void attention_tc_forward_wgmma(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, int HS,
                                WgmmaSchedule schedule, cudaStream_t stream) {
    check_kv_heads(NH, NKV);
    MS_ASSERT(HS == kWgHS, "attention (wgmma): HS = %d; the wgmma forward is built for HS = %d only", HS, kWgHS);
    MS_ASSERT(attention_wgmma_supported(),
              "attention (wgmma): this GPU or build has no wgmma (it needs compute capability 9.0 and a build for "
              "CMAKE_CUDA_ARCHITECTURES=90a)");
    launch_attention_tc("wgmma", B, T, NH, HS, {out, qkv}, [&](auto) {
        if (schedule == WgmmaSchedule::kOverlapped) {
            forward_wgmma<S, WgmmaSchedule::kOverlapped>(out, lse, qkv, B, T, NH, NKV, stream);
        } else {
            forward_wgmma<S, WgmmaSchedule::kSerial>(out, lse, qkv, B, T, NH, NKV, stream);
        }
    });
}

template <class S>
void attention_tc_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, void* scratch, int B,
                           int T, int NH, int NKV, int HS, AttentionTcBackward kind, cudaStream_t stream) {
    check_kv_heads(NH, NKV);
    if (kind != AttentionTcBackward::kSplit) {
        MS_ASSERT(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % 16 == 0,
                  "attention (tensor cores): the fused backward needs attention_tc_backward_scratch_bytes of 16-byte "
                  "aligned scratch, got %p",
                  scratch);
    }
    launch_attention_tc("tensor cores", B, T, NH, HS, {dqkv, dout, qkv, out}, [&](auto hs) {
        constexpr int kHS = decltype(hs)::value;
        if (kind == AttentionTcBackward::kSplit) {
            backward_split_hs<S, kHS>(dqkv, dout, qkv, out, lse, B, T, NH, NKV, stream);
        } else {
            backward_fused_hs<S, kHS>(
                dqkv, dout, qkv, out, lse, scratch, B, T, NH, NKV,
                kind == AttentionTcBackward::kFused ? WorkOrder::kDependenciesFirst : WorkOrder::kReversed, stream);
        }
    });
}

#define MS_INSTANTIATE(S)                                                                                             \
    template void attention_tc_forward<S>(S*, float*, const S*, int, int, int, int, int, cudaStream_t);               \
    template void attention_tc_forward_wgmma<S>(S*, float*, const S*, int, int, int, int, int, WgmmaSchedule,         \
                                                cudaStream_t);                                                        \
    template void attention_tc_backward<S>(S*, const S*, const S*, const S*, const float*, void*, int, int, int, int, \
                                           int, AttentionTcBackward, cudaStream_t);
MS_INSTANTIATE(::ms::bf16)
MS_INSTANTIATE(::ms::fp16)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
