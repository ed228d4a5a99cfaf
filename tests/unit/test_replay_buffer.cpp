// test_replay_buffer.cpp: engine/selfplay/replay_buffer.h -- the sliding window (which positions are dropped, in
// which order), clear_for, reflections of state and policy, the sampling contract (the documented Philox formula,
// determinism, independence of the buffer object, slices, range and balance), fill_batch, the one-rank all-gather,
// and the file: its documented layout, a bit-exact round trip, and each kind of damage refused with its sentence.
// The data-parallel all-gather over MPI is tests/comm/test_replay_buffer_dp.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/ckpt/checksum.h"
#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/games/connect4.h"
#include "engine/games/game.h"
#include "engine/selfplay/replay_buffer.h"
#include "tests/common/temp_dir.h"

namespace {

using ms::games::Connect4;
using ms::selfplay::Mirror;
using ms::selfplay::ReplayBatch;
using ms::selfplay::ReplayBuffer;
using ms::selfplay::ReplaySample;
using Position = ReplayBuffer::Position;

// Position k of a made-up self-play run on rows x cols: k % 9 random moves (seed k) into a game, a policy that
// differs per k and column, and outcome (k % 3) - 1: every k is told apart by its policy.
Position position(int rows, int cols, int k) {
    Position p;
    p.state = Connect4::empty(rows, cols);
    for (int m = 0; m < k % 9 && !p.state.is_terminal(); ++m) {
        p.state.play(ms::games::random_move(p.state, static_cast<uint64_t>(k)));
    }
    for (int c = 0; c < cols; ++c) p.policy.push_back(static_cast<float>((k * 13 + c) % 1000) / 1000.0f);
    p.value = static_cast<float>(k % 3 - 1);
    return p;
}

std::vector<Position> positions(int rows, int cols, int first, int count) {
    std::vector<Position> v;
    for (int k = first; k < first + count; ++k) v.push_back(position(rows, cols, k));
    return v;
}

void expect_same(const Position& a, const Position& b) {
    EXPECT_EQ(a.state, b.state);
    EXPECT_EQ(a.policy, b.policy);
    EXPECT_EQ(a.value, b.value);
}

// The buffer holds positions first .. first + count - 1, oldest first.
void expect_holds(const ReplayBuffer& buffer, int first, int count) {
    ASSERT_EQ(buffer.size(), count);
    for (int i = 0; i < count; ++i) {
        SCOPED_TRACE("position " + std::to_string(i));
        expect_same(buffer.get(i, Mirror::kAsPlayed), position(buffer.rows(), buffer.cols(), first + i));
    }
}

// The UserError text of f() with its exit code, or "" when it does not throw one.
template <typename F>
std::string user_error(F f, int exit_code = ms::kExitCheckpoint) {
    try {
        f();
    } catch (const ms::UserError& e) {
        EXPECT_EQ(e.exit_code(), exit_code) << e.what();
        return e.what();
    }
    return "";
}

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
}

// The file's trailing XXH64 recomputed: damage that the checksum alone would catch reaches the later checks.
void reseal(std::string& bytes) {
    const uint64_t h = ms::xxh64(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &h, 8);
}

template <typename T>
T field(const std::string& bytes, size_t offset) {
    T v;
    std::memcpy(&v, bytes.data() + offset, sizeof(T));
    return v;
}

template <typename T>
void set_field(std::string& bytes, size_t offset, T v) {
    std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

TEST(ReplayBuffer, RefusesABadBoardOrCapacity) {
    EXPECT_EQ(user_error([] { ReplayBuffer(4, 5, 0); }, ms::kExitConfigError),
              "config error: the replay buffer's capacity is 0 positions; it must hold at least 1 (it is the number of "
              "newest self-play positions training samples from)");
    EXPECT_EQ(user_error([] { ReplayBuffer(8, 8, 10); }, ms::kExitConfigError),
              "game error: connect4 cannot be played on a board of 8 rows x 8 columns: (rows + 1) * columns = 72 is "
              "over the 64 bits of the bitboard, which holds rows + 1 bits per column; the largest boards are 8 x 7, "
              "7 x 8 and 6 x 9, the standard one 6 x 7");
}

TEST(ReplayBuffer, TheWindowDropsTheOldestFirst) {
    ReplayBuffer buffer(4, 5, 5);
    EXPECT_EQ(buffer.num_actions(), 5);
    EXPECT_EQ(buffer.size(), 0);
    buffer.add(positions(4, 5, 0, 3));
    expect_holds(buffer, 0, 3);
    EXPECT_EQ(buffer.total_added(), 3);
    buffer.add(positions(4, 5, 3, 4));  // 7 added: 0 and 1 dropped
    expect_holds(buffer, 2, 5);
    EXPECT_EQ(buffer.total_added(), 7);
    buffer.add(positions(4, 5, 7, 1));  // one at a time: 2 dropped
    expect_holds(buffer, 3, 5);
    buffer.add(positions(4, 5, 8, 12));  // more than the capacity at once: its newest 5 stay
    expect_holds(buffer, 15, 5);
    EXPECT_EQ(buffer.total_added(), 20);
    buffer.add({});
    expect_holds(buffer, 15, 5);
}

TEST(ReplayBuffer, ClearForTakesTheNextBoard) {
    ReplayBuffer buffer(4, 5, 6);
    buffer.add(positions(4, 5, 0, 9));
    buffer.clear_for(5, 6);
    EXPECT_EQ(buffer.size(), 0);
    EXPECT_EQ(buffer.rows(), 5);
    EXPECT_EQ(buffer.cols(), 6);
    EXPECT_EQ(buffer.capacity(), 6);
    EXPECT_EQ(buffer.total_added(), 9);
    buffer.add(positions(5, 6, 100, 8));
    expect_holds(buffer, 102, 6);
    EXPECT_EQ(buffer.total_added(), 17);
    EXPECT_NE(user_error([&] { buffer.clear_for(9, 7); }, ms::kExitConfigError), "");
    EXPECT_EQ(buffer.rows(), 5);  // a refused board leaves the buffer as it was
    EXPECT_EQ(buffer.size(), 6);
}

TEST(ReplayBuffer, MirrorReflectsStateAndPolicy) {
    // 4 x 5 after "1123": X in columns 1 and 2, O in columns 1 and 3
    Position p{Connect4::from_moves(4, 5, "1123"), {0.5f, 0.25f, 0.125f, 0.0625f, 0.0625f}, -1.0f};
    ReplayBuffer buffer(4, 5, 4);
    buffer.add(positions(4, 5, 0, 3));  // the ring wraps once the next two are in
    buffer.add(std::vector<Position>{p, position(4, 5, 3)});
    const Position as_played = buffer.get(2, Mirror::kAsPlayed);
    const Position mirrored = buffer.get(2, Mirror::kMirrored);
    expect_same(as_played, p);
    EXPECT_EQ(mirrored.state, Connect4::from_moves(4, 5, "5543"));
    EXPECT_EQ(mirrored.policy, (std::vector<float>{0.0625f, 0.0625f, 0.125f, 0.25f, 0.5f}));
    EXPECT_EQ(mirrored.value, -1.0f);
    // every position: the reflection of a reflection is the position
    for (int i = 0; i < buffer.size(); ++i) {
        const Position m = buffer.get(i, Mirror::kMirrored);
        const Position a = buffer.get(i, Mirror::kAsPlayed);
        EXPECT_EQ(m.state, a.state.mirrored());
        EXPECT_EQ(m.state.mirrored(), a.state);
        EXPECT_EQ(m.policy, std::vector<float>(a.policy.rbegin(), a.policy.rend()));
    }
}

TEST(ReplayBuffer, SamplingFollowsTheDocumentedDraws) {
    ReplayBuffer buffer(4, 5, 10);
    buffer.add(positions(4, 5, 0, 13));
    const uint64_t seed = 1234;
    const int64_t step = 7;
    const ReplaySample s = buffer.sample(64, seed, step);
    ASSERT_EQ(s.index.size(), 64u);
    ASSERT_EQ(s.mirror.size(), 64u);
    for (uint64_t i = 0; i < 64; ++i) {
        const uint64_t counter = (static_cast<uint64_t>(step) << 32) | i;
        const double u = ms::philox_uniform_double(seed, ms::name_hash("replay buffer: sample index"), counter);
        const double v = ms::philox_uniform_double(seed, ms::name_hash("replay buffer: sample mirror"), counter);
        EXPECT_EQ(s.index[i], static_cast<int64_t>(u * 10)) << i;
        EXPECT_EQ(s.mirror[i], v < 0.5 ? Mirror::kAsPlayed : Mirror::kMirrored) << i;
    }
}

TEST(ReplayBuffer, SamplingIsAFunctionOfSeedStepAndSizeAlone) {
    ReplayBuffer a(4, 5, 10), b(5, 6, 100);
    a.add(positions(4, 5, 0, 25));   // full: 10
    b.add(positions(5, 6, 50, 10));  // another board and capacity, other positions, the same size
    const ReplaySample sa = a.sample(256, 99, 3);
    EXPECT_EQ(sa.index, b.sample(256, 99, 3).index);
    EXPECT_EQ(sa.mirror, b.sample(256, 99, 3).mirror);
    EXPECT_EQ(sa.index, a.sample(256, 99, 3).index);  // and the same again
    EXPECT_NE(sa.index, a.sample(256, 99, 4).index);  // another step
    EXPECT_NE(sa.index, a.sample(256, 98, 3).index);  // another seed
    // any cut into rank slices gives the same draws
    for (const int64_t b_local : {1, 16, 64, 128}) {
        ReplaySample joined;
        for (int64_t first = 0; first < 256; first += b_local) {
            const ReplaySample part = a.sample_slice(99, 3, first, b_local);
            joined.index.insert(joined.index.end(), part.index.begin(), part.index.end());
            joined.mirror.insert(joined.mirror.end(), part.mirror.begin(), part.mirror.end());
        }
        EXPECT_EQ(joined.index, sa.index) << b_local;
        EXPECT_EQ(joined.mirror, sa.mirror) << b_local;
    }
}

TEST(ReplayBuffer, SamplingCoversTheBufferEvenly) {
    ReplayBuffer buffer(4, 4, 10);
    buffer.add(positions(4, 4, 0, 10));
    std::vector<int> hits(10);
    int mirrored = 0;
    constexpr int kDraws = 100000;
    const ReplaySample s = buffer.sample(kDraws, 5, 0);
    for (int i = 0; i < kDraws; ++i) {
        ASSERT_GE(s.index[i], 0);
        ASSERT_LT(s.index[i], 10);
        ++hits[static_cast<size_t>(s.index[i])];
        mirrored += s.mirror[i] == Mirror::kMirrored;
    }
    // Binomial(100000, 0.1) has sd 95 and Binomial(100000, 0.5) sd 158: the bounds are about 5 sd, so a fair draw
    // passes, and a draw that skips a position or misses a reflection fails. The draws are fixed by the seed.
    for (int i = 0; i < 10; ++i) EXPECT_NEAR(hits[i], 10000, 500) << i;
    EXPECT_NEAR(mirrored, 50000, 800);
    // one position: every draw is it
    ReplayBuffer one(4, 4, 10);
    one.add(positions(4, 4, 0, 1));
    EXPECT_EQ(one.sample(100, 5, 0).index, std::vector<int64_t>(100, 0));
}

TEST(ReplayBuffer, FillBatchHoldsTheSampledPositions) {
    ReplayBuffer buffer(5, 6, 8);
    buffer.add(positions(5, 6, 0, 11));  // wrapped
    const ReplaySample s = buffer.sample(32, 17, 2);
    ReplayBatch batch;
    buffer.fill_batch(s, batch);
    ASSERT_EQ(batch.states.size(), 32u);
    ASSERT_EQ(batch.policies.size(), 32u * 6);
    ASSERT_EQ(batch.outcomes.size(), 32u);
    for (size_t k = 0; k < 32; ++k) {
        const Position want = buffer.get(s.index[k], s.mirror[k]);
        EXPECT_EQ(batch.states[k], want.state) << k;
        EXPECT_EQ(std::vector<float>(batch.policies.begin() + static_cast<int64_t>(k * 6),
                                     batch.policies.begin() + static_cast<int64_t>(k * 6 + 6)),
                  want.policy)
            << k;
        EXPECT_EQ(batch.outcomes[k], want.value) << k;
    }
    buffer.fill_batch(buffer.sample(3, 17, 3), batch);  // a smaller batch into the same storage
    EXPECT_EQ(batch.states.size(), 3u);
    EXPECT_EQ(batch.policies.size(), 18u);
}

TEST(ReplayBuffer, AllRanksOfAGroupOfOneIsAdd) {
    ms::SelfCommunicator self("dp");
    ReplayBuffer gathered(4, 5, 6), added(4, 5, 6);
    for (int round = 0; round < 3; ++round) {
        const std::vector<Position> mine = positions(4, 5, 10 * round, 2 + 2 * round);
        gathered.add_from_all_ranks(self, mine);
        added.add(mine);
    }
    gathered.add_from_all_ranks(self, {});
    EXPECT_TRUE(gathered == added);
    EXPECT_EQ(gathered.total_added(), 12);
}

TEST(ReplayBuffer, FileLayoutIsTheDocumentedOne) {
    ms::test::TempDir dir("replay");
    ReplayBuffer buffer(5, 6, 3);
    buffer.add(positions(5, 6, 0, 4));  // holds 1, 2, 3
    buffer.save(dir / "buffer.bin");
    const std::string bytes = read_bytes(dir / "buffer.bin");
    const size_t record = 4 * (6 + 5);
    ASSERT_EQ(bytes.size(), 60 + 3 * record + 8);
    EXPECT_EQ(bytes.substr(0, 8), "MSREPLAY");
    EXPECT_EQ(field<uint32_t>(bytes, 8), 1u);
    EXPECT_EQ(bytes.substr(12, 16), std::string("connect4") + std::string(8, '\0'));
    EXPECT_EQ(field<uint32_t>(bytes, 28), 5u);
    EXPECT_EQ(field<uint32_t>(bytes, 32), 6u);
    EXPECT_EQ(field<uint64_t>(bytes, 36), 3u);
    EXPECT_EQ(field<uint64_t>(bytes, 44), 3u);
    EXPECT_EQ(field<uint64_t>(bytes, 52), 4u);
    for (int i = 0; i < 3; ++i) {  // the oldest first
        const Position p = position(5, 6, 1 + i);
        const size_t at = 60 + static_cast<size_t>(i) * record;
        EXPECT_EQ(field<uint64_t>(bytes, at), p.state.current_stones()) << i;
        EXPECT_EQ(field<uint64_t>(bytes, at + 8), p.state.all_stones()) << i;
        for (int c = 0; c < 6; ++c) EXPECT_EQ(field<float>(bytes, at + 16 + 4 * c), p.policy[c]) << i;
        EXPECT_EQ(field<float>(bytes, at + 40), p.value) << i;
    }
    EXPECT_EQ(field<uint64_t>(bytes, bytes.size() - 8), ms::xxh64(bytes.data(), bytes.size() - 8));
}

TEST(ReplayBuffer, SaveLoadIsBitExact) {
    ms::test::TempDir dir("replay");
    ReplayBuffer buffer(6, 7, 50);
    buffer.add(positions(6, 7, 0, 83));  // wrapped: the ring's first slot is not the oldest
    buffer.save(dir / "buffer.bin");
    const ReplayBuffer loaded = ReplayBuffer::load(dir / "buffer.bin");
    EXPECT_TRUE(loaded == buffer);
    EXPECT_EQ(loaded.capacity(), 50);
    EXPECT_EQ(loaded.total_added(), 83);
    // sampling and batches go on as before the save
    for (int64_t step = 0; step < 4; ++step) {
        const ReplaySample before = buffer.sample(64, 3, step), after = loaded.sample(64, 3, step);
        EXPECT_EQ(after.index, before.index);
        EXPECT_EQ(after.mirror, before.mirror);
        ReplayBatch b1, b2;
        buffer.fill_batch(before, b1);
        loaded.fill_batch(after, b2);
        EXPECT_EQ(b1.states, b2.states);
        EXPECT_EQ(b1.policies, b2.policies);
        EXPECT_EQ(b1.outcomes, b2.outcomes);
    }
    // and so does adding: the loaded ring drops the same positions next
    ReplayBuffer resumed = loaded;
    buffer.add(positions(6, 7, 83, 20));
    resumed.add(positions(6, 7, 83, 20));
    EXPECT_TRUE(resumed == buffer);
    // an empty buffer (after the curriculum's clear) round-trips too; save replaces the file
    buffer.clear_for(4, 5);
    buffer.save(dir / "buffer.bin");
    const ReplayBuffer empty = ReplayBuffer::load(dir / "buffer.bin");
    EXPECT_TRUE(empty == buffer);
    EXPECT_EQ(empty.rows(), 4);
    EXPECT_EQ(empty.size(), 0);
    EXPECT_EQ(empty.total_added(), 103);
}

TEST(ReplayBuffer, LoadRefusesDamagedFiles) {
    ms::test::TempDir dir("replay");
    ReplayBuffer buffer(4, 5, 10);
    buffer.add(positions(4, 5, 0, 4));
    const std::string path = dir / "buffer.bin";
    buffer.save(path);
    const std::string good = read_bytes(path);
    ASSERT_EQ(good.size(), 60 + 4 * 40 + 8u);
    const std::string hint = "; restore it from a copy, or remove it to start from an empty buffer";
    const auto refusal = [&](const std::string& bytes) {
        write_bytes(path, bytes);
        return user_error([&] { ReplayBuffer::load(path); });
    };
    const std::string name = "replay buffer error: '" + path + "' ";

    EXPECT_EQ(user_error([&] { ReplayBuffer::load(dir / "none.bin"); }),
              "replay buffer error: '" + (dir / "none.bin") + "' cannot be opened: No such file or directory");
    EXPECT_EQ(refusal(good.substr(0, 30)), name +
                                               "is 30 bytes, shorter than the 68 of an empty buffer's file: it is "
                                               "truncated or not a replay buffer file" +
                                               hint);
    EXPECT_EQ(refusal(good.substr(0, good.size() - 5)),
              name +
                  "is 223 bytes, but its header (4 positions of 40 bytes) makes it 228: the file is truncated or "
                  "corrupt" +
                  hint);
    EXPECT_EQ(refusal(good + "x"), name +
                                       "is 229 bytes, but its header (4 positions of 40 bytes) makes it 228: the file "
                                       "is truncated or corrupt" +
                                       hint);
    std::string bytes = good;
    set_field<uint64_t>(bytes, 44, uint64_t{1} << 60);  // a count no file holds
    EXPECT_EQ(refusal(bytes), name +
                                  "is 228 bytes, but its header (1152921504606846976 positions of 40 bytes) makes it "
                                  "over 2^64 bytes: the file is truncated or corrupt" +
                                  hint);

    bytes = good;
    bytes[60 + 40 + 17] ^= 0x10;  // a bit of position 1's policy
    const uint64_t stored = field<uint64_t>(good, good.size() - 8);
    EXPECT_EQ(refusal(bytes), name + "is corrupt: the XXH64 of its first 220 bytes is " +
                                  ms::xxh64_hex(ms::xxh64(bytes.data(), 220)) + ", the file stores " +
                                  ms::xxh64_hex(stored) + hint);

    bytes = good;
    bytes[0] = 'X';
    EXPECT_EQ(refusal(bytes), name + "does not start with the magic \"MSREPLAY\": it is not a replay buffer file");
    bytes = good;
    set_field<uint32_t>(bytes, 8, 2);
    EXPECT_EQ(refusal(bytes), name +
                                  "is of format version 2; this build reads version 1 (save it again with the build "
                                  "that wrote it, or start from an empty buffer)");
    bytes = good;
    std::memcpy(bytes.data() + 12, "chess\0\0\0", 8);
    reseal(bytes);
    EXPECT_EQ(refusal(bytes), name + "holds positions of the game 'chess'; the replay buffer holds connect4 positions");
    bytes = good;
    set_field<uint32_t>(bytes, 28, 9);  // 9 rows
    reseal(bytes);
    EXPECT_EQ(refusal(bytes),
              name +
                  "names a board of 9 rows x 5 columns: game error: connect4 cannot be played on a board of 9 rows "
                  "x 5 columns: rows must be 4..8; the largest boards are 8 x 7, 7 x 8 and 6 x 9, the standard one "
                  "6 x 7" +
                  hint);

    bytes = good;
    set_field<uint64_t>(bytes, 36, 3);  // capacity 3 < 4 positions, sealed as if written so
    reseal(bytes);
    EXPECT_EQ(refusal(bytes), name +
                                  "has a header that cannot be: capacity 3, 4 positions, 4 added in all (it needs "
                                  "capacity >= 1, positions <= capacity and positions <= added)" +
                                  hint);

    // the records: sealed, so only the position checks can see them
    const size_t second = 60 + 40;  // position 1
    bytes = good;
    set_field<uint64_t>(bytes, second + 8, field<uint64_t>(bytes, second + 8) | (uint64_t{1} << 3));  // column 1, row 4
    reseal(bytes);
    const Position p1 = position(4, 5, 1);
    EXPECT_EQ(refusal(bytes),
              name + "holds an invalid position 1 (0 the oldest): game error: connect4 bitboards (current " +
                  fmt::format("{:#x}, all {:#x}", p1.state.current_stones(), p1.state.all_stones() | 8) +
                  ") on a 4 x 5 board are no position: the stone in column 1, row 4 (from 1, the bottom row 1) is "
                  "above an empty cell, but stones stack from the bottom" +
                  hint);
    bytes = good;
    set_field<float>(bytes, second + 16 + 4 * 2, std::numeric_limits<float>::quiet_NaN());
    reseal(bytes);
    EXPECT_EQ(
        refusal(bytes),
        name + "holds position 1 (0 the oldest) whose policy gives column 3 the value nan, not a probability" + hint);
    bytes = good;
    set_field<float>(bytes, second + 36, 2.0f);
    reseal(bytes);
    EXPECT_EQ(refusal(bytes), name + "holds position 1 (0 the oldest) with the outcome 2, outside [-1, 1]" + hint);

    write_bytes(path, good);  // the file as written still loads
    EXPECT_TRUE(ReplayBuffer::load(path) == buffer);
}

}  // namespace
