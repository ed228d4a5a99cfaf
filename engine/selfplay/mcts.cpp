// mcts.cpp: the batched tree search (mcts.h): option checks, the Dirichlet noise, and BatchedSearch, instantiated for
// games::Connect4.
#include "engine/selfplay/mcts.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>

#include "engine/core/check.h"
#include "engine/core/philox.h"

namespace ms::selfplay {

namespace {

constexpr int kMaxSimulations = 1 << 20;
constexpr int kMaxLeavesPerWave = 1 << 12;
constexpr float kMaxWeight = 100.0f;  // the largest c_puct, dirichlet_alpha, virtual_loss, fpu_reduction
// The index layout of draw_index: the counter's bits and the purpose's.
constexpr int kCounterBits = 28;
// The draws one Dirichlet entry may use: Marsaglia and Tsang's loop accepts more than 95% of its tries, so a gamma
// variate needs more than a few draws with a vanishing probability.
constexpr uint32_t kDrawsPerEntry = 1u << 16;
// The most children a node has: a game's actions are the bits of a uint64_t (games::Game's legal_moves()).
constexpr int kMaxChildren = 64;

template <typename T>
void refuse(const std::string& key, T value, const std::string& allowed) {
    throw UserError(fmt::format("config error: selfplay.{} = {} must be {}", key, value, allowed));
}

void check_range(const std::string& key, float value, float low, bool low_open, float high) {
    if (!std::isfinite(value) || (low_open ? value <= low : value < low) || value > high) {
        refuse(key, value, fmt::format("in {}{}, {}]", low_open ? "(" : "[", low, high));
    }
}

// A uniform draw in (0, 1], so that its log is finite.
double uniform_open(uint64_t seed, uint64_t game, uint64_t index) {
    return 1.0 - philox_uniform_double(seed, game, index);
}

// log of a Gamma(alpha, 1) variate, drawn from the Philox indices of Dirichlet entry `entry`.
double log_gamma_variate(double alpha, uint64_t seed, uint64_t game, int move, uint32_t entry) {
    // Marsaglia and Tsang need a shape >= 1: Gamma(alpha) = Gamma(alpha + 1) * U^(1/alpha).
    const double shape = alpha < 1.0 ? alpha + 1.0 : alpha;
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    uint32_t counter = entry * kDrawsPerEntry;
    const uint32_t end = counter + kDrawsPerEntry;
    const auto next_index = [&] {
        MS_CHECK(counter < end, "Dirichlet entry {}: more than {} draws for one gamma variate", entry, kDrawsPerEntry);
        return draw_index(move, DrawPurpose::kDirichlet, counter++);
    };
    double log_gamma = 0.0;
    for (;;) {
        const double x = philox_normal(seed, game, next_index());
        double v = 1.0 + c * x;
        if (v <= 0.0) continue;
        v = v * v * v;
        const double u = uniform_open(seed, game, next_index());
        if (u < 1.0 - 0.0331 * x * x * x * x || std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) {
            log_gamma = std::log(d * v);
            break;
        }
    }
    if (alpha < 1.0) log_gamma += std::log(uniform_open(seed, game, next_index())) / alpha;
    return log_gamma;
}

}  // namespace

void check_mcts_options(const MctsOptions& options) {
    if (options.simulations < 1 || options.simulations > kMaxSimulations) {
        refuse("simulations", options.simulations, fmt::format("in [1, {}]", kMaxSimulations));
    }
    if (options.leaves_per_wave < 1 || options.leaves_per_wave > kMaxLeavesPerWave) {
        refuse("leaves_per_wave", options.leaves_per_wave, fmt::format("in [1, {}]", kMaxLeavesPerWave));
    }
    check_range("c_puct", options.c_puct, 0.0f, true, kMaxWeight);
    check_range("noise_fraction", options.noise_fraction, 0.0f, false, 1.0f);
    check_range("dirichlet_alpha", options.dirichlet_alpha, 0.0f, true, kMaxWeight);
    check_range("virtual_loss", options.virtual_loss, 0.0f, false, kMaxWeight);
    check_range("fpu_reduction", options.fpu_reduction, 0.0f, false, kMaxWeight);
    if (options.root == RootSelection::kGumbel && options.noise_fraction != 0.0f)
        refuse("noise_fraction", options.noise_fraction, "0 with selfplay.search: gumbel (its root noise is Gumbel's)");
}

uint64_t draw_index(int move, DrawPurpose purpose, uint32_t counter) {
    MS_CHECK(move >= 0, "draw_index of move {}", move);
    MS_CHECK(counter < (1u << kCounterBits), "draw_index: counter {} is over 2^{}", counter, kCounterBits);
    return (static_cast<uint64_t>(move) << 32) | (static_cast<uint64_t>(purpose) << kCounterBits) | counter;
}

void dirichlet_noise(float alpha, uint64_t seed, uint64_t game, int move, std::span<double> out) {
    MS_CHECK(alpha > 0.0f, "Dirichlet noise of alpha {}", alpha);
    MS_CHECK(!out.empty() && out.size() <= (1u << kCounterBits) / kDrawsPerEntry, "Dirichlet noise over {} entries",
             out.size());
    double largest = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < out.size(); ++i) {
        out[i] = log_gamma_variate(alpha, seed, game, move, static_cast<uint32_t>(i));
        largest = std::max(largest, out[i]);
    }
    double sum = 0.0;
    for (double& x : out) sum += x = std::exp(x - largest);  // the largest entry is 1, so sum >= 1
    for (double& x : out) x /= sum;
}

void gumbel_noise(uint64_t seed, uint64_t game, int move, std::span<double> out) {
    MS_CHECK(out.size() <= (1u << kCounterBits), "Gumbel noise over {} entries", out.size());
    for (size_t a = 0; a < out.size(); ++a) {
        // u in (0, 1): 1 - [0, 1) is in (0, 1], and 1 itself is moved to the double below it.
        const double u =
            std::min(uniform_open(seed, game, draw_index(move, DrawPurpose::kGumbel, a)), std::nextafter(1.0, 0.0));
        out[a] = -std::log(-std::log(u));
    }
}

std::vector<int32_t> considered_visits(int actions, int simulations) {
    MS_CHECK(actions >= 1 && simulations >= 0, "considered_visits of {} actions and {} simulations", actions,
             simulations);
    std::vector<int32_t> schedule;
    schedule.reserve(static_cast<size_t>(simulations));
    if (actions == 1) {
        for (int i = 0; i < simulations; ++i) schedule.push_back(i);
        return schedule;
    }
    const int log2_actions = std::bit_width(static_cast<unsigned>(actions - 1));  // ceil(log2(actions))
    std::vector<int32_t> visits(static_cast<size_t>(actions), 0);
    for (int considered = actions; static_cast<int>(schedule.size()) < simulations;
         considered = std::max(2, considered / 2)) {
        const int rounds = std::max(1, simulations / (log2_actions * considered));
        for (int r = 0; r < rounds; ++r)
            for (int a = 0; a < considered; ++a) schedule.push_back(visits[static_cast<size_t>(a)]++);
    }
    schedule.resize(static_cast<size_t>(simulations));
    return schedule;
}

void completed_q_sigma(std::span<const float> priors, std::span<const int32_t> visits, std::span<const double> q,
                       double network_value, std::span<double> sigma) {
    const size_t n = priors.size();
    MS_CHECK(visits.size() == n && q.size() == n && sigma.size() == n && n > 0,
             "completed_q_sigma of {} priors, {} visits, {} values into {}", n, visits.size(), q.size(), sigma.size());
    int64_t total = 0;
    int32_t most = 0;
    double visited_prior = 0.0, visited_pq = 0.0;
    for (size_t a = 0; a < n; ++a) {
        total += visits[a];
        most = std::max(most, visits[a]);
        if (visits[a] > 0) {
            // mctx floors the priors at the smallest normal float, so a visited child always has weight.
            const double p = std::max<double>(priors[a], std::numeric_limits<float>::min());
            visited_prior += p;
            visited_pq += p * q[a];
        }
    }
    const double mixed = total > 0 ? (network_value + static_cast<double>(total) * visited_pq / visited_prior) /
                                         static_cast<double>(total + 1)
                                   : network_value;
    double low = std::numeric_limits<double>::infinity(), high = -low;
    for (size_t a = 0; a < n; ++a) {
        sigma[a] = visits[a] > 0 ? q[a] : mixed;
        low = std::min(low, sigma[a]);
        high = std::max(high, sigma[a]);
    }
    // mctx divides by max(high - low, 1e-8).
    const double range = std::max(high - low, 1e-8);
    const double scale = (kGumbelVisitOffset + most) * kGumbelValueScale;
    for (double& s : sigma) s = scale * (s - low) / range;
}

template <games::Game G>
BatchedSearch<G>::BatchedSearch(const MctsOptions& options, uint64_t seed) : options_(options), seed_(seed) {
    check_mcts_options(options_);
}

template <games::Game G>
std::vector<RootResult> BatchedSearch<G>::run(Evaluator<G>& evaluator, std::span<const SearchRoot<G>> roots) {
    if (roots.empty()) return {};
    plant_roots(evaluator, roots);
    // The waves: select in every unfinished tree, evaluate the new leaves of all of them, then expand and back up.
    for (;;) {
        rows_.clear();
        bool selected = false;
        for (Tree& tree : trees_) {
            if (tree.simulations == tree.budget) continue;
            select_wave(tree);
            selected = true;
        }
        if (!selected) break;
        if (!rows_.empty()) evaluate_rows(evaluator);
        for (Tree& tree : trees_) back_up_wave(tree);
        ++counters_.waves;
    }
    std::vector<RootResult> results;
    results.reserve(trees_.size());
    for (const Tree& tree : trees_) {
        results.push_back(result(tree));
        counters_.simulations += tree.budget - tree.reused;
        counters_.reused += tree.reused;
    }
    counters_.searches += static_cast<int64_t>(trees_.size());
    return results;
}

template <games::Game G>
void BatchedSearch<G>::plant_roots(Evaluator<G>& evaluator, std::span<const SearchRoot<G>> roots) {
    const G& first = roots.front().state;
    num_actions_ = first.num_actions();
    std::swap(trees_, previous_);
    std::unordered_map<uint64_t, size_t> kept;  // game -> its tree in previous_
    if (options_.reuse_tree)
        for (size_t t = 0; t < previous_.size(); ++t) kept.emplace(previous_[t].game, t);
    trees_.resize(roots.size());
    rows_.clear();
    std::vector<int32_t> fresh;  // the trees whose roots are rows_, in order
    for (size_t t = 0; t < roots.size(); ++t) {
        const G& state = roots[t].state;
        MS_CHECK(state.rows() == first.rows() && state.cols() == first.cols(),
                 "search roots of different boards ({} x {} and {} x {}) in one batch", first.rows(), first.cols(),
                 state.rows(), state.cols());
        MS_CHECK(state.outcome() == games::Outcome::kOngoing, "search from a finished game:\n{}", state.to_string());
        Tree& tree = trees_[t];
        tree.paths.clear();
        tree.selections.clear();
        tree.game = roots[t].game;
        tree.noise = roots[t].noise;
        tree.budget = roots[t].simulations > 0 ? roots[t].simulations : options_.simulations;
        MS_CHECK(tree.budget <= kMaxSimulations, "a search root of {} simulations", tree.budget);
        const auto old = kept.find(tree.game);
        const int32_t top = old == kept.end() ? -1 : find_expanded(previous_[old->second], state);
        if (top >= 0) {
            copy_subtree(previous_[old->second], top, tree);
            tree.simulations = tree.reused = tree.nodes[0].visits - 1;  // the root's own evaluation is no simulation
            // A smaller search than the one that built the tree (a fast search after a full one) still runs one.
            tree.budget = std::max(tree.budget, tree.reused + 1);
            continue;
        }
        tree.nodes.clear();
        tree.simulations = tree.reused = 0;
        Node root;
        root.state = state;
        root.status = NodeStatus::kPending;
        tree.nodes.push_back(root);
        rows_.push_back(state);
        fresh.push_back(static_cast<int32_t>(t));
    }
    if (!rows_.empty()) evaluate_rows(evaluator);
    const int32_t root_path[1] = {0};
    for (size_t r = 0; r < fresh.size(); ++r) {
        Tree& tree = trees_[static_cast<size_t>(fresh[r])];
        expand(tree, 0, std::span<const float>(row_priors_).subspan(r * num_actions_, num_actions_), row_values_[r]);
        backup(tree, root_path, row_values_[r]);
    }
    if (options_.noise_fraction > 0.0f)
        for (Tree& tree : trees_)
            if (tree.noise) add_noise(tree);
    if (options_.root == RootSelection::kGumbel)
        for (Tree& tree : trees_) plant_gumbel(tree);
}

template <games::Game G>
void BatchedSearch<G>::plant_gumbel(Tree& tree) const {
    const Node& root = tree.nodes[0];
    const std::span<const Node> kids = children(tree, root);
    tree.root_scores.resize(kids.size());
    gumbel_noise(seed_, tree.game, root.state.move_count(), tree.root_scores);
    tree.root_kept_visits.resize(kids.size());
    for (size_t i = 0; i < kids.size(); ++i) {
        // log P, floored as mctx floors the priors (a prior of 0 still gets a finite score)
        tree.root_scores[i] += std::log(std::max(kids[i].prior, std::numeric_limits<float>::min()));
        tree.root_kept_visits[i] = kids[i].visits;
    }
    tree.schedule = considered_visits(static_cast<int>(kids.size()), tree.budget - tree.reused);
}

template <games::Game G>
void BatchedSearch<G>::root_sigma(const Tree& tree, std::span<double> sigma) {
    const Node& root = tree.nodes[0];
    const std::span<const Node> kids = children(tree, root);
    std::array<float, kMaxChildren> priors;
    std::array<int32_t, kMaxChildren> visits;
    std::array<double, kMaxChildren> q;
    for (size_t i = 0; i < kids.size(); ++i) {
        priors[i] = kids[i].prior;
        visits[i] = kids[i].visits;
        q[i] = kids[i].visits > 0 ? kids[i].value_sum / kids[i].visits : 0.0;
    }
    const size_t n = kids.size();
    completed_q_sigma(std::span(priors).first(n), std::span(visits).first(n), std::span(q).first(n), root.network_value,
                      sigma);
}

template <games::Game G>
int32_t BatchedSearch<G>::select_root_gumbel(const Tree& tree) const {
    const Node& root = tree.nodes[0];
    const std::span<const Node> kids = children(tree, root);
    // Proofs as in select_child: a proven win is taken, proven losses are passed over while any child is unproven.
    bool any_unproven = false;
    std::array<int32_t, kMaxChildren> fresh;  // this search's visits, the pending selections included
    int32_t done = 0;
    for (size_t i = 0; i < kids.size(); ++i) {
        if (kids[i].proven > 0) return root.first_child + static_cast<int32_t>(i);
        any_unproven |= kids[i].proven == 0;
        fresh[i] = kids[i].visits + kids[i].in_flight - tree.root_kept_visits[i];
        done += fresh[i];
    }
    MS_CHECK(done < static_cast<int32_t>(tree.schedule.size()), "Gumbel root selection past its {} simulations",
             tree.schedule.size());
    const int32_t considered = tree.schedule[static_cast<size_t>(done)];
    // The children holding `considered` visits; when proofs or collisions left none of them selectable, those
    // holding the fewest.
    bool exact = false;
    int32_t fewest = std::numeric_limits<int32_t>::max();
    for (size_t i = 0; i < kids.size(); ++i) {
        if (any_unproven && kids[i].proven < 0) continue;
        exact |= fresh[i] == considered;
        fewest = std::min(fewest, fresh[i]);
    }
    return root.first_child +
           best_gumbel_child(tree, std::span(fresh).first(kids.size()), exact ? considered : fewest, any_unproven);
}

template <games::Game G>
int32_t BatchedSearch<G>::best_gumbel_child(const Tree& tree, std::span<const int32_t> fresh, int32_t wanted,
                                            bool any_unproven) {
    const std::span<const Node> kids = children(tree, tree.nodes[0]);
    std::array<double, kMaxChildren> sigma;
    root_sigma(tree, std::span(sigma).first(kids.size()));
    int32_t best = -1;
    double best_score = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < kids.size(); ++i) {
        if ((any_unproven && kids[i].proven < 0) || fresh[i] != wanted) continue;
        const double score = tree.root_scores[i] + sigma[i];
        if (best < 0 || score > best_score) {
            best_score = score;
            best = static_cast<int32_t>(i);
        }
    }
    MS_CHECK(best >= 0, "no root child was selectable (a NaN prior or value?)");
    return best;
}

template <games::Game G>
int32_t BatchedSearch<G>::find_expanded(const Tree& tree, const G& state) {
    if (tree.nodes.empty() || tree.nodes[0].status != NodeStatus::kExpanded) return -1;
    const int moves = state.move_count() - tree.nodes[0].state.move_count();
    if (moves != 1 && moves != 2) return -1;
    for (const Node& child : children(tree, tree.nodes[0])) {
        if (child.status != NodeStatus::kExpanded) continue;
        if (moves == 1 && child.state == state) return static_cast<int32_t>(&child - tree.nodes.data());
        if (moves == 2)
            for (const Node& grandchild : children(tree, child))
                if (grandchild.status == NodeStatus::kExpanded && grandchild.state == state)
                    return static_cast<int32_t>(&grandchild - tree.nodes.data());
    }
    return -1;
}

template <games::Game G>
void BatchedSearch<G>::copy_subtree(const Tree& from, int32_t top, Tree& to) {
    to.nodes.clear();
    to.nodes.push_back(from.nodes[top]);
    // Breadth first: each copied node's children are appended together, so they stay contiguous.
    for (size_t i = 0; i < to.nodes.size(); ++i) {
        if (to.nodes[i].status != NodeStatus::kExpanded) continue;
        const int32_t old_first = to.nodes[i].first_child;
        to.nodes[i].first_child = static_cast<int32_t>(to.nodes.size());
        for (int c = 0; c < to.nodes[i].num_children; ++c) to.nodes.push_back(from.nodes[old_first + c]);
    }
}

template <games::Game G>
void BatchedSearch<G>::select_wave(Tree& tree) {
    const int selections = std::min(options_.leaves_per_wave, tree.budget - tree.simulations);
    for (int i = 0; i < selections; ++i) {
        Selection s;
        s.path_begin = static_cast<int32_t>(tree.paths.size());
        int32_t node = 0;
        tree.paths.push_back(node);
        while (tree.nodes[node].status == NodeStatus::kExpanded && (node == 0 || tree.nodes[node].proven == 0)) {
            node = node == 0 && options_.root == RootSelection::kGumbel ? select_root_gumbel(tree)
                                                                        : select_child(tree, node);
            tree.paths.push_back(node);
        }
        s.path_end = static_cast<int32_t>(tree.paths.size());
        for (int32_t p = s.path_begin; p < s.path_end; ++p) ++tree.nodes[tree.paths[p]].in_flight;
        Node& leaf = tree.nodes[node];
        if (leaf.outcome != games::Outcome::kOngoing || (node != 0 && leaf.proven != 0)) {
            s.kind = SelectionKind::kTerminal;
        } else if (leaf.status == NodeStatus::kPending) {
            s.kind = SelectionKind::kCollision;
        } else {
            leaf.status = NodeStatus::kPending;
            s.kind = SelectionKind::kNewLeaf;
            s.row = static_cast<int32_t>(rows_.size());
            rows_.push_back(leaf.state);
        }
        tree.selections.push_back(s);
    }
}

template <games::Game G>
void BatchedSearch<G>::back_up_wave(Tree& tree) {
    for (const Selection& s : tree.selections) {
        const std::span<const int32_t> path(tree.paths.data() + s.path_begin, s.path_end - s.path_begin);
        for (const int32_t node : path) --tree.nodes[node].in_flight;
        const int32_t leaf = path.back();
        switch (s.kind) {
            case SelectionKind::kNewLeaf:
                expand(tree, leaf, std::span<const float>(row_priors_).subspan(s.row * num_actions_, num_actions_),
                       row_values_[s.row]);
                prove(tree, path);
                // A leaf its own children prove backs up its exact value rather than the network's.
                backup(tree, path, tree.nodes[leaf].proven != 0 ? -tree.nodes[leaf].proven : row_values_[s.row]);
                ++tree.simulations;
                break;
            case SelectionKind::kTerminal: {
                // The exact value for the leaf's side to move: a proof's (a won game is proven too), else the draw's.
                const Node& node = tree.nodes[leaf];
                backup(tree, path, node.proven != 0 ? -node.proven : games::outcome_value(node.outcome));
                ++tree.simulations;
                break;
            }
            case SelectionKind::kCollision:
                ++counters_.collisions;
                break;
        }
    }
    tree.selections.clear();
    tree.paths.clear();
}

template <games::Game G>
int32_t BatchedSearch<G>::select_child(const Tree& tree, int32_t node) const {
    const Node& parent = tree.nodes[node];
    const double virtual_loss = options_.virtual_loss;
    const double sqrt_parent = std::sqrt(parent.visits + virtual_loss * parent.in_flight);
    const std::span<const Node> kids = children(tree, parent);
    // Proofs: a child proven won for the side choosing is taken (the first); proven-lost ones are passed over while
    // any child is unproven.
    double visited_policy = 0.0;
    bool any_unproven = false;
    for (size_t i = 0; i < kids.size(); ++i) {
        const Node& child = kids[i];
        if (child.proven > 0) return parent.first_child + static_cast<int32_t>(i);
        any_unproven |= child.proven == 0;
        if (child.visits > 0) visited_policy += child.prior;
    }
    const bool noisy_root = node == 0 && options_.noise_fraction > 0.0f && tree.noise;
    const double reduction = noisy_root ? 0.0 : options_.fpu_reduction;
    // An expanded node has backed up its own evaluation, so visits >= 1.
    const double fpu = -parent.value_sum / parent.visits - reduction * std::sqrt(visited_policy);
    int32_t best = -1;
    double best_score = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < kids.size(); ++i) {
        const Node& child = kids[i];
        if (any_unproven && child.proven < 0) continue;
        const double pending = virtual_loss * child.in_flight;
        const double visits = child.visits + pending;
        const double q = visits > 0.0 ? (child.value_sum - pending) / visits : fpu;
        const double score = q + options_.c_puct * child.prior * sqrt_parent / (1.0 + visits);
        if (score > best_score) {
            best_score = score;
            best = parent.first_child + static_cast<int32_t>(i);
        }
    }
    MS_CHECK(best >= 0, "no child of an expanded node was selectable (a NaN prior or value?)");
    return best;
}

template <games::Game G>
void BatchedSearch<G>::expand(Tree& tree, int32_t node, std::span<const float> priors, float network_value) {
    const G state = tree.nodes[node].state;  // a copy: adding the children moves the nodes
    uint64_t legal = state.legal_moves();
    MS_CHECK(legal != 0, "expanding a position with no legal move:\n{}", state.to_string());
    const int32_t first_child = static_cast<int32_t>(tree.nodes.size());
    for (; legal != 0; legal &= legal - 1) {
        const int action = std::countr_zero(legal);
        Node child;
        child.state = state;
        child.state.play(action);
        child.outcome = child.state.outcome();
        child.proven = child.outcome == games::Outcome::kLoss ? 1 : 0;  // its side to move lost: the mover won
        child.prior = priors[action];
        child.action = static_cast<int8_t>(action);
        tree.nodes.push_back(child);
    }
    Node& parent = tree.nodes[node];
    parent.first_child = first_child;
    parent.num_children = static_cast<int8_t>(tree.nodes.size() - first_child);
    parent.status = NodeStatus::kExpanded;
    parent.network_value = network_value;
}

template <games::Game G>
void BatchedSearch<G>::add_noise(Tree& tree) {
    const Node& root = tree.nodes[0];
    std::vector<double> noise(root.num_children);
    dirichlet_noise(options_.dirichlet_alpha, seed_, tree.game, root.state.move_count(), noise);
    const double fraction = options_.noise_fraction;
    for (int i = 0; i < root.num_children; ++i) {
        Node& child = tree.nodes[root.first_child + i];
        child.prior = static_cast<float>((1.0 - fraction) * child.prior + fraction * noise[i]);
    }
}

template <games::Game G>
void BatchedSearch<G>::backup(Tree& tree, std::span<const int32_t> path, double leaf_value) {
    // A node keeps its values from the view of the side that moved into it: the opposite of its side to move's.
    double value = -leaf_value;
    for (size_t p = path.size(); p-- > 0;) {
        Node& node = tree.nodes[path[p]];
        ++node.visits;
        node.value_sum += value;
        value = -value;
    }
}

template <games::Game G>
void BatchedSearch<G>::prove(Tree& tree, std::span<const int32_t> path) {
    for (size_t p = path.size(); p-- > 0;) {
        Node& node = tree.nodes[path[p]];
        if (node.proven != 0) return;  // the root, proven by an earlier simulation
        bool all_lost = true, one_won = false;
        for (const Node& child : children(tree, node)) {
            one_won |= child.proven > 0;
            all_lost &= child.proven < 0;
        }
        // A child's proof is for the node's side to move, the opposite of the side that moved into the node.
        if (one_won) {
            node.proven = -1;
        } else if (all_lost) {
            node.proven = 1;
        } else {
            return;
        }
    }
}

template <games::Game G>
void BatchedSearch<G>::evaluate_rows(Evaluator<G>& evaluator) {
    const size_t rows = rows_.size(), actions = static_cast<size_t>(num_actions_);
    const size_t max_batch = static_cast<size_t>(evaluator.max_batch());
    MS_CHECK(max_batch >= 1, "an evaluator with max_batch() = {}", max_batch);
    row_priors_.assign(rows * actions, 0.0f);
    row_values_.assign(rows, 0.0f);
    for (size_t begin = 0; begin < rows; begin += max_batch) {
        const size_t count = std::min(max_batch, rows - begin);
        evaluator.evaluate(std::span<const G>(rows_).subspan(begin, count),
                           std::span<float>(row_priors_).subspan(begin * actions, count * actions),
                           std::span<float>(row_values_).subspan(begin, count));
        ++counters_.evaluate_calls;
    }
    counters_.positions_evaluated += static_cast<int64_t>(rows);
}

template <games::Game G>
RootResult BatchedSearch<G>::result(const Tree& tree) const {
    RootResult r;
    r.visits.assign(num_actions_, 0);
    r.q.assign(num_actions_, 0.0f);
    r.priors.assign(num_actions_, 0.0f);
    r.proven.assign(num_actions_, 0);
    const Node& root = tree.nodes[0];
    MS_CHECK(root.visits == 1 + tree.budget, "a root of {} visits after {} simulations", root.visits, tree.budget);
    for (int i = 0; i < root.num_children; ++i) {
        const Node& child = tree.nodes[root.first_child + i];
        r.visits[child.action] = child.visits;
        // The child's values are from the view of the side that moved into it: the root's side to move.
        if (child.visits > 0) r.q[child.action] = static_cast<float>(child.value_sum / child.visits);
        r.priors[child.action] = child.prior;
        r.proven[child.action] = child.proven;
    }
    r.value = static_cast<float>(-root.value_sum / root.visits);
    r.network_value = root.network_value;
    r.policy.assign(num_actions_, 0.0f);
    if (options_.root == RootSelection::kPuct) {
        // The children's visits sum to the simulations but where a reused root was proven in the previous search:
        // the visits that stopped at it (a proven node is a leaf there) reach none of its children.
        int64_t total = 0;
        for (const int v : r.visits) total += v;
        MS_CHECK(total > 0, "a search result without visits below its root");
        for (int a = 0; a < num_actions_; ++a) r.policy[a] = static_cast<float>(r.visits[a]) / total;
        return r;
    }
    // kGumbel: softmax(log P + sigma) over the children, and the move.
    const std::span<const Node> kids = children(tree, root);
    std::array<double, kMaxChildren> logits;
    root_sigma(tree, std::span(logits).first(kids.size()));
    double largest = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < kids.size(); ++i) {
        logits[i] += std::log(std::max(kids[i].prior, std::numeric_limits<float>::min()));
        largest = std::max(largest, logits[i]);
    }
    double sum = 0.0;
    for (size_t i = 0; i < kids.size(); ++i) sum += logits[i] = std::exp(logits[i] - largest);
    for (size_t i = 0; i < kids.size(); ++i) r.policy[kids[i].action] = static_cast<float>(logits[i] / sum);
    bool any_unproven = false;
    std::array<int32_t, kMaxChildren> fresh;
    int32_t most = 0;
    for (size_t i = 0; i < kids.size(); ++i) {
        if (kids[i].proven > 0) {
            r.chosen = kids[i].action;
            return r;
        }
        any_unproven |= kids[i].proven == 0;
    }
    for (size_t i = 0; i < kids.size(); ++i) {
        fresh[i] = kids[i].visits - tree.root_kept_visits[i];
        if (!any_unproven || kids[i].proven == 0) most = std::max(most, fresh[i]);
    }
    r.chosen = kids[best_gumbel_child(tree, std::span(fresh).first(kids.size()), most, any_unproven)].action;
    return r;
}

template class BatchedSearch<games::Connect4>;

}  // namespace ms::selfplay
