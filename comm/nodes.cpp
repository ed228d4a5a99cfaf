// nodes.cpp: see nodes.h.
#include "comm/nodes.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "engine/core/check.h"

namespace ms {

std::string NodeLayout::describe() const {
    std::vector<int> sizes(static_cast<size_t>(num_nodes), 0);
    for (int n : node_of) ++sizes[static_cast<size_t>(n)];
    const bool even = std::all_of(sizes.begin(), sizes.end(), [&](int s) { return s == sizes.front(); });
    const std::string shape = even ? fmt::format("{} node{} of {} rank{}", num_nodes, num_nodes == 1 ? "" : "s",
                                                 sizes.front(), sizes.front() == 1 ? "" : "s")
                                   : fmt::format("{} nodes of {} ranks", num_nodes, fmt::join(sizes, ", "));
    return shape +
           (simulated ? fmt::format(" (simulated: run.ranks_per_node {})", sizes.front()) : std::string(" (by host)"));
}

NodeLayout nodes_by_count(int world_size, int ranks_per_node) {
    MS_CHECK(world_size >= 1 && ranks_per_node >= 1 && world_size % ranks_per_node == 0,
             "nodes of {} ranks do not divide a world of {} (validate_config refuses run.ranks_per_node)",
             ranks_per_node, world_size);
    NodeLayout l;
    l.simulated = true;
    l.num_nodes = world_size / ranks_per_node;
    for (int r = 0; r < world_size; ++r) l.node_of.push_back(r / ranks_per_node);
    return l;
}

NodeLayout nodes_by_host(const std::vector<std::string>& host_of_rank) {
    NodeLayout l;
    std::map<std::string, int> id;  // host -> node, in order of each host's lowest rank
    for (const std::string& h : host_of_rank) {
        const auto [at, added] = id.emplace(h, static_cast<int>(id.size()));
        l.node_of.push_back(at->second);
    }
    l.num_nodes = std::max<int>(1, static_cast<int>(id.size()));
    return l;
}

NodeLayout make_node_layout(int ranks_per_node, const std::vector<std::string>& host_of_rank) {
    if (ranks_per_node > 0) return nodes_by_count(static_cast<int>(host_of_rank.size()), ranks_per_node);
    return nodes_by_host(host_of_rank);
}

}  // namespace ms
