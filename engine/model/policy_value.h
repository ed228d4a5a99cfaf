// policy_value.h: the self-play network (ModelArch::kPolicyValue) as one op-graph chunk: a transformer trunk over a
// board's cells, a policy head with one logit per cell and a value head, in the style of AlphaZero's network with
// its convolutions replaced by bidirectional attention so that one set of weights spans board sizes.
//
// Rows: for B boards of rows x cols cells, T = rows * cols + 1 rows each: the summary row first (where the value is
// read, as a ViT's class token), then the cells row-major, top row first (games::Game::cells' order).
// Input "cells" (B*T, input width), written by the host (write_board_features): each row the sum of one-hot
// features, so the first matmul adds one learned embedding per feature:
//   the cell's code (empty, the side to move's stone, the opponent's),
//   its row counted from the bottom and from the top, its column counted from the left and from the right (2-D
//   positions that mean the same on every board: the bottom row, the centre columns' distances to both edges),
//   or, on the summary row, the summary feature;
//   and on every row whose turn it is: the first player's or the second's (the stones' parity, which decides the
//   odd and even threats of Connect Four, is otherwise a count the attention would have to learn);
//   with threat features (GptShape::threat_features, selfplay.threat_features), three more on each cell, the
//   bits of its flags (games::Connect4::cell_flags): it is empty and a stone dropped now lands there (playable), and
//   a stone of the side to move, or of the opponent, there would complete a line of four (a threat, in the style of
//   KataGo's hand-made input features: the network sees where either side wins rather than learning to find lines
//   of four through attention).
// Trunk: encoded = cells @ trunk.embedding^T; L pre-LayerNorm encoder blocks (CLIP's, bidirectional);
// states = trunk.final_layer_norm(every row).
// Policy head: policy = states @ policy_head.weight^T + bias, one logit per row (B*T, 1); the host reads the logits of
// the cells the legal moves put a stone on (Game::action_cell) and masks the rest.
// Value head: value = value_head.out(gelu(value_head.fc(states[summary rows]))), (B, 1), before the tanh the host
// applies. The loss (policy cross-entropy against the search's visits, squared value error against the outcome) is
// the host's too (policy_value_net.h): both outputs take their gradients "d.policy" and "d.value" from it.
//
// Tensor parallelism: the blocks as CLIP's (heads and ffn split); the embedding, norms and heads are replicated, so
// every tensor-parallel rank holds the same outputs.
#pragma once

#include <cstdint>
#include <span>

#include "engine/model/gpt.h"

namespace ms {

struct PolicyValueSizes {
    int layers = 4, hidden = 64, heads = 4, ffn = 256;
    int board_rows = 6, board_cols = 7;  // the largest board the network embeds
    float eps = 1e-5f;
    bool threat_features = false;  // the cells' playable and threat features (above)
};
GptShape policy_value_shape(const PolicyValueSizes& sizes);

// Columns of the "cells" input: 3 codes, board_rows rows from the bottom and as many from the top, board_cols columns
// from the left and as many from the right, the summary feature, the two sides to move, and with threat features
// playable, the side to move's threat and the opponent's.
int policy_value_input_width(const GptShape& s);

// One board's T = rows * cols + 1 input rows (T x policy_value_input_width(s) floats at out) from its cell codes
// (rows * cols, Game::cells' order), with threat features its cells' flags (the same order, bit k the k-th threat
// column; empty without them), and the stones played (whose turn it is). rows and cols at most the shape's board
// (MS_CHECK: the caller checks the board once against the network, with a sentence).
void write_board_features(const GptShape& s, int rows, int cols, std::span<const int8_t> cells,
                          std::span<const int8_t> flags, int moves_played, std::span<float> out);

}  // namespace ms
