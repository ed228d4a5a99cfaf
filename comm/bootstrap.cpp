#include "comm/bootstrap.h"

#include <unistd.h>

#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "comm/mpi/collective_watch.h"
#include "comm/mpi/mpi_check.h"
#include "comm/mpi/mpi_communicator.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

// The runtime's watch while one exists, for the abort hook (a function pointer without context).
CollectiveWatch* g_abort_watch = nullptr;

void mpi_abort_hook(int exit_code) {
    if (g_abort_watch)
        g_abort_watch->dump(fmt::format("fatal error (exit code {}): see this rank's stderr", exit_code));
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

// "NAME=value" for each set variable, space separated.
std::string env_list(std::initializer_list<const char*> names) {
    std::string out;
    for (const char* name : names) {
        const char* value = std::getenv(name);
        if (value == nullptr) continue;
        if (!out.empty()) out += ' ';
        out += fmt::format("{}={}", name, value);
    }
    return out;
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
    int initialized = 0;
    MS_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
        int provided = MPI_THREAD_SINGLE;
        MS_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
        initialized_here_ = true;
        if (provided < MPI_THREAD_FUNNELED)
            log_warn("MPI provides thread level {} < MPI_THREAD_FUNNELED; OpenMP regions must not call MPI", provided);
    }
    int level = MPI_THREAD_SINGLE;
    MS_MPI_CHECK(MPI_Query_thread(&level));
    thread_multiple_ = level == MPI_THREAD_MULTIPLE;
    MS_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MS_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    hostname_ = host_name();
    set_abort_hook(&mpi_abort_hook);
    set_error_context(fmt::format("[rank {}/{} {}]", rank_, size_, hostname_));
    set_log_rank(rank_, rank_ == 0);

    // Node layout: ranks sharing memory form a node; node leaders (local rank 0) number the nodes.
    MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    MS_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    MS_MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    MS_MPI_CHECK(MPI_Comm_size(local, &local_size_));
    MS_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders));
    int node[2] = {0, 1};  // id, count
    if (leaders != MPI_COMM_NULL) {
        MS_MPI_CHECK(MPI_Comm_rank(leaders, &node[0]));
        MS_MPI_CHECK(MPI_Comm_size(leaders, &node[1]));
        MS_MPI_CHECK(MPI_Comm_free(&leaders));
    }
    MS_MPI_CHECK(MPI_Bcast(node, 2, MPI_INT, 0, local));
    MS_MPI_CHECK(MPI_Comm_free(&local));
    node_id_ = node[0];
    num_nodes_ = node[1];

    watch_ = std::make_shared<CollectiveWatch>(rank_, hostname_);
    watch_->open_notice_channel(MPI_COMM_WORLD);
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", MpiCommunicator::kDefaultChunkElems, watch_);
    g_abort_watch = watch_.get();
}

MpiRuntime::~MpiRuntime() {
    world_.reset();
    g_abort_watch = nullptr;
    if (watch_->aborted()) {  // a collective timed out: peers may be hung or dead, and MPI_Finalize would wait
        set_abort_hook(nullptr);
        return;
    }
    watch_->close_notice_channel();
    if (!initialized_here_) return;
    set_abort_hook(nullptr);  // MPI_Abort is no longer callable
    MPI_Finalize();
}

Communicator& MpiRuntime::world() { return *world_; }

const std::string& MpiRuntime::host_of(int world_rank) const {
    return watch_->peers()[static_cast<size_t>(world_rank)].host;
}

void MpiRuntime::set_collective_watch(CollectiveWatchOptions options) { watch_->set_options(std::move(options)); }

void MpiRuntime::add_trace_section(std::string key, std::function<nlohmann::ordered_json()> section) {
    watch_->add_section(std::move(key), std::move(section));
}

std::string MpiRuntime::describe() const {
    return fmt::format("rank {}/{} on {} (node {}/{}, local {}/{}); launcher: {}", rank_, size_, hostname_, node_id_,
                       num_nodes_, local_rank_, local_size_, launch_environment());
}

std::string launch_environment() {
    const std::string ompi = env_list({"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK"});
    const std::string slurm = env_list({"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODELIST"});
    std::string out;
    if (!ompi.empty()) out = "Open MPI (" + ompi + ")";
    if (!slurm.empty()) out += (out.empty() ? "" : ", ") + ("Slurm (" + slurm + ")");
    return out.empty() ? "none (singleton)" : out;
}

bool launched_as_several_ranks() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
        const char* value = std::getenv(name);
        if (value != nullptr && std::atoi(value) > 1) return true;
    }
    return false;
}

void check_same_config(MpiRuntime& mpi, uint64_t hash) {
    Communicator& world = mpi.world();
    // A 64-bit hash travels as two int32 halves (the typed API has no 64-bit integers).
    const int32_t mine[2] = {static_cast<int32_t>(hash >> 32), static_cast<int32_t>(hash & 0xffffffffu)};
    std::vector<int32_t> all(2 * static_cast<size_t>(world.size()));
    world.all_gather<int32_t>(mine, all).wait();
    const auto hash_of = [&](int r) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(all[2 * r])) << 32) | static_cast<uint32_t>(all[2 * r + 1]);
    };
    std::string differ;
    int n_differ = 0, first = -1;
    for (int r = 1; r < world.size(); ++r) {
        if (hash_of(r) == hash_of(0)) continue;
        if (n_differ++ > 0) differ += ", ";
        if (first < 0) first = r;
        differ += fmt::format("{} ({:#018x}, host {})", r, hash_of(r), mpi.host_of(r));
    }
    if (n_differ == 0) return;
    UserError e(fmt::format(
        "config error: the resolved config hash differs from rank 0's ({:#018x}, host {}) on {} of {} ranks: {}\n"
        "---> HINT: every rank must read the same config file with the same --set overrides and environment "
        "(${{VAR}} interpolation) -- check that the file is on a shared filesystem and not edited mid-launch",
        hash_of(0), mpi.host_of(0), n_differ, world.size(), differ));
    e.set_failed_rank(first);
    throw e;
}

}  // namespace ms
