#include "process_memory.hpp"

#include <fstream>
#include <sstream>
#include <string>

namespace xmoe::app {

ResidentMemory resident_memory() {
  ResidentMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    size_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "VmRSS:") m.total = kib << 10;
    if (key == "RssAnon:") m.anonymous = kib << 10;
    if (key == "RssFile:") m.file = kib << 10;
  }
  return m;
}

}  // namespace xmoe::app
