// replay_buffer.cpp: the replay buffer (replay_buffer.h): the ring, the layout-invariant sampling, the all-gather of
// every rank's new positions, and the file, whose records are also what the all-gather sends.
#include "engine/selfplay/replay_buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <string_view>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checksum.h"
#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/games/game.h"

namespace ms::selfplay {
namespace {

static_assert(std::endian::native == std::endian::little, "the replay buffer file is little-endian; add byte swaps");

using games::Connect4;

// The Philox streams of the draws (philox.h): named, so they meet no other draw of the same seed.
constexpr uint64_t kStreamSampleIndex = name_hash("replay buffer: sample index");
constexpr uint64_t kStreamSampleMirror = name_hash("replay buffer: sample mirror");
// The counter is (step << 32) | draw, so both stay below 2^32.
constexpr int64_t kCounterHalf = int64_t{1} << 32;

constexpr std::string_view kMagic = "MSREPLAY";
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kGameNameBytes = 16;
// magic, version, game name, rows, cols, capacity, count, total added: the header comment's table.
constexpr size_t kHeaderBytes = kMagic.size() + 4 + kGameNameBytes + 4 + 4 + 8 + 8 + 8;
constexpr size_t kChecksumBytes = 8;

// A record: the two bitboards (u64 each), then the policy and the outcome (f32 each).
constexpr size_t kBitboardBytes = 2 * sizeof(uint64_t);
constexpr size_t record_bytes(int cols) { return kBitboardBytes + (static_cast<size_t>(cols) + 1) * sizeof(float); }
static_assert(record_bytes(7) == 4 * (7 + 5));

std::string_view game_name_of_buffer() { return games::game_name(games::GameKind::kConnect4); }

template <typename T>
void put(std::string& out, T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T take(std::string_view bytes, size_t& at) {
    T value;
    std::memcpy(&value, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return value;
}

// What every position added must be (else MS_CHECK: the self-play code's bug, not input).
void check_position(int rows, int cols, const Connect4& state, std::span<const float> policy) {
    MS_CHECK(state.rows() == rows && state.cols() == cols,
             "replay buffer: a position of the {} x {} board added to a buffer of {} x {} positions", state.rows(),
             state.cols(), rows, cols);
    MS_CHECK(policy.size() == static_cast<size_t>(cols), "replay buffer: a policy of {} values for {} actions",
             policy.size(), cols);
}

void encode_record(const Connect4& state, std::span<const float> policy, float outcome, std::byte* out) {
    const uint64_t current = state.current_stones(), all = state.all_stones();
    std::memcpy(out, &current, 8);
    std::memcpy(out + 8, &all, 8);
    std::memcpy(out + kBitboardBytes, policy.data(), policy.size_bytes());
    std::memcpy(out + kBitboardBytes + policy.size_bytes(), &outcome, sizeof(float));
}

// The state of the record at `in` (through the codec, which throws UserError for one no game reaches); the policy
// goes to `policy` (cols values) and the outcome to `outcome`.
Connect4 decode_record(int rows, int cols, const std::byte* in, std::span<float> policy, float& outcome) {
    uint64_t current = 0, all = 0;
    std::memcpy(&current, in, 8);
    std::memcpy(&all, in + 8, 8);
    const size_t policy_bytes = static_cast<size_t>(cols) * sizeof(float);
    std::memcpy(policy.data(), in + kBitboardBytes, policy_bytes);
    std::memcpy(&outcome, in + kBitboardBytes + policy_bytes, sizeof(float));
    return Connect4::from_bitboards(rows, cols, current, all);
}

[[noreturn]] void refuse_file(const std::string& path, const std::string& why) {
    throw UserError(fmt::format("replay buffer error: '{}' {}", path, why), kExitCheckpoint);
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) refuse_file(path, fmt::format("cannot be opened: {}", std::strerror(errno)));
    const std::streamoff size = f.tellg();
    if (size < 0) refuse_file(path, "cannot be read: it is not a regular file");
    std::string bytes(static_cast<size_t>(size), '\0');
    f.seekg(0);
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) refuse_file(path, fmt::format("cannot be read: {}", std::strerror(errno)));
    return bytes;
}

// AtomicFile's writes, hashed on the way (the checksum that ends the file).
class HashedFile {
  public:
    explicit HashedFile(const std::string& path) : file_(path) {}
    void write(const void* data, size_t n) {
        hash_.update(data, n);
        file_.write(data, n);
    }
    void commit() {
        const uint64_t digest = hash_.digest();
        file_.write(&digest, sizeof(digest));
        file_.commit();
    }

  private:
    AtomicFile file_;
    Xxh64 hash_;
};

}  // namespace

ReplayBuffer::ReplayBuffer(int rows, int cols, int64_t capacity) : rows_(rows), cols_(cols), capacity_(capacity) {
    Connect4::check_size(rows, cols);
    if (capacity < 1) {
        throw UserError(fmt::format(
            "config error: the replay buffer's capacity is {} positions; it must hold at least 1 (it is the number "
            "of newest self-play positions training samples from)",
            capacity));
    }
}

void ReplayBuffer::push(const Connect4& state, std::span<const float> policy, float outcome) {
    check_position(rows_, cols_, state, policy);
    if (size() < capacity_) {
        states_.push_back(state);
        policies_.insert(policies_.end(), policy.begin(), policy.end());
        outcomes_.push_back(outcome);
    } else {
        const int64_t s = first_;  // the oldest position's slot takes the newest
        states_[static_cast<size_t>(s)] = state;
        std::copy(policy.begin(), policy.end(), policies_.begin() + s * cols_);
        outcomes_[static_cast<size_t>(s)] = outcome;
        first_ = (first_ + 1) % capacity_;
    }
    ++total_added_;
}

void ReplayBuffer::add(std::span<const Position> positions) {
    for (const Position& p : positions) push(p.state, p.policy, p.value);
}

void ReplayBuffer::add_from_all_ranks(Communicator& dp, std::span<const Position> mine) {
    MS_CHECK(mine.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "replay buffer: {} positions from one rank at once", mine.size());
    // Each rank's count sizes the padded exchange below; its board must be everyone's, or the records would not
    // line up.
    const std::array<int32_t, 3> head = {static_cast<int32_t>(mine.size()), rows_, cols_};
    std::vector<int32_t> heads(head.size() * static_cast<size_t>(dp.size()));
    dp.all_gather(std::span<const int32_t>(head), std::span<int32_t>(heads)).wait();
    int64_t most = 0;
    for (int r = 0; r < dp.size(); ++r) {
        const int32_t* h = &heads[head.size() * static_cast<size_t>(r)];
        MS_CHECK(h[1] == rows_ && h[2] == cols_,
                 "replay buffer: rank {} of {} holds {} x {} positions, rank {} {} x {}: every rank's buffer must be "
                 "of the same board",
                 r, dp.name(), h[1], h[2], dp.rank(), rows_, cols_);
        most = std::max<int64_t>(most, h[0]);
    }
    if (most == 0) return;

    // Every rank sends `most` records (its own, then zeros), as int32 words: the communicator's integer dtype.
    const size_t words = record_bytes(cols_) / sizeof(int32_t), block = static_cast<size_t>(most) * words;
    std::vector<int32_t> send(block, 0), gathered(block * static_cast<size_t>(dp.size()));
    for (size_t j = 0; j < mine.size(); ++j) {
        const Position& p = mine[j];
        check_position(rows_, cols_, p.state, p.policy);
        encode_record(p.state, p.policy, p.value, reinterpret_cast<std::byte*>(&send[j * words]));
    }
    dp.all_gather(std::span<const int32_t>(send), std::span<int32_t>(gathered)).wait();

    std::vector<float> policy(static_cast<size_t>(cols_));
    float outcome = 0;
    for (int r = 0; r < dp.size(); ++r) {
        for (int32_t j = 0; j < heads[head.size() * static_cast<size_t>(r)]; ++j) {
            const auto* record =
                reinterpret_cast<const std::byte*>(&gathered[r * block + static_cast<size_t>(j) * words]);
            const Connect4 state = decode_record(rows_, cols_, record, policy, outcome);
            push(state, policy, outcome);
        }
    }
}

void ReplayBuffer::clear_for(int rows, int cols) {
    Connect4::check_size(rows, cols);
    rows_ = rows;
    cols_ = cols;
    first_ = 0;
    states_.clear();
    policies_.clear();
    outcomes_.clear();
}

void ReplayBuffer::copy_out(int64_t index, Mirror mirror, Connect4& state, std::span<float> policy,
                            float& outcome) const {
    MS_CHECK(index >= 0 && index < size(), "replay buffer: position {} of {}", index, size());
    const int64_t s = slot(index);
    const std::span<const float> stored = policy_at_slot(s);
    state = states_[static_cast<size_t>(s)];
    if (mirror == Mirror::kMirrored) {
        state = state.mirrored();
        std::reverse_copy(stored.begin(), stored.end(), policy.begin());
    } else {
        std::copy(stored.begin(), stored.end(), policy.begin());
    }
    outcome = outcomes_[static_cast<size_t>(s)];
}

ReplayBuffer::Position ReplayBuffer::get(int64_t index, Mirror mirror) const {
    Position p;
    p.policy.resize(static_cast<size_t>(cols_));
    copy_out(index, mirror, p.state, p.policy, p.value);
    return p;
}

ReplaySample ReplayBuffer::sample_slice(uint64_t seed, int64_t step, int64_t first, int64_t count) const {
    MS_CHECK(size() > 0, "replay buffer: sampling from an empty buffer");
    MS_CHECK(step >= 0 && step < kCounterHalf && first >= 0 && count >= 0 && first + count <= kCounterHalf,
             "replay buffer: draws [{}, {}) of step {}: the step and the draws must lie in [0, 2^32)", first,
             first + count, step);
    ReplaySample out;
    out.index.resize(static_cast<size_t>(count));
    out.mirror.resize(static_cast<size_t>(count));
    const double n = static_cast<double>(size());
    for (int64_t i = 0; i < count; ++i) {
        const uint64_t counter = (static_cast<uint64_t>(step) << 32) | static_cast<uint64_t>(first + i);
        // min: u * n can round up to n for u just below 1
        out.index[static_cast<size_t>(i)] =
            std::min(size() - 1, static_cast<int64_t>(philox_uniform_double(seed, kStreamSampleIndex, counter) * n));
        out.mirror[static_cast<size_t>(i)] =
            philox_uniform_double(seed, kStreamSampleMirror, counter) < 0.5 ? Mirror::kAsPlayed : Mirror::kMirrored;
    }
    return out;
}

void ReplayBuffer::fill_batch(const ReplaySample& draws, ReplayBatch& out) const {
    MS_CHECK(draws.index.size() == draws.mirror.size(), "replay buffer: a sample of {} indices and {} reflections",
             draws.index.size(), draws.mirror.size());
    const size_t n = draws.index.size(), cols = static_cast<size_t>(cols_);
    out.states.resize(n);
    out.policies.resize(n * cols);
    out.outcomes.resize(n);
    for (size_t k = 0; k < n; ++k) {
        copy_out(draws.index[k], draws.mirror[k], out.states[k], std::span<float>(out.policies).subspan(k * cols, cols),
                 out.outcomes[k]);
    }
}

void ReplayBuffer::write_record(int64_t index, std::byte* out) const {
    const int64_t s = slot(index);
    encode_record(states_[static_cast<size_t>(s)], policy_at_slot(s), outcomes_[static_cast<size_t>(s)], out);
}

bool operator==(const ReplayBuffer& a, const ReplayBuffer& b) {
    if (a.rows_ != b.rows_ || a.cols_ != b.cols_ || a.capacity_ != b.capacity_ || a.total_added_ != b.total_added_ ||
        a.size() != b.size()) {
        return false;
    }
    // Compared as their records: bit for bit, the float fields included.
    std::vector<std::byte> ra(record_bytes(a.cols_)), rb(ra.size());
    for (int64_t i = 0; i < a.size(); ++i) {
        a.write_record(i, ra.data());
        b.write_record(i, rb.data());
        if (ra != rb) return false;
    }
    return true;
}

void ReplayBuffer::save(const std::string& path) const {
    std::string header;
    header.append(kMagic);
    put(header, kFormatVersion);
    std::array<char, kGameNameBytes> game{};
    std::copy(game_name_of_buffer().begin(), game_name_of_buffer().end(), game.begin());
    header.append(game.data(), game.size());
    put(header, static_cast<uint32_t>(rows_));
    put(header, static_cast<uint32_t>(cols_));
    put(header, static_cast<uint64_t>(capacity_));
    put(header, static_cast<uint64_t>(size()));
    put(header, static_cast<uint64_t>(total_added_));
    MS_CHECK(header.size() == kHeaderBytes, "replay buffer: a header of {} bytes, the format's is {}", header.size(),
             kHeaderBytes);

    HashedFile file(path);
    file.write(header.data(), header.size());
    // Records go out in chunks: a buffer of millions of positions is never copied whole.
    constexpr int64_t kChunk = 4096;
    const size_t bytes = record_bytes(cols_);
    std::vector<std::byte> chunk(static_cast<size_t>(std::min(size(), kChunk)) * bytes);
    for (int64_t begin = 0; begin < size(); begin += kChunk) {
        const int64_t end = std::min(size(), begin + kChunk);
        for (int64_t i = begin; i < end; ++i) write_record(i, &chunk[static_cast<size_t>(i - begin) * bytes]);
        file.write(chunk.data(), static_cast<size_t>(end - begin) * bytes);
    }
    file.commit();
}

ReplayBuffer ReplayBuffer::load(const std::string& path) {
    const std::string file = read_file(path);
    const std::string_view bytes = file;
    const auto refuse = [&](const std::string& why) { refuse_file(path, why); };
    const std::string damaged = "; restore it from a copy, or remove it to start from an empty buffer";
    if (bytes.size() < kHeaderBytes + kChecksumBytes) {
        refuse(
            fmt::format("is {} bytes, shorter than the {} of an empty buffer's file: it is truncated or not a replay "
                        "buffer file{}",
                        bytes.size(), kHeaderBytes + kChecksumBytes, damaged));
    }
    size_t at = 0;
    if (bytes.substr(0, kMagic.size()) != kMagic) {
        refuse(fmt::format("does not start with the magic \"{}\": it is not a replay buffer file", kMagic));
    }
    at += kMagic.size();
    const auto version = take<uint32_t>(bytes, at);
    if (version != kFormatVersion) {
        refuse(
            fmt::format("is of format version {}; this build reads version {} (save it again with the build that "
                        "wrote it, or start from an empty buffer)",
                        version, kFormatVersion));
    }
    const std::string_view game_field = bytes.substr(at, kGameNameBytes);
    at += kGameNameBytes;
    const std::string_view game = game_field.substr(0, game_field.find('\0'));
    const auto rows = take<uint32_t>(bytes, at);
    const auto cols = take<uint32_t>(bytes, at);
    const auto capacity = take<uint64_t>(bytes, at);
    const auto count = take<uint64_t>(bytes, at);
    const auto total_added = take<uint64_t>(bytes, at);
    MS_CHECK(at == kHeaderBytes, "replay buffer: read a header of {} bytes, the format's is {}", at, kHeaderBytes);
    if (game != game_name_of_buffer()) {
        refuse(fmt::format("holds positions of the game '{}'; the replay buffer holds {} positions", game,
                           game_name_of_buffer()));
    }
    try {
        Connect4::check_size(static_cast<int>(rows), static_cast<int>(cols));
    } catch (const UserError& e) {
        refuse(fmt::format("names a board of {} rows x {} columns: {}{}", rows, cols, e.what(), damaged));
    }
    // The size the header promises, without overflow for a corrupt count.
    const size_t record = record_bytes(static_cast<int>(cols));
    const size_t room = bytes.size() - kHeaderBytes - kChecksumBytes;
    const bool fits = count <= (std::numeric_limits<size_t>::max() - kHeaderBytes - kChecksumBytes) / record;
    if (!fits || count * record != room) {
        refuse(fmt::format(
            "is {} bytes, but its header ({} positions of {} bytes) makes it {}: the file is truncated "
            "or corrupt{}",
            bytes.size(), count, record,
            fits ? std::to_string(kHeaderBytes + count * record + kChecksumBytes) : "over 2^64 bytes", damaged));
    }
    const size_t body = bytes.size() - kChecksumBytes;
    size_t checksum_at = body;
    const auto stored = take<uint64_t>(bytes, checksum_at);
    const uint64_t computed = xxh64(bytes.data(), body);
    if (computed != stored) {
        refuse(fmt::format("is corrupt: the XXH64 of its first {} bytes is {}, the file stores {}{}", body,
                           xxh64_hex(computed), xxh64_hex(stored), damaged));
    }
    if (capacity < 1 || capacity > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || count > capacity ||
        count > total_added || total_added > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        refuse(
            fmt::format("has a header that cannot be: capacity {}, {} positions, {} added in all (it needs "
                        "capacity >= 1, positions <= capacity and positions <= added){}",
                        capacity, count, total_added, damaged));
    }

    ReplayBuffer buffer(static_cast<int>(rows), static_cast<int>(cols), static_cast<int64_t>(capacity));
    std::vector<float> policy(cols);
    float outcome = 0;
    for (uint64_t i = 0; i < count; ++i) {
        const auto* in = reinterpret_cast<const std::byte*>(bytes.data() + kHeaderBytes + i * record);
        Connect4 state;
        try {
            state = decode_record(static_cast<int>(rows), static_cast<int>(cols), in, policy, outcome);
        } catch (const UserError& e) {
            refuse(fmt::format("holds an invalid position {} (0 the oldest): {}{}", i, e.what(), damaged));
        }
        for (uint32_t c = 0; c < cols; ++c) {
            if (!(policy[c] >= 0.0f && policy[c] <= 1.0f)) {  // also false for NaN
                refuse(
                    fmt::format("holds position {} (0 the oldest) whose policy gives column {} the value {}, not a "
                                "probability{}",
                                i, c + 1, policy[c], damaged));
            }
        }
        if (!(outcome >= -1.0f && outcome <= 1.0f)) {
            refuse(fmt::format("holds position {} (0 the oldest) with the outcome {}, outside [-1, 1]{}", i, outcome,
                               damaged));
        }
        buffer.push(state, policy, outcome);
    }
    buffer.total_added_ = static_cast<int64_t>(total_added);
    return buffer;
}

}  // namespace ms::selfplay
