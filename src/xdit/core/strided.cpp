#include "xdit/core/strided.h"


namespace xdit {

namespace {

template <typename Word>
void gather(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t n) {
  const Word* s = reinterpret_cast<const Word*>(src);
  Word* d = reinterpret_cast<Word*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i * dst_stride] = s[i * src_stride];
}

}  // namespace

void coalesce_dims(Shape& shape, std::vector<Shape*> strides) {
  Shape out_shape;
  std::vector<Shape> out_strides(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !out_shape.empty();
    for (size_t k = 0; merge && k < strides.size(); ++k) {
      merge = out_strides[k].back() == (*strides[k])[d] * shape[d];
    }
    if (merge) {
      out_shape.back() *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) out_strides[k].back() = (*strides[k])[d];
    } else {
      out_shape.push_back(shape[d]);
      for (size_t k = 0; k < strides.size(); ++k) out_strides[k].push_back((*strides[k])[d]);
    }
  }
  if (out_shape.empty()) {
    out_shape.push_back(1);
    for (auto& s : out_strides) s.push_back(1);
  }
  shape = std::move(out_shape);
  for (size_t k = 0; k < strides.size(); ++k) *strides[k] = std::move(out_strides[k]);
}

void strided_copy(const void* src, DType src_dtype, const Shape& src_strides_in, void* dst, DType dst_dtype,
                  const Shape& dst_strides_in, const Shape& shape_in) {
  Shape shape = shape_in, src_strides = src_strides_in, dst_strides = dst_strides_in;
  if (shape_numel(shape) == 0) return;
  coalesce_dims(shape, {&src_strides, &dst_strides});
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const int64_t inner = shape.back();
  const int64_t outer = shape_numel(shape) / inner;
  const size_t src_size = dtype_size(src_dtype), dst_size = dtype_size(dst_dtype);
  const int64_t src_inner_stride = src_strides.back(), dst_inner_stride = dst_strides.back();
  const bool inner_dense = src_inner_stride == 1 && dst_inner_stride == 1;

#pragma omp parallel for schedule(static) if (outer * inner > (1 << 15) && outer > 1)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, src_off = 0, dst_off = 0;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t i = rem % shape[d];
      rem /= shape[d];
      src_off += i * src_strides[d];
      dst_off += i * dst_strides[d];
    }
    const char* s = static_cast<const char*>(src) + src_off * static_cast<int64_t>(src_size);
    char* t = static_cast<char*>(dst) + dst_off * static_cast<int64_t>(dst_size);
    if (inner_dense) {
      convert(s, src_dtype, t, dst_dtype, static_cast<size_t>(inner));
    } else if (src_dtype == dst_dtype) {
      switch (src_size) {
        case 1: gather<uint8_t>(s, src_inner_stride, t, dst_inner_stride, inner); break;
        case 2: gather<uint16_t>(s, src_inner_stride, t, dst_inner_stride, inner); break;
        case 4: gather<uint32_t>(s, src_inner_stride, t, dst_inner_stride, inner); break;
        default: gather<uint64_t>(s, src_inner_stride, t, dst_inner_stride, inner); break;
      }
    } else {
      for (int64_t i = 0; i < inner; ++i) {
        convert(s + i * src_inner_stride * static_cast<int64_t>(src_size), src_dtype,
                t + i * dst_inner_stride * static_cast<int64_t>(dst_size), dst_dtype, 1);
      }
    }
  }
}

}  // namespace xdit
