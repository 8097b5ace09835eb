#include "safetensors_stream_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "xmoe/error.hpp"

namespace xmoe::app {

namespace {

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    XMOE_CHECK(w > 0, path, ": write failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string path, const std::vector<StreamedTensor>& tensors,
                                                 const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& t : tensors) {
    XMOE_CHECK(t.name != "__metadata__" && !header.contains(t.name), path_, ": tensor '", t.name,
               "': duplicate or reserved name");
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {expected_, expected_ + t.nbytes}}};
    expected_ += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  XMOE_CHECK(fd_ >= 0, tmp_, ": cannot create: ", std::strerror(errno));
  const uint64_t n = text.size();
  write_all(fd_, &n, 8, tmp_);
  write_all(fd_, text.data(), text.size(), tmp_);
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::remove(tmp_.c_str());
  }
}

void SafetensorsStreamWriter::write(std::span<const std::byte> bytes) {
  XMOE_CHECK(fd_ >= 0, path_, ": write after finish");
  XMOE_CHECK(written_ + bytes.size() <= expected_, path_, ": more data than the header announced (",
             expected_, " bytes)");
  write_all(fd_, bytes.data(), bytes.size(), tmp_);
  written_ += bytes.size();
}

void SafetensorsStreamWriter::finish() {
  XMOE_CHECK(fd_ >= 0, path_, ": finish called twice");
  XMOE_CHECK(written_ == expected_, path_, ": ", written_, " data bytes written, the header announced ",
             expected_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    std::remove(tmp_.c_str());
    throw Error(tmp_ + ": close failed: " + std::strerror(err));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_.c_str());
    throw Error(path_ + ": cannot rename " + tmp_ + " into place: " + std::strerror(err));
  }
}

}  // namespace xmoe::app
