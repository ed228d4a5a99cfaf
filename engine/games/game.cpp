// game.cpp: the game factory (game.h): a game's name and board size, checked.
#include "engine/games/game.h"

#include <fmt/format.h>

#include <string>

#include "engine/games/connect4.h"

namespace ms::games {

std::string_view game_name(GameKind kind) {
    switch (kind) {
        case GameKind::kConnect4:
            return "connect4";
    }
    MS_UNREACHABLE("game kind {}", static_cast<int>(kind));
}

GameSpec game_spec(std::string_view name, int rows, int cols) {
    if (name == game_name(GameKind::kConnect4)) {
        Connect4::check_size(rows, cols);
        return GameSpec{GameKind::kConnect4, rows, cols};
    }
    throw UserError(fmt::format("game error: unknown game '{}': the games are: connect4", name));
}

}  // namespace ms::games
