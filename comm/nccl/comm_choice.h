// comm_choice.h: which communicator a run's process groups use (run.comm: auto | mpi | nccl), and the NCCL
// communicator a binary registers when it was built with NCCL.
//
// The NCCL communicator (comm/nccl/nccl_communicator.h) lives in ms_nccl, which links NCCL and the CUDA runtime,
// so ms_engine reaches it through a registration, as it reaches the CUDA backend (engine/backends/backend.h): a
// binary that links ms_nccl calls install_nccl_communicator() at the top of main() (apps/main.cpp when built with
// NCCL). A CPU-only binary, or one without NCCL, registers nothing, and nccl_registration() is null.
//
// Resolution (pure functions, tests/unit/test_comm_choice.cpp):
//   mpi    MPI for every group.
//   nccl   NCCL for the device groups (process_groups.h). Needs run.backend: cuda and a binary with NCCL (config
//          errors, checked by validate_config), and a GPU of its own for every rank (NCCL refuses two ranks of one
//          communicator on the same device): a user error at start-up otherwise.
//   auto   nccl when all three hold, else mpi (so several ranks may still share one GPU through MPI).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "comm/communicator.h"

namespace ms {

enum class CommKind : uint8_t { kAuto, kMpi, kNccl };

// "auto" | "mpi" | "nccl" (config_schema.cpp checked the value); anything else is a programming error.
CommKind parse_comm_kind(std::string_view name);
std::string_view comm_kind_name(CommKind kind);

// What a binary built with NCCL registers.
struct NcclRegistration {
    const char* version = nullptr;    // the NCCL library's version, e.g. "2.28.9"
    int (*device_count)() = nullptr;  // CUDA devices this process sees; 0 when none (or the runtime fails)
    // The NCCL communicator over every rank of `world` (the MpiCommunicator of MpiRuntime::world()) on CUDA device
    // `device`, bootstrapped through MPI. Collective over world; selects `device` for the calling thread.
    std::unique_ptr<Communicator> (*make_world)(Communicator& world, int device) = nullptr;
};

// Called once at the top of main(), before any other thread exists (install_nccl_communicator()).
void register_nccl_communicator(const NcclRegistration& registration);
// The registered NCCL communicator, or nullptr when this binary has none.
const NcclRegistration* nccl_registration();

// The config error for run.comm = `requested` with run.backend = `backend` (a sentence with a hint), or "" when the
// combination is valid in a binary that has NCCL (`nccl_in_binary`) or not.
std::string comm_config_error(CommKind requested, std::string_view backend, bool nccl_in_binary);

struct CommResolution {
    CommKind kind = CommKind::kMpi;  // kMpi or kNccl, never kAuto
    std::string reason;              // for the start-up log, e.g. "run.comm: auto, run.backend: cuda, one GPU per rank"
};

// The communicator the device groups use. `device_per_rank`: every rank of the job has a CUDA device of its own
// (agreed by all ranks). Throws UserError (exit 2) for an explicit nccl that cannot run: the config errors above,
// and shared devices.
CommResolution resolve_comm(CommKind requested, std::string_view backend, bool nccl_in_binary, bool device_per_rank);

}  // namespace ms
