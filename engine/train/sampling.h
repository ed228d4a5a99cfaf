// sampling.h: autoregressive sampling from a GPT model -- temperature, top-k, a counter-based random stream -- for
// the trainer's end-of-run sample and the `generate` subcommand.
//
// Determinism: draw i (the i-th new token) uses Philox(seed, name_hash("generate"), i), so the same model, context,
// settings and seed give the same tokens on any machine and thread count whose forward pass gives the same logits.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "engine/model/gpt.h"

namespace ms {

// Appends num_tokens sampled tokens to `context` (ids < V, non-empty) and returns it. Each step runs the model on
// the last min(context length, T) tokens and samples from softmax(logits / temperature) over the real vocabulary V
// (padded columns never drawn), restricted to the top_k largest logits when top_k > 0. Every TP rank of `tp`
// gathers the full last-position logits and draws the same token, so all ranks stay in step; pass a
// SelfCommunicator for a whole model on one rank. stop, when given, is called before every token (on every rank:
// the trainer's agreement on a stop signal); once it returns true, sampling ends and the context so far is returned.
// end_token, when given (the tokenizer's end-of-document id), ends sampling once it is drawn; it is the last token
// returned.
std::vector<int32_t> generate(Gpt& model, Communicator& tp, std::vector<int32_t> context, int num_tokens,
                              float temperature, int top_k, uint64_t seed, const std::function<bool()>& stop = {},
                              std::optional<int32_t> end_token = std::nullopt);

}  // namespace ms
