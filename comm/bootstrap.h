// bootstrap.h: bringing MPI up and down, and what every rank learns about where it runs.
//
// MpiRuntime is the one owner of MPI in a process (RAII): it calls MPI_Init_thread(MPI_THREAD_MULTIPLE: the
// communication engine's thread calls MPI beside the main thread, comm/comm_engine.h) unless MPI is already
// initialized, and MPI_Finalize in its destructor if it initialized. On construction it
//   - sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (inherited by every split) so MS_MPI_CHECK sees error codes,
//   - installs the abort hook (ms::fatal -> MPI_Abort(MPI_COMM_WORLD, code)) and the error context
//     "[rank r/W host]", and makes world rank 0 the logging rank,
//   - finds the node layout: local rank/size among the ranks sharing memory (MPI_COMM_TYPE_SHARED), and the node
//     id, which is the rank of this node's leader (local rank 0) among all leaders.
//   - gathers every rank's host and pid (host_of(); the watch names a lost rank by them),
//   - owns the CollectiveWatch that bounds every wait of world() and of every communicator split from it, with a
//     notice channel between the ranks (comm/mpi/collective_watch.h); set_collective_watch() configures it. The
//     abort hook dumps the flight recorders before MPI_Abort. After a collective timeout the destructor skips
//     MPI_Finalize (it would wait for the peers that are gone).
// Destroy every communicator split from world() (ProcessGroups) before the MpiRuntime.
// This header does not include mpi.h: apps and engine code see only the Communicator interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/communicator.h"
#include "comm/watch_options.h"

namespace ms {

class CollectiveWatch;
class MpiCommunicator;

class MpiRuntime {
  public:
    MpiRuntime(int* argc = nullptr, char*** argv = nullptr);
    ~MpiRuntime();
    MpiRuntime(const MpiRuntime&) = delete;
    MpiRuntime& operator=(const MpiRuntime&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    int local_rank() const { return local_rank_; }  // among the ranks on this node
    // MPI allows calls from several threads at once (MPI_THREAD_MULTIPLE): what the communication engine needs.
    bool thread_multiple() const { return thread_multiple_; }
    int local_size() const { return local_size_; }
    int node_id() const { return node_id_; }  // 0 .. num_nodes - 1, ordered by the nodes' lowest world rank
    int num_nodes() const { return num_nodes_; }
    const std::string& hostname() const { return hostname_; }
    const std::string& host_of(int world_rank) const;  // every rank's host, gathered once at start-up
    // One line for the start-up log: "rank 0/8 on host-a (node 0/2, local 0/4); launcher: <launch_environment()>"
    std::string describe() const;

    Communicator& world();  // MPI_COMM_WORLD, name "world"
    // Timeout, flight-recorder directory, signal flag and fault hook for every wait from now on.
    void set_collective_watch(CollectiveWatchOptions options);
    // A part of every flight-recorder dump (collective_watch.h add_section).
    void add_trace_section(std::string key, std::function<nlohmann::ordered_json()> section);

  private:
    bool initialized_here_ = false;
    bool thread_multiple_ = false;
    int rank_ = 0, size_ = 1;
    int local_rank_ = 0, local_size_ = 1;
    int node_id_ = 0, num_nodes_ = 1;
    std::string hostname_;
    std::shared_ptr<CollectiveWatch> watch_;
    std::unique_ptr<MpiCommunicator> world_;
};

// The launcher as the environment tells it, for logs: Open MPI's OMPI_COMM_WORLD_* and Slurm's SLURM_JOB_ID,
// SLURM_PROCID, SLURM_NTASKS, SLURM_NODELIST; "none (singleton)" when neither is set.
std::string launch_environment();

// Whether a launcher started this process as one of several ranks: Open MPI's OMPI_COMM_WORLD_SIZE, a PMI
// launcher's PMI_SIZE (MPICH's Hydra, srun --mpi=pmi2) or an srun step's SLURM_STEP_NUM_TASKS above 1. A command
// that works on one process (calibrate) starts MPI only then.
bool launched_as_several_ranks();

// Every rank of mpi.world() must pass the same hash (e.g. of the resolved config). Collective. Throws ms::UserError
// on every rank, naming the ranks whose hash differs from rank 0's and their hosts; its failed_rank() is the first
// of them.
void check_same_config(MpiRuntime& mpi, uint64_t hash);

}  // namespace ms
