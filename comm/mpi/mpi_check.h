// mpi_check.h: MS_MPI_CHECK, the MPI member of the error-macro family in engine/core/check.h.
//
// MPI calls return an error code only when the communicator's error handler is MPI_ERRORS_RETURN; MpiRuntime
// installs it on MPI_COMM_WORLD and every split inherits it. A failing call prints the MPI error string and class,
// the expression, file:line, function and world rank (plus the error context set by MpiRuntime), then ends the
// job through ms::fatal -> MPI_Abort, so peers do not hang in a collective.
#pragma once

#include <mpi.h>

#include <string>

#include "engine/core/check.h"

namespace ms {

// "MPI error: <string> (class <class string>) on world rank r"
std::string mpi_error_message(int code);

}  // namespace ms

#define MS_MPI_CHECK(expr)                                                                         \
    do {                                                                                           \
        const int ms_mpi_rc_ = (expr);                                                             \
        if (ms_mpi_rc_ != MPI_SUCCESS)                                                             \
            ::ms::fatal(#expr, __FILE__, __LINE__, __func__, ::ms::mpi_error_message(ms_mpi_rc_)); \
    } while (0)
