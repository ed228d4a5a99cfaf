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
    LinkParams link;                  // alpha: the smallest message's one-way time; bytes_per_s: the slope
    std::vector<LinkSample> samples;  // ascending bytes
};

// Collective over `world` (size >= 2): ranks 0 and 1 exchange messages of 8 B to 8 MiB (--quick: 8 B and 1 MiB), the
// others take no part. Every rank gets the same result (rank 0's, broadcast).
LinkProbe probe_link(Communicator& world, bool quick);

// The fit of probe_link: alpha = the first sample's time, bytes_per_s = (last bytes - first bytes) / (last time -
// first time). Needs two samples of ascending bytes and times.
LinkParams fit_link(const std::vector<LinkSample>& samples);

}  // namespace ms::sim
