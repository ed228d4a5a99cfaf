#include "comm/mpi/mpi_check.h"

#include <fmt/format.h>

namespace ms {
namespace {

std::string error_string(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("unknown MPI error code {}", code);
    return std::string(text, static_cast<size_t>(len));
}

}  // namespace

std::string mpi_error_message(int code) {
    int error_class = code;
    MPI_Error_class(code, &error_class);
    // The world rank is read here, not cached, so the message is right even before MpiRuntime sets the context.
    int initialized = 0, finalized = 0, rank = -1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return fmt::format("MPI error: {} (class {}: {}) on world rank {}", error_string(code), error_class,
                       error_string(error_class), rank);
}

}  // namespace ms
