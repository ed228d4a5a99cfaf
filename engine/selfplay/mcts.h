// mcts.h: Monte Carlo tree search (AlphaZero's PUCT) as a batched layer: the searches of many games run together,
// and every wave of leaf positions of all of them goes to the network (evaluator.h) in batches of its size.
//
// One search (a tree per root position):
//   - The root is evaluated and expanded first (not a simulation); with noise_fraction > 0 its priors are mixed with
//     Dirichlet(dirichlet_alpha) noise: P' = (1 - noise_fraction) P + noise_fraction eta.
//   - A simulation walks from the root, at each expanded node taking the child of the highest
//       Q + U,   U = c_puct * P * sqrt(N_parent) / (1 + N_child)
//     (ties: the lower action), to a leaf: a position never evaluated (expanded with the network's priors; its value
//     is the network's) or a finished game (its exact value, games::outcome_value, without the network; it still
//     counts as a simulation). The leaf's value, from its side to move's view, is added along the path, negated at
//     every ply. A node's N counts its own evaluation too (Leela Zero's convention), so N_parent >= 1 at every
//     expanded node and the root's children's visits sum to the simulations.
//   - Q of a child is its mean value for the side choosing it. An unvisited child's Q is the first-play urgency
//     (FPU) of Leela Zero and Leela Chess Zero: the parent's own Q for its side to move, less
//     fpu_reduction * sqrt(sum of the priors of the visited children); at a root with noise the reduction is 0
//     (Leela Zero), so the moves the noise favours get tried.
//   - Proofs (MCTS-solver, Winands, Bjornsson and Saito 2008): a child whose move wins the game is proven won for
//     the side choosing it; a node with a child proven won is proven lost for the side that moved into it, and a
//     node whose children are all proven lost is proven won. Proofs are propagated up a selection's path when its
//     leaf is expanded. Selection takes a proven-won child, passes over proven-lost ones while any other remains,
//     and stops at a proven node below the root as at a finished game, backing up its exact value (+-1).
//   - Waves: per wave every unfinished tree makes up to leaves_per_wave selections (no more than the simulations it
//     has left). Each selection puts virtual loss on its path: until the wave's backup, every node on it counts
//     virtual_loss more visits, each a loss for the side choosing it, so later selections of the wave spread out. A
//     selection that reaches a leaf already selected in this wave (a collision) is no simulation: it keeps its
//     virtual loss until the backup and then leaves the tree as it was (Leela Chess Zero's collisions). The new
//     leaves of all trees, in tree order then selection order, go to evaluate() in calls of at most max_batch();
//     then every tree expands and backs up its selections in selection order.
//   - Tree reuse (reuse_tree): a BatchedSearch keeps each game's tree (by SearchRoot::game) until its next run. When
//     the game's new root is a position one or two plies below the kept tree's root that the tree has expanded (the
//     move it chose, or that move and the opponent's reply), the search starts from that subtree, its visits,
//     values and proofs included, with the noise mixed into its root's priors afresh, and runs only the simulations
//     that bring the root's children's visits up to `simulations` (Leela Zero's and KataGo's total-visit budget).
//     Otherwise, and without reuse_tree, it builds a fresh tree.
//   - Gumbel root selection (root = kGumbel; Danihelka, Guez, Schrittwieser and Silver 2022, "Policy improvement by
//     planning with Gumbel", as DeepMind's mctx implements it): the root draws a Gumbel(0, 1) variate g(a) per legal
//     action instead of the Dirichlet noise, and a simulation's root child is chosen by sequential halving:
//     considered_visits() lists, per simulation of this search, the visits (of this search) the chosen action must
//     hold, and of the actions holding that many the one of the highest g(a) + log P(a) + sigma(a) is taken,
//     sigma = completed_q_sigma() (its Q completed and scaled). Below the root, PUCT as above. The search's move is
//     that score's best among the actions this search visited most (proofs first, as for the visit counts), and its
//     policy target softmax(log P + sigma) over the legal actions, which improves on the prior even when few actions
//     were visited (visit counts of a small search do not).
// A tree depends only on its root, the trees its game kept, the options, the seed and the evaluator's rows for its
// own leaves, so the search of a game inside a batch of many equals its search alone, bit for bit (the evaluator
// is row-independent).
//
// Randomness is Philox (engine/core/philox.h): a draw is philox(seed, stream = global game index,
// index = draw_index(move number, purpose, counter)), so it is a pure function of (seed, game, move, purpose).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/games/connect4.h"
#include "engine/games/game.h"
#include "engine/selfplay/evaluator.h"

namespace ms::selfplay {

// How a simulation chooses the root's child (above).
enum class RootSelection : uint8_t {
    kPuct,    // as at every node, the priors mixed with the Dirichlet noise where noise_fraction > 0
    kGumbel,  // sequential halving over Gumbel-perturbed priors and completed Q; no Dirichlet noise
};

// sigma's constants (mctx's qtransform_completed_by_mix_value defaults): (c_visit + max_a N(a)) * c_scale * Q01.
constexpr double kGumbelVisitOffset = 50.0;  // c_visit
constexpr double kGumbelValueScale = 0.1;    // c_scale

struct MctsOptions {
    int simulations = 200;         // per search (per move): leaves evaluated or finished games reached
    float c_puct = 1.25f;          // the exploration weight of U (AlphaZero's c_init)
    float dirichlet_alpha = 1.0f;  // the root noise's concentration (AlphaZero: about 10 / typical legal moves)
    float noise_fraction = 0.25f;  // the noise's share of the root priors; 0: no noise (evaluation matches)
    int leaves_per_wave = 8;       // selections per tree per wave
    float virtual_loss = 1.0f;     // lost visits a pending selection adds to each node of its path
    float fpu_reduction = 0.25f;   // an unvisited child's Q: the parent's Q less this * sqrt(visited priors)
    bool reuse_tree = false;       // start from the game's previous tree where it holds the new root (above)
    RootSelection root = RootSelection::kPuct;
};

// Throws UserError, naming the key (selfplay.<option>), its value and the allowed range, for an option out of range.
void check_mcts_options(const MctsOptions& options);

// What a draw is for: part of its Philox index, so that draws of different purposes never coincide.
enum class DrawPurpose : uint8_t { kDirichlet, kTemperature, kPlayerSeed, kGumbel, kPlayoutCap };

// The Philox index of draw `counter` (< 2^28) for `purpose` at move `move` of a game: (move, purpose, counter) in
// bits 32.., 28..31 and 0..27.
uint64_t draw_index(int move, DrawPurpose purpose, uint32_t counter);

// Dirichlet(alpha, ..., alpha) over out.size() entries (summing to 1), drawn for move `move` of game `game`: gamma
// variates by Marsaglia and Tsang, alpha < 1 boosted from alpha + 1 by U^(1/alpha), normalised in log space so
// that tiny alphas cannot underflow to a zero sum.
void dirichlet_noise(float alpha, uint64_t seed, uint64_t game, int move, std::span<double> out);

// g(a) of Gumbel root selection for each of the `out.size()` actions a (draw counter a), drawn for move `move` of game
// `game`: -log(-log u), u uniform in (0, 1).
void gumbel_noise(uint64_t seed, uint64_t game, int move, std::span<double> out);

// Sequential halving's schedule for `actions` considered actions and `simulations` simulations (mctx's
// get_sequence_of_considered_visits): entry i is the visits the action that simulation i goes to holds before it.
// Rounds of max(1, floor(simulations / (ceil(log2 actions) * k))) visits to each of k actions, k = actions first,
// then halved (to no fewer than 2) after each round; with one action, 0, 1, 2, ...
std::vector<int32_t> considered_visits(int actions, int simulations);

// sigma over a node's children (legal actions), mctx's completed-by-mix-value transform: an unvisited child's Q is
// v_mix = (v + N * sum_visited(P Q) / sum_visited(P)) / (N + 1), v the network's value of the node and N its
// children's visits; the completed Qs are rescaled to [0, 1] by their minimum and maximum (when they differ), then
// multiplied by (c_visit + the most visits of a child) * c_scale. Q and v are for the node's side to move.
void completed_q_sigma(std::span<const float> priors, std::span<const int32_t> visits, std::span<const double> q,
                       double network_value, std::span<double> sigma);

// A search to run: the root position (not over) and its game's global index (the noise's Philox stream); the move
// number is the root's move_count().
template <games::Game G>
struct SearchRoot {
    G state;
    uint64_t game = 0;
    // This root's search: its simulations (0: MctsOptions::simulations), and whether its root mixes in the options'
    // noise. A fast search of playout-cap randomisation (self_play.h) runs fewer simulations without noise.
    int simulations = 0;
    bool noise = true;
};

// One root's search, per action (num_actions entries each; 0 for illegal actions).
struct RootResult {
    // Simulations through the action, reused ones included. They sum to the simulations, or fewer when the root was
    // reused from a search that had proven it: the visits that stopped at the proven node reached no child.
    std::vector<int> visits;
    std::vector<float> q;        // the action's mean value for the side to move (0 when unvisited)
    std::vector<float> priors;   // the priors the search used: the network's, mixed with the noise where on
    std::vector<int8_t> proven;  // +1: the search proved the action wins for the side to move, -1: loses, 0: neither
    // The policy the network learns from: the visit distribution (kPuct), or softmax(log P + sigma) over the legal
    // actions (kGumbel).
    std::vector<float> policy;
    float value = 0.0f;          // the root's mean value for the side to move, its own evaluation included
    float network_value = 0.0f;  // the network's value of the root position
    int chosen = -1;             // kGumbel: the search's move; kPuct: -1 (the caller chooses from the visits)
};

// Totals over a BatchedSearch's runs: the throughput a benchmark compares (batched vs one leaf at a time).
struct SearchCounters {
    int64_t searches = 0;
    int64_t simulations = 0;          // run by these searches (reused ones not counted)
    int64_t reused = 0;               // simulations the searches' roots kept from their games' previous trees
    int64_t collisions = 0;           // selections that met a leaf already pending in their wave
    int64_t waves = 0;                // rounds of selection, evaluation and backup (root expansions not counted)
    int64_t positions_evaluated = 0;  // rows sent to evaluate()
    int64_t evaluate_calls = 0;

    SearchCounters& operator+=(const SearchCounters& other) {
        searches += other.searches;
        simulations += other.simulations;
        reused += other.reused;
        collisions += other.collisions;
        waves += other.waves;
        positions_evaluated += other.positions_evaluated;
        evaluate_calls += other.evaluate_calls;
        return *this;
    }
};

// The searches of many games, run together. Instantiated for games::Connect4 (mcts.cpp); another game adds its
// line there.
template <games::Game G>
class BatchedSearch {
  public:
    // Checks the options (UserError). `seed`: the noise's.
    BatchedSearch(const MctsOptions& options, uint64_t seed);

    // One search per root, all roots of one board size, none over; the results in the roots' order.
    std::vector<RootResult> run(Evaluator<G>& evaluator, std::span<const SearchRoot<G>> roots);

    const MctsOptions& options() const { return options_; }
    const SearchCounters& counters() const { return counters_; }

  private:
    enum class NodeStatus : uint8_t { kLeaf, kPending, kExpanded };  // kPending: a leaf selected in this wave
    struct Node {
        G state;
        double value_sum = 0.0;  // backed-up values, from the view of the side that moved into this node
        float prior = 0.0f;
        int32_t visits = 0;
        int32_t in_flight = 0;  // this wave's selections through the node (virtual loss)
        int32_t first_child = -1;
        int8_t num_children = 0;
        int8_t action = -1;          // the move into this node
        int8_t proven = 0;           // +1: won for the side that moved into this node, -1: lost, 0: not proven
        float network_value = 0.0f;  // expanded: the network's value for the node's side to move
        NodeStatus status = NodeStatus::kLeaf;
        games::Outcome outcome = games::Outcome::kOngoing;  // the node's state's, computed once
    };
    enum class SelectionKind : uint8_t { kNewLeaf, kTerminal, kCollision };
    struct Selection {
        int32_t path_begin = 0, path_end = 0;  // the path in Tree::paths, root first
        int32_t row = -1;                      // kNewLeaf: the leaf's row in the wave's evaluation
        SelectionKind kind = SelectionKind::kNewLeaf;
    };
    struct Tree {
        std::vector<Node> nodes;  // nodes[0] the root; a node's children contiguous, in action order
        std::vector<int32_t> paths;
        std::vector<Selection> selections;  // this wave's
        uint64_t game = 0;
        int budget = 0;       // the simulations this search ends at, the reused ones included
        bool noise = true;    // SearchRoot::noise
        int simulations = 0;  // done, the reused ones included
        int reused = 0;       // kept from the game's previous tree
        // kGumbel, per root child in child order: g + log P, and its visits kept from the previous tree; and the
        // schedule of this search's simulations (considered_visits).
        std::vector<double> root_scores;
        std::vector<int32_t> root_kept_visits;
        std::vector<int32_t> schedule;
    };

    // A node's children, contiguous in tree.nodes.
    static std::span<const Node> children(const Tree& tree, const Node& node) {
        return {tree.nodes.data() + node.first_child, static_cast<size_t>(node.num_children)};
    }
    // The roots' trees: each from its game's previous tree where reuse_tree finds it there, else a fresh one,
    // evaluated and expanded (all fresh roots in one batch, no simulation); then the roots' noise.
    void plant_roots(Evaluator<G>& evaluator, std::span<const SearchRoot<G>> roots);
    // The node of `tree` one or two plies below its root whose state is `state`, expanded; -1 if none.
    static int32_t find_expanded(const Tree& tree, const G& state);
    // `to` becomes the subtree of `from` under node `top`, top its root, children kept contiguous.
    static void copy_subtree(const Tree& from, int32_t top, Tree& to);
    void select_wave(Tree& tree);
    // Expands the wave's new leaves and backs up its selections, in selection order, and removes their virtual loss.
    void back_up_wave(Tree& tree);
    int32_t select_child(const Tree& tree, int32_t node) const;
    void expand(Tree& tree, int32_t node, std::span<const float> priors, float network_value);
    void add_noise(Tree& tree);
    // kGumbel: the root's draws and schedule.
    void plant_gumbel(Tree& tree) const;
    // kGumbel: the root child the next simulation takes.
    int32_t select_root_gumbel(const Tree& tree) const;
    // kGumbel: among the root's children that proofs allow (any_unproven: passing over proven losses) and that this
    // search visited `wanted` times (fresh, in child order), the one of the highest g + log P + sigma (the first of
    // equals); its child index.
    static int32_t best_gumbel_child(const Tree& tree, std::span<const int32_t> fresh, int32_t wanted,
                                     bool any_unproven);
    // kGumbel: sigma of the root's children (completed_q_sigma), in child order.
    static void root_sigma(const Tree& tree, std::span<double> sigma);
    static void backup(Tree& tree, std::span<const int32_t> path, double leaf_value);
    // Proves what the children of the path's nodes now prove, from the leaf up, stopping at the first node unproven.
    static void prove(Tree& tree, std::span<const int32_t> path);
    void evaluate_rows(Evaluator<G>& evaluator);
    RootResult result(const Tree& tree) const;

    MctsOptions options_;
    uint64_t seed_;
    int num_actions_ = 0;
    SearchCounters counters_;
    std::vector<Tree> trees_;     // this run's; kept until the next, for reuse_tree and for their storage
    std::vector<Tree> previous_;  // the last run's, during plant_roots
    // The wave's leaves of all trees and the network's answers: (rows), (rows x num_actions), (rows).
    std::vector<G> rows_;
    std::vector<float> row_priors_;
    std::vector<float> row_values_;
};

extern template class BatchedSearch<games::Connect4>;

// One search alone: a BatchedSearch of one root.
template <games::Game G>
RootResult search(Evaluator<G>& evaluator, const MctsOptions& options, uint64_t seed, const SearchRoot<G>& root) {
    BatchedSearch<G> batch(options, seed);
    return batch.run(evaluator, std::span<const SearchRoot<G>>(&root, 1)).front();
}

}  // namespace ms::selfplay
