// A job in which rank 1 never joins an all_to_all that every other rank enters: with `sleep` it dawdles
// past the timeout, with `kill` it dies (SIGKILL) before the collective. Run by expect_abort.cmake, which
// asserts that the job ends non-zero, well before rank 1 would have woken up, and says what timed out.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>

#include "xmoe/error.hpp"
#include "xmoe/mpi.hpp"

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "sleep") != 0 && std::strcmp(argv[1], "kill") != 0)) {
    std::fprintf(stderr, "usage: %s sleep|kill\n", argv[0]);
    return 2;
  }
  const bool kill_self = std::strcmp(argv[1], "kill") == 0;
  try {
    xmoe::MpiSession session(&argc, &argv);
    auto world = session.world();
    const size_t n = 1024;
    std::vector<float> send(n * static_cast<size_t>(world->size()), 1.f), recv(send.size());
    world->barrier();  // everyone is up; the hang below is the only one
    if (world->rank() == 1) {
      if (kill_self) std::raise(SIGKILL);
      sleep(120);  // far longer than the test allows: only the others' abort can end the job in time
      return 0;
    }
    world->all_to_all(send.data(), recv.data(), n, xmoe::ElementType::f32);
    std::fprintf(stderr, "rank %d: all_to_all returned although rank 1 never joined\n", world->rank());
    return 0;
  } catch (const xmoe::Error& e) {
    std::fprintf(stderr, "xmoe: %s\n", e.what());
    return 2;
  }
}
