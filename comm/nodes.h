// nodes.h: which node each world rank is on -- the one place the node layout of a run is decided, for the link
// model (comm/link_model.h) and for anything later that needs it (a placement report, a hierarchical all-reduce).
//
// run.ranks_per_node chooses it:
//   0      detect: the ranks that share a host form a node (MpiRuntime::host_of), numbered by their lowest rank
//   N > 0  simulate: nodes of N consecutive world ranks, rank r on node r / N (validate_config checks that N divides
//          the world size), so that one machine can stand in for several
// With the rank order tp-dp-pp (engine/parallel/topology.h), N = tp keeps every tp group inside a node.
#pragma once

#include <string>
#include <vector>

namespace ms {

struct NodeLayout {
    std::vector<int> node_of;  // by world rank: 0 .. num_nodes - 1, nodes numbered by their lowest world rank
    int num_nodes = 1;
    bool simulated = false;  // from run.ranks_per_node > 0, not from the hosts

    int world_size() const { return static_cast<int>(node_of.size()); }
    int node(int world_rank) const { return node_of.at(static_cast<size_t>(world_rank)); }
    bool same_node(int a, int b) const { return node(a) == node(b); }
    // "2 nodes of 2 ranks (simulated: run.ranks_per_node 2)", for the start-up log
    std::string describe() const;
};

// Nodes of `ranks_per_node` consecutive ranks; ranks_per_node must divide world_size (checked).
NodeLayout nodes_by_count(int world_size, int ranks_per_node);
// One node per distinct host, by world rank.
NodeLayout nodes_by_host(const std::vector<std::string>& host_of_rank);
// run.ranks_per_node's layout: by host when 0, else by count over hosts.size() ranks.
NodeLayout make_node_layout(int ranks_per_node, const std::vector<std::string>& host_of_rank);

}  // namespace ms
