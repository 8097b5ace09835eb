// What the fuzz targets share: the input as text, a private scratch directory for entry points that read
// files (checkpoints), and the fixtures the targets render or encode with.
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace xmoe::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

inline std::string data_path(const std::string& relative) {
  return std::string(XMOE_TEST_DATA_DIR) + "/" + relative;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("fuzz target: cannot read fixture " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A directory owned by this process for its lifetime: the checkpoint readers take a path, so each input is
// written there first. In memory (/dev/shm) where there is one: a file write per input on a loaded disk costs
// more than the parse and can turn into a false "hang"; else under $TMPDIR or /tmp. One per target process,
// removed when the process exits.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string base = ::access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : tmp && *tmp ? tmp : "/tmp";
    std::string templ = base + "/xmoe-fuzz-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("fuzz target: mkdtemp failed");
    path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write(const std::string& name, std::string_view bytes) const {
    std::ofstream out(file(name), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("fuzz target: cannot write " + file(name));
  }
  void remove(const std::string& name) const {
    std::error_code ec;
    std::filesystem::remove(file(name), ec);
  }

 private:
  std::string path_;
};

}  // namespace xmoe::fuzz
