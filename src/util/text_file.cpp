#include "util/text_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "xmoe/error.hpp"

namespace xmoe {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XMOE_CHECK(in.good(), path, ": cannot open: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  XMOE_CHECK(!in.bad(), path, ": read failed");
  return ss.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  XMOE_CHECK(out.good(), path, ": cannot create: ", std::strerror(errno));
  out << text;
  out.close();
  XMOE_CHECK(out.good(), path, ": write failed");
}

}  // namespace xmoe
