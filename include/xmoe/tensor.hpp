// A small dense tensor: dtype, shape (up to kMaxDims), contiguous 64-byte aligned storage shared by views.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "xmoe/dtype.hpp"
#include "xmoe/error.hpp"

namespace xmoe {

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(ndim_)}; }
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  // Wraps memory owned elsewhere (an mmap, a buffer); `owner` keeps it alive.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner);

  bool defined() const { return data_ != nullptr || shape_.ndim() > 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <class T>
  T* data() {
    XMOE_CHECK(dtype_of<T>() == dtype_, "tensor holds ", dtype_name(dtype_), ", accessed as ",
               dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    return const_cast<Tensor*>(this)->data<T>();
  }

  // Views sharing storage.
  Tensor reshape(const Shape& shape) const;
  Tensor slice0(int64_t begin, int64_t end) const;  // rows [begin, end) of dim 0

  Tensor clone() const;
  Tensor to(DType dtype) const;  // converts (round to nearest even for bf16)
  void zero();
  void copy_from(const Tensor& src);  // same shape; converts dtype

  // Element access through double, for tests and small utilities (not for hot paths).
  double get(int64_t flat_index) const;
  void set(int64_t flat_index, double value);

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace xmoe
