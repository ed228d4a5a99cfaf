// test_collectives.cpp: every Communicator call of MpiCommunicator, with exact expectations (docs/style.md
// 9.10). Rank r contributes pattern(r, i) = (r + 1) * (i % 7 + 1): sums stay far below 2^24, so fp32 is exact and
// results are compared with ==. Averages are checked on power-of-two group sizes, where dividing by the size is
// exact; int32 averages use C++ integer division, as documented in mpi_communicator.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

template <typename T>
std::vector<T> pattern_vec(int r, size_t n, size_t first = 0) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(pattern(r, first + i));
    return v;
}

MpiCommunicator& as_mpi(Communicator& c) { return dynamic_cast<MpiCommunicator&>(c); }

// A copy of world whose MPI calls carry at most `chunk` elements of a buffer.
std::unique_ptr<Communicator> world_with_chunk(size_t chunk) {
    auto c = world().split(0, world().rank(), "chunked");
    as_mpi(*c).set_chunk_elems(chunk);
    return c;
}

// ---- all_reduce ----

template <typename T>
void check_all_reduce(Communicator& comm, size_t n) {
    const int r = comm.rank(), w = comm.size();
    std::vector<T> sum = pattern_vec<T>(r, n);
    comm.all_reduce(std::span(sum), ReduceOp::kSum).wait();
    std::vector<T> mx = pattern_vec<T>(r, n);
    comm.all_reduce(std::span(mx), ReduceOp::kMax).wait();
    std::vector<T> avg = pattern_vec<T>(r, n);
    comm.all_reduce(std::span(avg), ReduceOp::kAvg).wait();
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(sum[i], static_cast<T>(pattern_sum(w, i))) << "i=" << i;
        EXPECT_EQ(mx[i], static_cast<T>(pattern(w - 1, i))) << "i=" << i;
        if constexpr (std::is_same_v<T, int32_t>) {
            EXPECT_EQ(avg[i], pattern_sum(w, i) / w) << "i=" << i;  // integer division
        } else if (is_power_of_two(w)) {
            EXPECT_EQ(avg[i], static_cast<float>(pattern_sum(w, i)) / static_cast<float>(w)) << "i=" << i;
        }
    }
}

TEST(AllReduce, SumMaxAvgFloat) { check_all_reduce<float>(world(), 1000); }
TEST(AllReduce, SumMaxAvgInt32) { check_all_reduce<int32_t>(world(), 1000); }

TEST(AllReduce, Int32AvgTruncatesTowardZero) {
    const int w = world().size();
    std::vector<int32_t> v = {-(world().rank() + 1), world().rank() + 1};
    world().all_reduce(std::span(v), ReduceOp::kAvg).wait();
    const int32_t s = w * (w + 1) / 2;
    EXPECT_EQ(v[0], -s / w);  // C++: -3 / 2 == -1
    EXPECT_EQ(v[1], s / w);
}

TEST(AllReduce, MaxOfNegatives) {
    std::vector<float> v(5, -static_cast<float>(world().rank() + 1));
    world().all_reduce(std::span(v), ReduceOp::kMax).wait();
    for (float x : v) EXPECT_EQ(x, -1.0f);
}

TEST(AllReduce, SeveralInFlightCompleteInAnyOrder) {
    const int r = world().rank(), w = world().size();
    std::vector<float> a = pattern_vec<float>(r, 300), b = pattern_vec<float>(r, 77, 3);
    std::vector<int32_t> c(world().size() * 4);
    const std::vector<int32_t> mine = pattern_vec<int32_t>(r, 4);
    Handle ha = world().all_reduce(std::span(a), ReduceOp::kSum);
    Handle hb = world().all_reduce(std::span(b), ReduceOp::kAvg);
    Handle hc = world().all_gather<int32_t>(mine, c);
    hc.wait();
    while (!hb.test()) {
    }
    ha.wait();
    EXPECT_TRUE(ha.test());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], static_cast<float>(pattern_sum(w, i)));
    if (is_power_of_two(w)) {
        for (size_t i = 0; i < b.size(); ++i)
            EXPECT_EQ(b[i], static_cast<float>(pattern_sum(w, i + 3)) / static_cast<float>(w));
    }
    for (int q = 0; q < w; ++q)
        for (size_t i = 0; i < 4; ++i) EXPECT_EQ(c[q * 4 + i], pattern(q, i));
}

TEST(AllReduce, MoveAssignCompletesThePreviousHandle) {
    const int r = world().rank(), w = world().size();
    std::vector<float> a = pattern_vec<float>(r, 10), b = pattern_vec<float>(r, 10);
    Handle h = world().all_reduce(std::span(a), ReduceOp::kAvg);
    h = world().all_reduce(std::span(b), ReduceOp::kSum);  // must finish a (including the avg division) first
    h.wait();
    for (size_t i = 0; i < 10; ++i) {
        EXPECT_EQ(b[i], static_cast<float>(pattern_sum(w, i)));
        if (is_power_of_two(w)) {
            EXPECT_EQ(a[i], static_cast<float>(pattern_sum(w, i)) / static_cast<float>(w));
        }
    }
}

// ---- reduce_scatter ----

template <typename T>
void check_reduce_scatter(Communicator& comm, size_t n, ReduceOp op) {
    const int r = comm.rank(), w = comm.size();
    const std::vector<T> in = pattern_vec<T>(r, n * w);
    std::vector<T> out(n, T(-1));
    comm.reduce_scatter<T>(in, out, op).wait();
    for (size_t i = 0; i < n; ++i) {
        const size_t j = r * n + i;
        if (op == ReduceOp::kSum) {
            EXPECT_EQ(out[i], static_cast<T>(pattern_sum(w, j))) << "i=" << i;
        } else if (op == ReduceOp::kMax) {
            EXPECT_EQ(out[i], static_cast<T>(pattern(w - 1, j))) << "i=" << i;
        } else if constexpr (std::is_same_v<T, int32_t>) {
            EXPECT_EQ(out[i], pattern_sum(w, j) / w) << "i=" << i;  // integer division
        } else if (is_power_of_two(w)) {
            EXPECT_EQ(out[i], static_cast<float>(pattern_sum(w, j)) / static_cast<float>(w)) << "i=" << i;
        }
    }
}

TEST(ReduceScatter, SumMaxAvg) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
        check_reduce_scatter<float>(world(), 129, op);
        check_reduce_scatter<int32_t>(world(), 5, op);
    }
}

// out is this rank's block of in (ZeRO-1 reduces gradients into its own shard this way).
void check_reduce_scatter_in_place(Communicator& comm, size_t n) {
    const int r = comm.rank(), w = comm.size();
    std::vector<float> buf = pattern_vec<float>(r, n * w);
    std::span<float> mine = std::span(buf).subspan(r * n, n);
    comm.reduce_scatter<float>(buf, mine, ReduceOp::kSum).wait();
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(mine[i], static_cast<float>(pattern_sum(w, r * n + i))) << "i=" << i;
}

TEST(ReduceScatter, IntoOwnBlockOfTheInput) { check_reduce_scatter_in_place(world(), 33); }

// ---- all_gather ----

template <typename T>
void check_all_gather(Communicator& comm, size_t n, bool in_place) {
    const int r = comm.rank(), w = comm.size();
    std::vector<T> out(n * w, T(-1));
    const std::vector<T> in = pattern_vec<T>(r + 10, n);
    if (in_place) {
        std::copy(in.begin(), in.end(), out.begin() + r * n);
        comm.all_gather<T>(std::span(out).subspan(r * n, n), out).wait();
    } else {
        comm.all_gather<T>(in, out).wait();
    }
    for (int q = 0; q < w; ++q)
        for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[q * n + i], static_cast<T>(pattern(q + 10, i))) << q << "," << i;
}

TEST(AllGather, FloatAndInt32) {
    check_all_gather<float>(world(), 100, false);
    check_all_gather<int32_t>(world(), 3, false);
}
TEST(AllGather, InPlace) { check_all_gather<float>(world(), 100, true); }

// ---- broadcast ----

TEST(Broadcast, FromEveryRoot) {
    const int r = world().rank();
    for (int root = 0; root < world().size(); ++root) {
        std::vector<float> f = r == root ? pattern_vec<float>(root, 50) : std::vector<float>(50, -1.0f);
        std::vector<int32_t> k = r == root ? pattern_vec<int32_t>(root, 9) : std::vector<int32_t>(9, -1);
        Handle hf = world().broadcast(std::span(f), root);
        Handle hk = world().broadcast(std::span(k), root);
        hf.wait();
        hk.wait();
        for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], static_cast<float>(pattern(root, i))) << root;
        for (size_t i = 0; i < k.size(); ++i) EXPECT_EQ(k[i], pattern(root, i)) << root;
    }
}

// Into every root in turn, in place, with tiny chunks too: the root holds the sum (the average), the other ranks
// their own input untouched.
TEST(Reduce, IntoEveryRootInPlace) {
    const int r = world().rank(), w = world().size();
    for (size_t chunk : {size_t{1} << 24, size_t{7}}) {
        std::unique_ptr<Communicator> c = world_with_chunk(chunk);
        for (int root = 0; root < w; ++root) {
            std::vector<float> sum = pattern_vec<float>(r, 50), avg = pattern_vec<float>(r, 50);
            c->reduce(std::span(sum), root, ReduceOp::kSum).wait();
            c->reduce(std::span(avg), root, ReduceOp::kAvg).wait();
            for (size_t i = 0; i < sum.size(); ++i) {
                float total = 0;
                for (int q = 0; q < w; ++q) total += static_cast<float>(pattern(q, i));
                const float want = r == root ? total : static_cast<float>(pattern(r, i));
                EXPECT_EQ(sum[i], want) << root << " " << i;
                EXPECT_EQ(avg[i], r == root ? total / static_cast<float>(w) : want) << root << " " << i;
            }
        }
    }
}

// ---- point to point ----

void check_ring(Communicator& comm, size_t n) {
    const int r = comm.rank(), w = comm.size();
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    const std::vector<float> out = pattern_vec<float>(r, n);
    std::vector<float> in(n, -1.0f);
    const P2POp ops[] = {P2POp::send<float>(out, next), P2POp::recv<float>(in, prev)};
    comm.batch_send_recv(ops).wait();
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(in[i], static_cast<float>(pattern(prev, i))) << "i=" << i;
}

TEST(SendRecv, Ring) { check_ring(world(), 1000); }

TEST(SendRecv, BothDirectionsWithTags) {
    // Every rank sends to next (tag 1) and to prev (tag 2) and receives both in one batch; posted in an order that
    // would deadlock with blocking calls.
    const int r = world().rank(), w = world().size();
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    const std::vector<int32_t> to_next = pattern_vec<int32_t>(r, 8), to_prev = pattern_vec<int32_t>(r + 100, 8);
    std::vector<int32_t> from_prev(8, -1), from_next(8, -1);
    const P2POp ops[] = {P2POp::recv<int32_t>(from_next, next, 2), P2POp::send<int32_t>(to_next, next, 1),
                         P2POp::send<int32_t>(to_prev, prev, 2), P2POp::recv<int32_t>(from_prev, prev, 1)};
    world().batch_send_recv(ops).wait();
    for (size_t i = 0; i < 8; ++i) {
        EXPECT_EQ(from_prev[i], pattern(prev, i));
        EXPECT_EQ(from_next[i], pattern(next + 100, i));
    }
}

TEST(SendRecv, PairwiseExchange) {
    // Ranks 2k and 2k + 1 swap buffers; with an odd size the last rank sits out (an empty batch).
    const int r = world().rank(), partner = r ^ 1;
    std::vector<float> out = pattern_vec<float>(r, 64), in(64, -1.0f);
    std::vector<P2POp> ops;
    if (partner < world().size()) {
        ops.push_back(P2POp::send<float>(out, partner));
        ops.push_back(P2POp::recv<float>(in, partner));
    }
    world().batch_send_recv(ops).wait();
    if (partner < world().size()) {
        for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i], static_cast<float>(pattern(partner, i)));
    }
}

// ---- all_to_all ----

// Rank r's block q (destined to rank q), element i: 1000 r + 10 q + i; it must land in rank q's block r.
void check_all_to_all(Communicator& comm, size_t n, bool in_place) {
    const int r = comm.rank(), w = comm.size();
    std::vector<int32_t> in(n * w), out(n * w, -1);
    for (int q = 0; q < w; ++q)
        for (size_t i = 0; i < n; ++i) in[q * n + i] = 1000 * r + 10 * q + static_cast<int32_t>(i);
    if (in_place) {
        comm.all_to_all<int32_t>(in, in).wait();
        out = in;
    } else {
        comm.all_to_all<int32_t>(in, out).wait();
    }
    for (int q = 0; q < w; ++q)
        for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[q * n + i], 1000 * q + 10 * r + static_cast<int32_t>(i)) << q;
}

TEST(AllToAll, Blocks) { check_all_to_all(world(), 7, false); }
TEST(AllToAll, InPlace) { check_all_to_all(world(), 7, true); }

// ---- barrier ----

TEST(Barrier, EveryRankArrives) {
    world().barrier();
    // After a barrier, a broadcast from the last rank is seen by all: a cheap liveness check.
    std::vector<int32_t> v = {world().rank()};
    world().broadcast(std::span(v), world().size() - 1).wait();
    EXPECT_EQ(v[0], world().size() - 1);
}

// ---- split ----

TEST(Split, EvenOddGroupSums) {
    const int r = world().rank(), w = world().size();
    auto half = world().split(r % 2, r, "parity");
    ASSERT_NE(half, nullptr);
    const int members = (w + 1 - r % 2) / 2;  // evens: ceil(w / 2), odds: floor(w / 2)
    EXPECT_EQ(half->size(), members);
    EXPECT_EQ(half->rank(), r / 2);
    EXPECT_EQ(half->name(), "parity");
    // sum of (q + 1) over q = r % 2, r % 2 + 2, ...: evens 1 + 3 + ... = m^2, odds 2 + 4 + ... = m (m + 1)
    std::vector<int32_t> v = {r + 1};
    half->all_reduce(std::span(v), ReduceOp::kSum).wait();
    EXPECT_EQ(v[0], r % 2 == 0 ? members * members : members * (members + 1));
}

TEST(Split, KeyReversesOrder) {
    const int r = world().rank(), w = world().size();
    auto rev = world().split(7, w - 1 - r, "reversed");
    EXPECT_EQ(rev->rank(), w - 1 - r);
    std::vector<int32_t> ranks(w, -1);
    const int32_t mine[] = {r};
    rev->all_gather<int32_t>(mine, ranks).wait();
    for (int q = 0; q < w; ++q) EXPECT_EQ(ranks[q], w - 1 - q);
}

TEST(Split, NegativeColorJoinsNoGroup) {
    const int r = world().rank();
    auto g = world().split(r == 0 ? -1 : 1, r, "without_rank_0");
    if (r == 0) {
        EXPECT_EQ(g, nullptr);
    } else {
        ASSERT_NE(g, nullptr);
        EXPECT_EQ(g->size(), world().size() - 1);
        EXPECT_EQ(g->rank(), r - 1);
    }
}

TEST(Split, NestedSplitKeepsChunkSize) {
    auto c = world_with_chunk(3);
    auto d = c->split(0, c->rank(), "nested");
    EXPECT_EQ(as_mpi(*d).chunk_elems(), 3u);
    check_all_reduce<float>(*d, 10);
}

// ---- chunking ----

TEST(Chunked, EveryCollectiveWithTinyChunks) {
    auto c = world_with_chunk(5);
    MpiCommunicator& m = as_mpi(*c);
    const size_t w = static_cast<size_t>(c->size());
    const size_t block = std::max<size_t>(1, 5 / w);  // per-rank block piece for the block-wise collectives
    // MPI calls a collective makes; a world of one rank makes none (point-to-point still goes through MPI).
    const auto pieces = [&](size_t n, size_t chunk) {
        return w == 1 ? 0 : static_cast<int64_t>((n + chunk - 1) / chunk);
    };

    int64_t calls = m.mpi_calls();
    check_all_reduce<float>(*c, 23);  // three all_reduces
    EXPECT_EQ(m.mpi_calls() - calls, 3 * pieces(23, 5));
    check_all_reduce<int32_t>(*c, 23);

    calls = m.mpi_calls();
    check_reduce_scatter<float>(*c, 7, ReduceOp::kSum);  // blocks above the piece size: one reduce per rank and piece
    EXPECT_EQ(m.mpi_calls() - calls, static_cast<int64_t>(w) * pieces(7, 5));
    check_reduce_scatter<float>(*c, 7, ReduceOp::kAvg);
    check_reduce_scatter<int32_t>(*c, 11, ReduceOp::kMax);
    check_reduce_scatter_in_place(*c, 9);

    calls = m.mpi_calls();
    check_all_gather<float>(*c, 7, false);
    EXPECT_EQ(m.mpi_calls() - calls, pieces(7, block));
    check_all_gather<int32_t>(*c, 13, true);

    calls = m.mpi_calls();
    check_all_to_all(*c, 7, false);
    EXPECT_EQ(m.mpi_calls() - calls, pieces(7, block));
    check_all_to_all(*c, 6, true);

    calls = m.mpi_calls();
    check_ring(*c, 23);
    EXPECT_EQ(m.mpi_calls() - calls, 2 * static_cast<int64_t>((23 + 4) / 5));

    const int r = c->rank();
    for (int root = 0; root < c->size(); ++root) {
        std::vector<float> f = r == root ? pattern_vec<float>(root, 23) : std::vector<float>(23, -1.0f);
        calls = m.mpi_calls();
        c->broadcast(std::span(f), root).wait();
        EXPECT_EQ(m.mpi_calls() - calls, pieces(23, 5));
        for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], static_cast<float>(pattern(root, i)));
    }
}

TEST(Chunked, ReduceScattersInFlightTogether) {
    // Chunked reduce-scatters post one reduce per rank and piece straight from the input: two in flight at once,
    // completed in the opposite order, one of them in place, must not disturb each other.
    auto c = world_with_chunk(4);
    const int r = c->rank(), w = c->size();
    const std::vector<float> in1 = pattern_vec<float>(r, 9 * w);
    std::vector<float> buf2 = pattern_vec<float>(r, 9 * w);
    std::vector<float> out1(9);
    const std::span<float> out2 = std::span(buf2).subspan(static_cast<size_t>(r) * 9, 9);
    Handle h1 = c->reduce_scatter<float>(in1, out1, ReduceOp::kSum);
    Handle h2 = c->reduce_scatter<float>(buf2, out2, ReduceOp::kSum);
    h2.wait();
    h1.wait();
    for (size_t i = 0; i < 9; ++i) {
        EXPECT_EQ(out1[i], static_cast<float>(pattern_sum(w, r * 9 + i)));
        EXPECT_EQ(out2[i], out1[i]);
    }
}

TEST(Chunked, DefaultChunkIs16MElements) {
    EXPECT_EQ(MpiCommunicator::kDefaultChunkElems, size_t{16} << 20);
    EXPECT_EQ(as_mpi(world()).chunk_elems(), MpiCommunicator::kDefaultChunkElems);
}

TEST(LargeBuffers, MegabytesPerRank) {
    // Past Open MPI's eager limits, so its large-message (rendezvous, segmented) algorithms run.
    check_all_reduce<float>(world(), (size_t{1} << 20) + 3);
    check_reduce_scatter<float>(world(), (size_t{1} << 18) + 1, ReduceOp::kSum);
    check_all_gather<float>(world(), (size_t{1} << 18) + 1, false);
    check_ring(world(), (size_t{1} << 20) + 3);
}

// ---- stats ----

TEST(Stats, BytesThisRankSends) {
    if (world().size() == 1) GTEST_SKIP() << "a group of one rank sends nothing (see SizeOne)";
    auto c = world().split(0, world().rank(), "stats");
    const int r = c->rank(), w = c->size();
    c->reset_stats();
    std::vector<float> buf(10, 1.0f), out(10 * w);
    std::vector<int32_t> ibuf(3 * w, 1), iout(3);
    c->all_reduce(std::span(buf), ReduceOp::kSum).wait();
    c->all_reduce(std::span(buf), ReduceOp::kMax).wait();
    c->reduce_scatter<int32_t>(ibuf, iout, ReduceOp::kSum).wait();
    c->all_gather<float>(buf, out).wait();
    c->broadcast(std::span(buf), 0).wait();
    c->all_to_all<int32_t>(ibuf, ibuf).wait();
    std::vector<float> in(6, 0.0f);
    const P2POp ops[] = {P2POp::send<float>(std::span(buf).first(6), (r + 1) % w),
                         P2POp::recv<float>(in, (r + w - 1) % w)};
    c->batch_send_recv(ops).wait();
    c->barrier();

    const CommStats& s = c->stats();
    const auto ops_of = [&](CommOp op) { return s.ops[static_cast<size_t>(op)]; };
    const auto bytes_of = [&](CommOp op) { return s.bytes[static_cast<size_t>(op)]; };
    EXPECT_EQ(ops_of(CommOp::kAllReduce), 2);
    EXPECT_EQ(bytes_of(CommOp::kAllReduce), 2 * 10 * 4);
    EXPECT_EQ(ops_of(CommOp::kReduceScatter), 1);
    EXPECT_EQ(bytes_of(CommOp::kReduceScatter), 3 * w * 4);  // in_count * elemsize
    EXPECT_EQ(ops_of(CommOp::kAllGather), 1);
    EXPECT_EQ(bytes_of(CommOp::kAllGather), 10 * 4);  // in_count * elemsize
    EXPECT_EQ(ops_of(CommOp::kBroadcast), 1);
    EXPECT_EQ(bytes_of(CommOp::kBroadcast), r == 0 ? 10 * 4 : 0);  // only the root sends
    EXPECT_EQ(ops_of(CommOp::kAllToAll), 1);
    EXPECT_EQ(bytes_of(CommOp::kAllToAll), 3 * w * 4);
    EXPECT_EQ(ops_of(CommOp::kSend), 1);
    EXPECT_EQ(bytes_of(CommOp::kSend), 6 * 4);
    EXPECT_EQ(ops_of(CommOp::kRecv), 1);
    EXPECT_EQ(bytes_of(CommOp::kRecv), 0);
    EXPECT_EQ(ops_of(CommOp::kBarrier), 1);
    EXPECT_EQ(bytes_of(CommOp::kBarrier), 0);
    EXPECT_EQ(s.total_bytes(), (2 * 10 + 3 * w + 10 + (r == 0 ? 10 : 0) + 3 * w + 6) * 4);
    c->reset_stats();
    EXPECT_EQ(c->stats().total_bytes(), 0);
}

// ---- size-1 groups ----

TEST(SizeOne, CollectivesAreLocalNoOps) {
    const int r = world().rank();
    auto self = world().split(r, 0, "alone");  // every rank in its own group
    MpiCommunicator& m = as_mpi(*self);
    ASSERT_EQ(self->size(), 1);
    ASSERT_EQ(self->rank(), 0);
    const int64_t calls = m.mpi_calls();
    self->reset_stats();

    std::vector<float> v = pattern_vec<float>(r, 20);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) self->all_reduce(std::span(v), op).wait();
    EXPECT_EQ(v, pattern_vec<float>(r, 20));

    std::vector<float> out(20, -1.0f);
    self->reduce_scatter<float>(v, out, ReduceOp::kAvg).wait();
    EXPECT_EQ(out, v);
    std::fill(out.begin(), out.end(), -1.0f);
    self->all_gather<float>(v, out).wait();
    EXPECT_EQ(out, v);
    std::fill(out.begin(), out.end(), -1.0f);
    self->all_to_all<float>(v, out).wait();
    EXPECT_EQ(out, v);
    self->broadcast(std::span(v), 0).wait();
    EXPECT_EQ(v, pattern_vec<float>(r, 20));
    self->barrier();
    EXPECT_EQ(m.mpi_calls(), calls);  // no MPI call at all

    // A size-1 group sends nothing: ops are counted, bytes are not.
    EXPECT_EQ(self->stats().ops[static_cast<size_t>(CommOp::kAllReduce)], 3);
    EXPECT_EQ(self->stats().total_bytes(), 0);

    // Point-to-point with oneself goes through MPI and works.
    std::vector<float> back(20, -1.0f);
    const P2POp ops[] = {P2POp::send<float>(v, 0, 5), P2POp::recv<float>(back, 0, 5)};
    self->batch_send_recv(ops).wait();
    EXPECT_EQ(back, v);
}

}  // namespace
}  // namespace ms::test
