// The MPI backend of xmoe::Communicator. Available when xmoe was built with MPI (CMake defines
// XMOE_HAVE_MPI for targets that link it). This header does not include <mpi.h>.
#pragma once
#include <memory>

#include "xmoe/communicator.hpp"

namespace xmoe {

// Owns the process's MPI environment: the constructor calls MPI_Init_thread(MPI_THREAD_FUNNELED) and the
// destructor MPI_Finalize. MPI can be initialised once per process, so there is at most one session; if MPI
// was already initialised by someone else the session adopts it and leaves finalising to its owner.
// Every communicator obtained from the session must be destroyed before the session.
//
// Environment: XMOE_COMM_TIMEOUT_S bounds every collective (see comm_timeout_from_env). When a collective
// times out, the rank prints "xmoe: rank R: <collective> on group '<name>' timed out after S s (a peer rank
// died or never arrived)" to stderr and calls MPI_Abort(comm, 3): the peers that did arrive are blocked in
// the same collective and cannot be released, so the job cannot continue consistently.
class MpiSession {
 public:
  MpiSession();                         // MPI_Init_thread(nullptr, nullptr, ...)
  MpiSession(int* argc, char*** argv);  // lets MPI see (and strip) its own command-line arguments
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // A communicator over every process of the job, named "world". Collective over MPI_COMM_WORLD: it works on
  // a duplicate of MPI_COMM_WORLD, so xmoe's traffic never matches messages of other MPI users.
  std::unique_ptr<Communicator> world();

 private:
  bool owns_mpi_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
};

}  // namespace xmoe
