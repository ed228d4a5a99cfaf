// link_probe.cpp: probe_link() and fit_link() (link_probe.h).
#include "engine/sim/link_probe.h"

#include <algorithm>
#include <span>

#include "engine/core/check.h"
#include "engine/core/timer.h"

namespace ms::sim {

LinkParams fit_link(const std::vector<LinkSample>& samples) {
    MS_CHECK(samples.size() >= 2, "fit_link: {} samples; it needs two", samples.size());
    const LinkSample& a = samples.front();
    const LinkSample& b = samples.back();
    MS_CHECK(b.bytes > a.bytes && b.one_way_s > a.one_way_s,
             "fit_link: the largest message ({} B, {} s) is not slower than the smallest ({} B, {} s)", b.bytes,
             b.one_way_s, a.bytes, a.one_way_s);
    return {a.one_way_s, (b.bytes - a.bytes) / (b.one_way_s - a.one_way_s)};
}

double fit_reduce_rate(const LinkParams& link, const std::vector<LinkSample>& all_reduce, int p) {
    MS_CHECK(all_reduce.size() >= 2 && p >= 2, "fit_reduce_rate: {} samples over {} ranks; it needs two over two",
             all_reduce.size(), p);
    LinkParams moves = link;  // the link's transfers alone
    moves.reduce_bytes_per_s = 0;
    const LinkModel transfers{.intra = moves, .inter = moves, .occupancy = nullptr};
    const auto beyond = [&](const LinkSample& s) {
        return s.one_way_s - collective_seconds(transfers, CommOp::kAllReduce, s.bytes, p, LinkClass::kIntraNode);
    };
    const LinkSample& a = all_reduce.front();
    const LinkSample& b = all_reduce.back();
    const double added = ring_schedule(CommOp::kAllReduce, b.bytes, p).reduced_bytes -
                         ring_schedule(CommOp::kAllReduce, a.bytes, p).reduced_bytes;
    const double extra = beyond(b) - beyond(a);
    constexpr double kTimerSeconds = 1e-6;  // below what the probe's timings resolve
    return extra > kTimerSeconds ? added / extra : 0.0;
}

LinkProbe probe_link(Communicator& world, bool quick) {
    MS_CHECK(world.size() >= 2, "probe_link: a world of {} rank(s); it needs two", world.size());
    const std::vector<size_t> sizes = quick ? std::vector<size_t>{8, size_t{1} << 20}
                                            : std::vector<size_t>{8, 4096, 65536, size_t{1} << 20, size_t{8} << 20};
    const int me = world.rank();
    std::vector<float> buf(sizes.back() / sizeof(float), 1.0f);
    std::vector<double> one_way(sizes.size(), 0.0);
    for (size_t i = 0; i < sizes.size(); ++i) {
        const std::span<float> msg(buf.data(), sizes[i] / sizeof(float));
        // round trips: enough for the shortest to be free of scheduling noise, few for the large messages
        const int warm = 3, reps = quick ? 10 : (sizes[i] <= 65536 ? 200 : 20);
        double best = 1e30;
        for (int r = 0; r < warm + reps; ++r) {
            if (me > 1) break;
            const double t0 = now_seconds();
            const P2POp send = P2POp::send(std::span<const float>(msg), 1 - me), recv = P2POp::recv(msg, 1 - me);
            world.batch_send_recv(std::span<const P2POp>(me == 0 ? &send : &recv, 1)).wait();
            world.batch_send_recv(std::span<const P2POp>(me == 0 ? &recv : &send, 1)).wait();
            if (r >= warm) best = std::min(best, now_seconds() - t0);
        }
        one_way[i] = best / 2;
    }
    // all-reduces over every rank, the shortest of a few after a warm-up
    const std::vector<size_t> reduced = quick ? std::vector<size_t>{size_t{64} << 10, size_t{1} << 20}
                                              : std::vector<size_t>{size_t{1} << 20, size_t{8} << 20};
    std::vector<float> sums(reduced.back() / sizeof(float), 1.0f);
    for (size_t i = 0; i < reduced.size(); ++i) {
        const std::span<float> buf(sums.data(), reduced[i] / sizeof(float));
        const int warm = 2, reps = quick ? 3 : 10;
        double best = 1e30;
        for (int r = 0; r < warm + reps; ++r) {
            world.barrier();
            const double t0 = now_seconds();
            world.all_reduce(buf, ReduceOp::kSum).wait();
            if (r >= warm) best = std::min(best, now_seconds() - t0);
        }
        one_way.push_back(best);
    }
    // the doubles as pairs of 32-bit words: exact, and every rank then fits the same numbers
    world.broadcast(one_way.data(), one_way.size() * 2, DType::kI32, 0).wait();
    LinkProbe p;
    for (size_t i = 0; i < sizes.size(); ++i) p.samples.push_back({static_cast<double>(sizes[i]), one_way[i]});
    for (size_t i = 0; i < reduced.size(); ++i)
        p.all_reduce.push_back({static_cast<double>(reduced[i]), one_way[sizes.size() + i]});
    p.ranks = world.size();
    p.link = fit_link(p.samples);
    p.link.reduce_bytes_per_s = fit_reduce_rate(p.link, p.all_reduce, p.ranks);
    return p;
}

}  // namespace ms::sim
