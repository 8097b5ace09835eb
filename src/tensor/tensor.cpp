#include "xmoe/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace xmoe {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  XMOE_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "shape: at most ", kMaxDims, " dims, got ",
             dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    XMOE_CHECK(dims[i] >= 0, "shape: negative dim ", dims[i], " at ", i);
    dims_[i] = dims[i];
  }
  ndim_ = static_cast<int>(dims.size());
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << dims_[static_cast<size_t>(i)];
  os << ']';
  return os.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  size_t bytes = (t.nbytes() + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  XMOE_CHECK(p != nullptr, "tensor: out of memory allocating ", bytes, " bytes for ", shape.str());
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.zero();
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  Tensor t;
  t.storage_ = std::move(owner);
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  XMOE_CHECK(shape.numel() == numel(), "reshape: ", shape_.str(), " has ", numel(), " elements, ",
             shape.str(), " needs ", shape.numel());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  XMOE_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "slice0: [", begin, ", ", end,
             ") out of range for ", shape_.str());
  Tensor t = *this;
  int64_t row = dim(0) ? numel() / dim(0) : 0;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  std::array<int64_t, kMaxDims> d{};
  for (int i = 0; i < ndim(); ++i) d[static_cast<size_t>(i)] = shape_[i];
  d[0] = end - begin;
  t.shape_ = Shape(std::span<const int64_t>(d.data(), static_cast<size_t>(ndim())));
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

void Tensor::zero() {
  if (nbytes()) std::memset(data_, 0, nbytes());
}

namespace {
template <class Dst, class Src>
void convert(Dst* d, const Src* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Src, bf16> && std::is_same_v<Dst, bf16>)
      d[i] = s[i];
    else if constexpr (std::is_same_v<Src, bf16>)
      d[i] = static_cast<Dst>(static_cast<float>(s[i]));
    else if constexpr (std::is_same_v<Dst, bf16>)
      d[i] = bf16(static_cast<float>(s[i]));
    else
      d[i] = static_cast<Dst>(s[i]);
  }
}
template <class Dst>
void convert_from(Dst* d, const Tensor& src, int64_t n) {
  switch (src.dtype()) {
    case DType::f32:
      convert(d, src.data<float>(), n);
      break;
    case DType::f64:
      convert(d, src.data<double>(), n);
      break;
    case DType::bf16:
      convert(d, src.data<bf16>(), n);
      break;
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  XMOE_CHECK(src.numel() == numel(), "copy_from: ", src.shape().str(), " into ", shape_.str());
  if (src.dtype() == dtype_) {
    if (nbytes()) std::memmove(data_, src.raw(), nbytes());
    return;
  }
  switch (dtype_) {
    case DType::f32:
      convert_from(data<float>(), src, numel());
      break;
    case DType::f64:
      convert_from(data<double>(), src, numel());
      break;
    case DType::bf16:
      convert_from(data<bf16>(), src, numel());
      break;
  }
}

double Tensor::get(int64_t i) const {
  switch (dtype_) {
    case DType::f32:
      return data<float>()[i];
    case DType::f64:
      return data<double>()[i];
    case DType::bf16:
      return static_cast<float>(data<bf16>()[i]);
  }
  return 0;
}

void Tensor::set(int64_t i, double v) {
  switch (dtype_) {
    case DType::f32:
      data<float>()[i] = static_cast<float>(v);
      break;
    case DType::f64:
      data<double>()[i] = v;
      break;
    case DType::bf16:
      data<bf16>()[i] = bf16(static_cast<float>(v));
      break;
  }
}

}  // namespace xmoe
