// link_probe.h: the link between two ranks of one host, measured for the profile (`mpirun -np 2 mindspeed-train
// calibrate`, docs/planner.md "The links"): a ping-pong between world ranks 0 and 1 over the trainer's own
// communicator (comm/communicator.h), so its waits are the ones a training step pays. Each message size's one-way
// time is half the shortest of its round trips; alpha is the smallest message's, bytes/s the slope from it to the
// largest, so that alpha + b / beta gives both back.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/link_model.h"

namespace ms::sim {

struct LinkSample {
    double bytes = 0;
    double one_way_s = 0;
};

struct LinkProbe {
    LinkParams link;                     // alpha: the smallest message's one-way time; bytes_per_s: the slope;
                                         // reduce_bytes_per_s: fit_reduce_rate of the all-reduces
    std::vector<LinkSample> samples;     // ascending bytes
    std::vector<LinkSample> all_reduce;  // fp32 sum all-reduces over the world: bytes, the shortest time
    int ranks = 0;                       // the world's size: the all-reduces' p
};

// Collective over `world` (size >= 2): ranks 0 and 1 exchange messages of 8 B to 8 MiB (--quick: 8 B and 1 MiB), the
// others take no part; then every rank takes part in all-reduces of 1 and 8 MiB (--quick: 64 KiB and 1 MiB), which
// the trainer's gradient reduction is made of. Every rank gets the same result (rank 0's, broadcast).
LinkProbe probe_link(Communicator& world, bool quick);

// The fit of probe_link: alpha = the first sample's time, bytes_per_s = (last bytes - first bytes) / (last time -
// first time). Needs two samples of ascending bytes and times.
LinkParams fit_link(const std::vector<LinkSample>& samples);

// The rate at which a rank reduces in an all-reduce over p ranks of `link`: what the all-reduces took beyond the
// ring's transfers (collective_seconds without a reduction rate), against the (p - 1) n / p bytes each rank adds,
// as the slope from the smallest sample to the largest, so fixed costs drop out. 0 (free) when the larger took at
// most 1 us longer beyond its transfers than the smaller.
double fit_reduce_rate(const LinkParams& link, const std::vector<LinkSample>& all_reduce, int p);

}  // namespace ms::sim
