// comm_choice.cpp: run.comm's resolution and the NCCL registration (comm_choice.h). Part of ms_engine: no NCCL here.
#include "comm/nccl/comm_choice.h"

#include <fmt/format.h>

#include "engine/core/check.h"

namespace ms {
namespace {

// Written once by register_nccl_communicator() at the top of main(), before any other thread exists; read after.
NcclRegistration& registration() {
    static NcclRegistration r;
    return r;
}

}  // namespace

CommKind parse_comm_kind(std::string_view name) {
    if (name == "auto") return CommKind::kAuto;
    if (name == "mpi") return CommKind::kMpi;
    if (name == "nccl") return CommKind::kNccl;
    MS_UNREACHABLE("run.comm = '{}' is not one of auto, mpi, nccl", name);
}

std::string_view comm_kind_name(CommKind kind) {
    switch (kind) {
        case CommKind::kAuto:
            return "auto";
        case CommKind::kMpi:
            return "mpi";
        case CommKind::kNccl:
            return "nccl";
    }
    return "?";
}

void register_nccl_communicator(const NcclRegistration& r) {
    MS_CHECK(r.version != nullptr && r.device_count != nullptr && r.make_world != nullptr,
             "register_nccl_communicator: a version, a device count and a factory are required");
    registration() = r;
}

const NcclRegistration* nccl_registration() { return registration().make_world != nullptr ? &registration() : nullptr; }

std::string comm_config_error(CommKind requested, std::string_view backend, bool nccl_in_binary) {
    if (requested != CommKind::kNccl) return "";
    if (backend != "cuda")
        return fmt::format(
            "run.comm = 'nccl' needs run.backend = 'cuda', got '{}' (NCCL moves GPU memory); hint: set run.backend: "
            "cuda, or run.comm: mpi (auto picks mpi on the CPU)",
            backend);
    if (!nccl_in_binary)
        return "run.comm = 'nccl' but this binary was built without NCCL (CMake found no nccl.h and libnccl in the "
               "CUDA toolkit or the system, or the CUDA backend is off); hint: install NCCL (libnccl-dev) and "
               "rebuild with -DMS_ENABLE_CUDA=ON, or set run.comm: mpi (or auto, which falls back to mpi)";
    return "";
}

CommResolution resolve_comm(CommKind requested, std::string_view backend, bool nccl_in_binary, bool device_per_rank) {
    switch (requested) {
        case CommKind::kMpi:
            return {CommKind::kMpi, "run.comm: mpi"};
        case CommKind::kNccl: {
            if (std::string e = comm_config_error(requested, backend, nccl_in_binary); !e.empty())
                throw UserError("config error: " + e);
            if (!device_per_rank)
                throw UserError(
                    "config error: run.comm = 'nccl' needs a GPU of its own for every rank (NCCL refuses two ranks of "
                    "one communicator on the same device), but on at least one node more ranks run than it has "
                    "visible CUDA devices; hint: launch at most one rank per GPU, or set run.comm: mpi (or auto, "
                    "which uses mpi when ranks share a GPU)");
            return {CommKind::kNccl, "run.comm: nccl"};
        }
        case CommKind::kAuto:
            if (backend != "cuda") return {CommKind::kMpi, fmt::format("run.comm: auto, run.backend: {}", backend)};
            if (!nccl_in_binary) return {CommKind::kMpi, "run.comm: auto, and this binary has no NCCL"};
            if (!device_per_rank)
                return {CommKind::kMpi,
                        "run.comm: auto, and ranks share a GPU (or see none), which NCCL does not allow"};
            return {CommKind::kNccl, "run.comm: auto, run.backend: cuda, one GPU per rank"};
    }
    MS_UNREACHABLE("comm kind {}", static_cast<int>(requested));
}

}  // namespace ms
