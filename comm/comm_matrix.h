// comm_matrix.h: the communication matrix -- bytes, operations and time per (source world rank, destination world
// rank), per group (world, tp, pp, dp, mp, embd) and so per link class -- of one run (docs/communication.md).
//
// Every rank counts what it sends in the operations it issues (comm/link_model_communicator.h does the counting):
// collectives by ring attribution (link_model.h ring_sends: each rank sends its share to its ring successor),
// point-to-point sends exactly; receives are counted by their senders. An operation's time is from its issue to its
// completion (under the link model, at least the modelled time): each pair it sends on gets that time, and its
// group's total gets it once, sends or not -- the total communication time the step log reports next to the exposed
// (waited) time. At the end gather() brings every rank's rows to rank 0 as JSON (comm_matrix.json).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "comm/nodes.h"

namespace ms {

// One operation from its issue to its completion, as LinkModelCommunicator counts it (for a timeline:
// engine/train/trace.h). Times on the steady clock (now_seconds()).
struct CommRecord {
    std::string_view group;  // Communicator::name(): "dp", "pp", "dp.intra", ...
    CommOp op = CommOp::kCount;
    bool mixed_p2p = false;  // a batch of both sends and receives (op is then kSend)
    Priority priority = Priority::kNormal;
    int64_t bytes = 0;  // a collective's payload (link_model.h counts it); a point-to-point batch's messages, summed
    double issued = 0, wait_began = 0, completed = 0;  // wait_began 0: found complete by test(), never waited on
};

// Receives every operation the matrix counts, on the thread that completes it (the comm engine's too).
class CommListener {
  public:
    virtual ~CommListener() = default;
    virtual void operation(const CommRecord& r) = 0;
};

struct PairTraffic {
    int64_t bytes = 0;
    int64_t ops = 0;
    double seconds = 0;  // summed over the operations, issue to completion
};

class CommMatrix {
  public:
    // The groups the matrix tells apart, by Communicator::name() up to its first '.' (the hierarchical dp's
    // sub-groups "dp.intra", "dp.inter", "dp.gather" count as dp: comm/hierarchical_communicator.h); any other name
    // counts as "other".
    static constexpr std::array<std::string_view, 8> kGroups = {"world", "tp", "pp", "dp", "mp", "embd", "cp", "other"};
    static int group_index(std::string_view name);

    CommMatrix(int world_rank, NodeLayout nodes);
    int world_rank() const { return rank_; }
    const NodeLayout& nodes() const { return nodes_; }

    // One operation of group `group` sends `bytes` to world rank `dst` (at its issue).
    void add_send(int group, int dst, int64_t bytes);
    // That send's operation completed `seconds` after its issue.
    void add_send_seconds(int group, int dst, double seconds);
    // Any operation of `group` completed `seconds` after its issue: the group's total communication time.
    void add_op_seconds(int group, double seconds) {
        const std::lock_guard<std::mutex> lock(mu_);
        op_seconds_[static_cast<size_t>(group)] += seconds;
    }
    double op_seconds(int group) const {
        const std::lock_guard<std::mutex> lock(mu_);
        return op_seconds_[static_cast<size_t>(group)];
    }
    PairTraffic sent(int group, int dst) const;
    // Not owned; null (the default): none. Set while no operation is in flight.
    void set_listener(CommListener* l) { listener_.store(l, std::memory_order_release); }
    CommListener* listener() const { return listener_.load(std::memory_order_acquire); }

    // Collective over `world` (every rank of the matrix, in world order; not a counting communicator): rank 0 gets
    // {world_size, nodes, node_layout, pairs: [{src, dst, group, link, bytes, ops, seconds}] by bytes descending,
    // by_group, by_link, op_seconds: {group: [per rank]}}; other ranks get null.
    nlohmann::json gather(Communicator& world) const;

  private:
    mutable std::mutex mu_;  // the communication engine's thread counts beside the main thread (comm_engine.h)
    int rank_;
    NodeLayout nodes_;
    std::vector<PairTraffic> sent_;  // (kGroups, world size): what this rank sent, by group and destination
    std::array<double, kGroups.size()> op_seconds_{};
    std::atomic<CommListener*> listener_{nullptr};
};

// The `n` pairs of a gathered matrix with the most bytes, as lines of a table for the log.
std::vector<std::string> comm_matrix_table(const nlohmann::json& matrix, size_t n);

}  // namespace ms
