// Grow-only aligned scratch buffers: after warm-up, switching per-call options allocates nothing.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

namespace xmoe {

template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : data_(o.data_), capacity_(o.capacity_) { o.data_ = nullptr, o.capacity_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(capacity_, o.capacity_);
    return *this;
  }
  ~Buffer() { std::free(data_); }

  // Returns storage for at least n elements; contents are kept only when no growth happens.
  T* ensure(size_t n) {
    if (n > capacity_) {
      std::free(data_);
      size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
      data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
      if (!data_) throw std::bad_alloc();
      capacity_ = n;
    }
    return data_;
  }
  T* ensure_zero(size_t n) {
    T* p = ensure(n);
    if (n) std::memset(static_cast<void*>(p), 0, n * sizeof(T));
    return p;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t bytes() const { return capacity_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace xmoe
