// synthetic_source.cpp: a seeded stochastic language with a known entropy rate, for demos and tests.
//
// The language is a first-order Markov chain over V symbols (data.synthetic.vocab_size) in which every state has
// exactly `branching` = b successors. Everything is drawn from Philox keyed by data.synthetic.seed:
//   - a random cyclic order ("spine") pi_0 -> pi_1 -> ... -> pi_{V-1} -> pi_0 of all states;
//   - successors of state pi_i: pi_{i+1} and pi_{i+2} (the spine), then, when the alphabet has a space
//     (V > 26) and b >= 3, the space symbol (so text splits into words), then distinct uniform picks;
//   - transition probabilities: normalized Exp(1) draws, i.e. Dirichlet(1,...,1) per state.
// The spine makes the chain irreducible (one cycle through every state) and, for b >= 2, aperiodic: it has
// cycles of length V (all +1 steps) and V-1 (one +2 step), and gcd(V, V-1) = 1. So the stationary distribution
// p is unique and power iteration from uniform converges to it. (b = 1 is the bare spine: a deterministic
// cycle with uniform p and entropy rate 0.)
//
// Entropy rate, exact up to the power-iteration residual: H = sum_s p(s) * H(P(s, .)) nats/token. A Dirichlet(1)
// row over b successors has expected entropy H_b - 1 (harmonic number), about 1.08 nats for b = 4, well below
// ln 32 = 3.47, so a small GPT learns it quickly; the loss floor is H.
//
// Token t is drawn from P(x_{t-1}, .) with the Philox uniform of index t (token 0 from p), so the stream is a
// pure function of the config and stationary from its first token.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/core/philox.h"
#include "engine/data/file_source.h"

namespace ms::data {
namespace {

// Philox streams of the language (index layouts in the comments).
constexpr uint64_t kStreamSpine = 1;       // index i: Fisher-Yates draw for position i
constexpr uint64_t kStreamSuccessors = 2;  // index (s << 32) | attempt
constexpr uint64_t kStreamWeights = 3;     // index (s << 32) | k
constexpr uint64_t kStreamText = 4;        // index t: token t

// vocab <= 32: these letters; up to 95: all printable ASCII (this prefix first); beyond: "[id]".
constexpr std::string_view kAlphabet =
    "abcdefghijklmnopqrstuvwxyz .,'!?"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789\"#$%&()*+-/:;<=>@[\\]^_`{|}~";
constexpr int kSpace = 26;  // kAlphabet[26] == ' '
static_assert(kAlphabet.size() == 95 && kAlphabet[kSpace] == ' ');

constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxPowerIterations = 200000;
constexpr double kPowerTolerance = 1e-15;  // L1 change of p per iteration at which we stop

class SyntheticSource final : public TokenSource {
  public:
    explicit SyntheticSource(const SyntheticConfig& cfg);

    int64_t num_tokens() const override { return static_cast<int64_t>(tokens_.size()); }
    void read(int64_t offset, int64_t count, int32_t* out) const override {
        MS_CHECK(offset >= 0 && count >= 0 && offset + count <= num_tokens(),
                 "read of tokens [{}, {}) outside the {} synthetic tokens", offset, offset + count, num_tokens());
        std::copy_n(tokens_.begin() + offset, count, out);
    }
    int vocab_size() const override { return cfg_.vocab_size; }
    double entropy_rate() const override { return entropy_rate_; }
    std::string describe() const override {
        return fmt::format(
            "synthetic Markov language: vocab {}, branching {}, seed {}, {} tokens, entropy rate {:.4f} "
            "nats/token (uniform would be ln {} = {:.4f})",
            cfg_.vocab_size, cfg_.branching, cfg_.seed, num_tokens(), entropy_rate_, cfg_.vocab_size,
            std::log(static_cast<double>(cfg_.vocab_size)));
    }
    uint64_t fingerprint() const override { return fingerprint_; }
    std::string decode(const std::vector<int32_t>& ids) const override {
        std::string text;
        for (int32_t id : ids) {
            if (id >= 0 && id < static_cast<int32_t>(kAlphabet.size())) {
                text += kAlphabet[static_cast<size_t>(id)];
            } else {
                text += fmt::format("[{}]", id);
            }
        }
        return text;
    }

  private:
    void build_chain();
    void stationary_and_entropy();
    void generate();

    SyntheticConfig cfg_;
    int b_ = 0;
    std::vector<int32_t> succ_;    // (V, b) successor states
    std::vector<double> cdf_;      // (V, b) cumulative transition probabilities, last of each row == 1
    std::vector<double> prob_;     // (V, b) transition probabilities
    std::vector<double> pi_;       // (V) stationary distribution
    std::vector<int32_t> tokens_;  // (num_tokens) the generated stream
    double entropy_rate_ = 0;
    uint64_t fingerprint_ = 0;
};

SyntheticSource::SyntheticSource(const SyntheticConfig& cfg) : cfg_(cfg), b_(cfg.branching) {
    build_chain();
    stationary_and_entropy();
    generate();
    uint64_t h = name_hash("synthetic");
    for (uint64_t v : {static_cast<uint64_t>(cfg.vocab_size), static_cast<uint64_t>(cfg.branching), cfg.seed,
                       static_cast<uint64_t>(cfg.num_tokens)}) {
        h = (h ^ v) * 1099511628211ull;
        h ^= h >> 29;
    }
    fingerprint_ = h;
}

void SyntheticSource::build_chain() {
    const int V = cfg_.vocab_size;
    const uint64_t seed = cfg_.seed;
    // spine: a uniform random permutation (Fisher-Yates), read as a cycle
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    for (int i = V - 1; i > 0; --i) {
        const auto j = static_cast<int>(philox_uniform_double(seed, kStreamSpine, static_cast<uint64_t>(i)) * (i + 1));
        std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(std::min(j, i))]);
    }
    succ_.assign(static_cast<size_t>(V) * b_, 0);
    prob_.assign(succ_.size(), 0.0);
    cdf_.assign(succ_.size(), 0.0);
    std::vector<uint8_t> taken(static_cast<size_t>(V), 0);
    for (int i = 0; i < V; ++i) {
        const int s = order[static_cast<size_t>(i)];
        int32_t* row = succ_.data() + static_cast<size_t>(s) * b_;
        int k = 0;
        auto add = [&](int t) {
            if (k < b_ && !taken[static_cast<size_t>(t)]) {
                taken[static_cast<size_t>(t)] = 1;
                row[k++] = t;
            }
        };
        add(order[static_cast<size_t>((i + 1) % V)]);
        add(order[static_cast<size_t>((i + 2) % V)]);
        if (V > kSpace && b_ >= 3 && s != kSpace) add(kSpace);
        // rejection draws; when b is close to V they rarely hit a free state, so then walk from the last draw
        int last = 0;
        for (uint64_t attempt = 0; k < b_ && attempt < 16 * static_cast<uint64_t>(b_); ++attempt) {
            const double u = philox_uniform_double(seed, kStreamSuccessors, (static_cast<uint64_t>(s) << 32) | attempt);
            last = std::min(static_cast<int>(u * V), V - 1);
            add(last);
        }
        for (int t = last; k < b_; t = (t + 1) % V) add(t);
        double sum = 0;
        double* p = prob_.data() + static_cast<size_t>(s) * b_;
        for (int j = 0; j < b_; ++j) {
            const double u = philox_uniform_double(seed, kStreamWeights, (static_cast<uint64_t>(s) << 32) | j);
            p[j] = -std::log(u + 0x1p-54);  // Exp(1), strictly positive: every listed edge is really present
            sum += p[j];
        }
        double c = 0;
        for (int j = 0; j < b_; ++j) {
            p[j] /= sum;
            c += p[j];
            cdf_[static_cast<size_t>(s) * b_ + j] = c;
        }
        cdf_[static_cast<size_t>(s) * b_ + b_ - 1] = 1.0;
        for (int j = 0; j < b_; ++j) taken[static_cast<size_t>(row[j])] = 0;
    }
}

void SyntheticSource::stationary_and_entropy() {
    const int V = cfg_.vocab_size;
    pi_.assign(static_cast<size_t>(V), 1.0 / V);
    std::vector<double> next(static_cast<size_t>(V));
    // cap the work (V * b per iteration) so that a huge, slowly mixing chain still opens in seconds
    const int64_t max_it =
        std::clamp<int64_t>(int64_t{400'000'000} / (static_cast<int64_t>(V) * b_), 1000, kMaxPowerIterations);
    double change = 1;
    int64_t it = 0;
    for (; it < max_it && change > kPowerTolerance; ++it) {
        std::fill(next.begin(), next.end(), 0.0);
        for (int s = 0; s < V; ++s) {
            const size_t row = static_cast<size_t>(s) * b_;
            for (int j = 0; j < b_; ++j) next[static_cast<size_t>(succ_[row + j])] += pi_[s] * prob_[row + j];
        }
        const double total = std::accumulate(next.begin(), next.end(), 0.0);
        change = 0;
        for (int s = 0; s < V; ++s) {
            const double v = next[s] / total;  // renormalize against rounding drift
            change += std::fabs(v - pi_[s]);
            pi_[s] = v;
        }
    }
    if (change > 1e-9) {
        log_warn(
            "synthetic language: the stationary distribution did not converge in {} power iterations (L1 change "
            "{:.2e}); the reported entropy rate is approximate",
            it, change);
    }
    double h = 0;
    for (int s = 0; s < V; ++s) {
        double hs = 0;
        for (int j = 0; j < b_; ++j) {
            const double p = prob_[static_cast<size_t>(s) * b_ + j];
            if (p > 0) hs -= p * std::log(p);
        }
        h += pi_[s] * hs;
    }
    entropy_rate_ = h;
}

void SyntheticSource::generate() {
    const int V = cfg_.vocab_size;
    tokens_.resize(static_cast<size_t>(cfg_.num_tokens));
    // token 0 from the stationary distribution (inverse CDF)
    const double u0 = philox_uniform_double(cfg_.seed, kStreamText, 0);
    double c = 0;
    int x = V - 1;
    for (int s = 0; s < V; ++s) {
        c += pi_[s];
        if (u0 < c) {
            x = s;
            break;
        }
    }
    tokens_[0] = x;
    for (int64_t t = 1; t < cfg_.num_tokens; ++t) {
        const double u = philox_uniform_double(cfg_.seed, kStreamText, static_cast<uint64_t>(t));
        const double* row = cdf_.data() + static_cast<size_t>(x) * b_;
        const auto j = std::min<int64_t>(std::upper_bound(row, row + b_, u) - row, b_ - 1);
        x = succ_[static_cast<size_t>(x) * b_ + static_cast<size_t>(j)];
        tokens_[static_cast<size_t>(t)] = x;
    }
}

}  // namespace

std::unique_ptr<TokenSource> open_synthetic(const SyntheticConfig& cfg, int vocab_limit) {
    if (cfg.vocab_size < 2 || cfg.vocab_size > kMaxVocab) {
        throw UserError(
            fmt::format("config error: data.synthetic.vocab_size={} must be in [2, {}]; hint: 32 gives a "
                        "printable letter language",
                        cfg.vocab_size, kMaxVocab));
    }
    if (cfg.branching < 1 || cfg.branching > cfg.vocab_size) {
        throw UserError(
            fmt::format("config error: data.synthetic.branching={} must be in [1, vocab_size={}]; hint: 4 "
                        "gives an entropy rate near 1.1 nats/token",
                        cfg.branching, cfg.vocab_size));
    }
    if (cfg.num_tokens < 2) {
        throw UserError(
            fmt::format("config error: data.synthetic.num_tokens={} must be >= 2; hint: the default is "
                        "1048576",
                        cfg.num_tokens));
    }
    if (vocab_limit > 0 && cfg.vocab_size > vocab_limit) {
        throw UserError(
            fmt::format("config error: data.synthetic.vocab_size={} is larger than model.vocab_size={}; "
                        "hint: set model.vocab_size=0 to take it from the data",
                        cfg.vocab_size, vocab_limit));
    }
    return std::make_unique<SyntheticSource>(cfg);
}

}  // namespace ms::data
