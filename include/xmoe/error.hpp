// Errors raised at API boundaries: the message names the field, file or argument that is wrong.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace xmoe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Always-on check (release builds too): throws xmoe::Error with the concatenated message.
#define XMOE_CHECK(cond, ...)                                              \
  do {                                                                     \
    if (!(cond)) throw ::xmoe::Error(::xmoe::detail::concat(__VA_ARGS__)); \
  } while (0)

}  // namespace xmoe
