// replay_buffer.h: the self-play replay buffer: the newest `capacity` training positions (evaluator.h's
// TrainingPosition), the training batches drawn from them, kept equal on every data-parallel rank, and its file.
//
// One game, Connect Four, on one board size at a time: a curriculum that moves to a bigger board empties the buffer
// (clear_for), since positions of two sizes do not share a network input. Only the state codec is the game's own:
// a position is stored as connect4.h's two bitboards and read back through Connect4::from_bitboards, which refuses
// a state no game reaches.
//
// Storage: a ring of at most `capacity` slots, flat. Positions are named by age: index 0 is the oldest held,
// size() - 1 the newest; when the ring is full, each new position replaces the oldest.
//   states_    (size)                 the positions
//   policies_  (size, num_actions)    the search's policy (its visit distribution, or Gumbel's), a row per position
//   outcomes_  (size)                 +1 won, 0 drawn, -1 lost, for the side to move
//
// Sampling: draw i of training step `step` is a position index and a reflection, each a pure function of
// (seed, step, i, size()): index = floor(u * size()) and mirrored when v >= 0.5, with u and v philox_uniform_double
// draws (engine/core/philox.h) of their own named streams at counter (step << 32) | i. So a step's batch depends on
// what the buffer holds, never on which object or rank draws it, and rank r of a data-parallel group with b
// positions per rank draws its share, [r * b, (r + 1) * b), alone (sample_slice).
//
// Data parallelism: rank r plays games of its own and add_from_all_ranks() all-gathers every rank's new positions
// and adds them in rank order, so every rank holds what one rank that played all of the games would hold.
//
// File (save / load; docs/formats.md "Self-play replay buffer"), little-endian, written atomically (path.tmp,
// fsync, rename: engine/ckpt/atomic_dir.h):
//   offset  bytes  field
//   0       8      magic "MSREPLAY"
//   8       4      u32 format version, 1
//   12      16     the game's name (game_name(): "connect4"), padded with NUL bytes
//   28      4      u32 rows
//   32      4      u32 cols (= num_actions)
//   36      8      u64 capacity
//   44      8      u64 count: the positions that follow
//   52      8      u64 total added
//   60      ...    count records of 4 * (cols + 5) bytes, oldest first: u64 the side to move's stones, u64 all
//                  stones (connect4.h's layout), f32 policy[cols], f32 outcome
//   end-8   8      u64 XXH64 (seed 0, engine/ckpt/checksum.h) of every byte before it
// The records are the bytes add_from_all_ranks() sends, too.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/games/connect4.h"
#include "engine/selfplay/evaluator.h"

namespace ms::selfplay {

// A position as played or reflected left to right (Connect4::mirrored(), the policy reversed over the columns):
// the game's one symmetry, which doubles what the network sees.
enum class Mirror : uint8_t { kAsPlayed, kMirrored };

// The draws of one training step: which positions, and how each is shown.
struct ReplaySample {
    std::vector<int64_t> index;  // (n) positions by age, 0 the oldest held
    std::vector<Mirror> mirror;  // (n)
};

// A training batch, the sample's positions as the network learns from them.
struct ReplayBatch {
    std::vector<games::Connect4> states;  // (n)
    std::vector<float> policies;          // (n, num_actions)
    std::vector<float> outcomes;          // (n)
};

class ReplayBuffer {
  public:
    using Position = TrainingPosition<games::Connect4>;

    // An empty buffer for positions of the rows x cols board. Throws UserError for a board Connect4 refuses
    // (check_size) or a capacity below 1.
    ReplayBuffer(int rows, int cols, int64_t capacity);

    int rows() const { return rows_; }
    int cols() const { return cols_; }
    int num_actions() const { return cols_; }
    int64_t capacity() const { return capacity_; }
    // The positions held: min(capacity, positions added since the last clear_for).
    int64_t size() const { return static_cast<int64_t>(outcomes_.size()); }
    // Every position ever added, the ones dropped and the ones before a clear_for included: the run's count of
    // positions played, which a resume carries on.
    int64_t total_added() const { return total_added_; }

    // Adds `positions` in order, newest last, dropping the oldest held beyond the capacity. Each must be of this
    // buffer's board with a policy of num_actions values (else MS_CHECK: the self-play code's bug, not input).
    void add(std::span<const Position> positions);
    // Collective over `dp`: every rank's `mine` (counts may differ), added in rank order on every rank. Every rank's
    // buffer must be of the same board (MS_CHECK).
    void add_from_all_ranks(Communicator& dp, std::span<const Position> mine);
    // Empties the buffer and makes it hold positions of the rows x cols board (the curriculum's next board); the
    // capacity and total_added() stay. Throws UserError for a board Connect4 refuses.
    void clear_for(int rows, int cols);

    // Position `index` (0 the oldest held), as played or reflected.
    Position get(int64_t index, Mirror mirror) const;

    // The draws [0, global_batch) of training step `step` (the header comment); the buffer must not be empty.
    ReplaySample sample(int64_t global_batch, uint64_t seed, int64_t step) const {
        return sample_slice(seed, step, 0, global_batch);
    }
    // The draws [first, first + count) of the same sequence: the share of one data-parallel rank. step and
    // first + count must be below 2^32 (they share the Philox counter).
    ReplaySample sample_slice(uint64_t seed, int64_t step, int64_t first, int64_t count) const;
    // The positions `draws` names into `out`, resized to the sample's size (its capacity reused step after step).
    void fill_batch(const ReplaySample& draws, ReplayBatch& out) const;

    // Writes the file of the header comment, atomically. Throws UserError (kExitCheckpoint) naming the path and the
    // OS reason when it cannot be written.
    void save(const std::string& path) const;
    // The buffer `path` holds, with its board, capacity and total_added(), so that sampling goes on as before the
    // save. Throws UserError (kExitCheckpoint) naming the path and the problem for a file that is missing, not a
    // replay buffer, of another version or game, truncated, corrupt (checksum), or holding an invalid position.
    static ReplayBuffer load(const std::string& path);

    // The same board, capacity, total_added() and positions, oldest first, bit for bit (not where each sits in
    // the ring).
    friend bool operator==(const ReplayBuffer& a, const ReplayBuffer& b);

  private:
    // The slot of the ring holding position `index`.
    int64_t slot(int64_t index) const { return (first_ + index) % capacity_; }
    std::span<const float> policy_at_slot(int64_t s) const {
        return std::span<const float>(policies_).subspan(static_cast<size_t>(s * cols_), static_cast<size_t>(cols_));
    }
    // The one place a position enters the ring (add, add_from_all_ranks and load all come here).
    void push(const games::Connect4& state, std::span<const float> policy, float outcome);
    // The one place a position leaves it (get and fill_batch): position `index`, as played or reflected.
    void copy_out(int64_t index, Mirror mirror, games::Connect4& state, std::span<float> policy, float& outcome) const;
    // The file's record of position `index` (header comment) into `out`, 4 * (cols + 5) bytes.
    void write_record(int64_t index, std::byte* out) const;

    int rows_;
    int cols_;
    int64_t capacity_;
    int64_t first_ = 0;  // the slot of the oldest position: 0 until the ring is full, then where the next one goes
    int64_t total_added_ = 0;
    std::vector<games::Connect4> states_;  // (size)
    std::vector<float> policies_;          // (size, cols)
    std::vector<float> outcomes_;          // (size)
};

}  // namespace ms::selfplay
