// Data movement: strided dtype-converting copy (with a tiled path for transpositions), concat,
// constant pad and nearest upsampling. These move elements of any dtype; only copy converts.
#include "xdit/backend/cpu/vec.h"  // first: it includes <immintrin.h>

#include <algorithm>
#include <cstring>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/core/strided.h"
#include "xdit/core/threading.h"

namespace xdit {

namespace {

// fn(Word{}) with an unsigned integer type of `size` bytes, for moving elements without reading them.
template <typename Fn>
void visit_word(size_t size, Fn&& fn) {
  switch (size) {
    case 1:
      fn(uint8_t{});
      return;
    case 2:
      fn(uint16_t{});
      return;
    case 4:
      fn(uint32_t{});
      return;
    case 8:
      fn(uint64_t{});
      return;
  }
  fail("cpu kernel: unsupported element size ", size);
}

// Row-major multi-index over `shape`, stepped one row at a time.
class RowIndex {
 public:
  RowIndex(const Shape& shape, int64_t row) : shape_(shape), index_(shape.size()) {
    for (size_t d = shape.size(); d-- > 0;) {
      index_[d] = row % shape[d];
      row /= shape[d];
    }
  }
  int64_t operator[](size_t d) const { return index_[d]; }
  void next() {
    for (size_t d = shape_.size(); d-- > 0;) {
      if (++index_[d] < shape_[d]) return;
      index_[d] = 0;
    }
  }

 private:
  const Shape& shape_;
  std::vector<int64_t> index_;
};

// ---- Transpositions: dst's innermost dim is unit-stride but src's is not, while another dim is
// unit-stride in src (a full transposition, as between [C, H*W] and [H*W, C]). Walking dst in
// order would read every element from a different cache line, so the two unit-stride dims are
// walked in 32 x 32 tiles that stay in L1, moved as 16 x 16 register transposes where possible.
// (When the innermost dim is dense on both sides, as in [B, S, H, D] <-> [B, H, S, D],
// strided_copy already moves whole rows and runs near memcpy speed.)

// fn(src_offset, dst_offset, a_begin, a_end, b_begin, b_end) for each tile over dims a and b, the
// offsets being those of the tile's position in the other dims; tiles are split among threads.
template <typename Fn>
void for_each_tile(const Shape& shape, const Shape& src_strides, const Shape& dst_strides, size_t a, size_t b,
                   int64_t tile_size, Fn&& fn) {
  Shape outer_shape, outer_src_strides, outer_dst_strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d == a || d == b) continue;
    outer_shape.push_back(shape[d]);
    outer_src_strides.push_back(src_strides[d]);
    outer_dst_strides.push_back(dst_strides[d]);
  }
  const int64_t a_tiles = (shape[a] + tile_size - 1) / tile_size, b_tiles = (shape[b] + tile_size - 1) / tile_size;
  const int64_t tiles = shape_numel(outer_shape) * a_tiles * b_tiles;
  parallel_for(tiles, 16, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      int64_t rest = tile / (a_tiles * b_tiles);
      int64_t src_offset = 0, dst_offset = 0;
      for (size_t d = outer_shape.size(); d-- > 0;) {
        const int64_t i = rest % outer_shape[d];
        rest /= outer_shape[d];
        src_offset += i * outer_src_strides[d];
        dst_offset += i * outer_dst_strides[d];
      }
      const int64_t a0 = (tile / b_tiles % a_tiles) * tile_size, b0 = (tile % b_tiles) * tile_size;
      fn(src_offset, dst_offset, a0, std::min(shape[a], a0 + tile_size), b0, std::min(shape[b], b0 + tile_size));
    }
  });
}

// How a transposition moves 16 elements through one register of 32-bit lanes, and one element by
// itself: raw words for same-dtype copies (4- and 2-byte words in registers, others scalar only),
// f32 values for the bf16 <-> f32 conversions (rounding exactly like f32_to_bf16).
template <typename Word>
struct Words {
  using Elem = Word;
  static constexpr bool kVector = false;
  static Word from(Word v) { return v; }
};
template <>
struct Words<uint32_t> {
  using Elem = uint32_t;
  static constexpr bool kVector = true;
  static uint32_t from(uint32_t v) { return v; }
  static __m512 load(const uint32_t* p) { return _mm512_castsi512_ps(_mm512_loadu_si512(p)); }
  static void store(uint32_t* p, __m512 v) { _mm512_storeu_si512(p, _mm512_castps_si512(v)); }
};
template <>
struct Words<uint16_t> {
  using Elem = uint16_t;
  static constexpr bool kVector = true;
  static uint16_t from(uint16_t v) { return v; }
  static __m512 load(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static void store(uint16_t* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_castps_si512(v)));
  }
};
struct F32Values {
  using Elem = float;
  static constexpr bool kVector = true;
  static float from(bf16_t v) { return bf16_to_f32(v.bits); }
  static __m512 load(const float* p) { return cpu::load16(p); }
  static void store(float* p, __m512 v) { cpu::store16(p, v); }
};
struct Bf16Values {
  using Elem = bf16_t;
  static constexpr bool kVector = true;
  static bf16_t from(float v) { return bf16_t{f32_to_bf16(v)}; }
  static __m512 load(const bf16_t* p) { return cpu::load16(p); }
  static void store(bf16_t* p, __m512 v) { cpu::store16(p, v); }
};

// Transposes 16 x 16 32-bit lanes: r[i] lane j becomes r[j] lane i.
void transpose16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int k = 0; k < 2; ++k) {
      const __m512d lo = _mm512_castps_pd(t[i + k]), hi = _mm512_castps_pd(t[i + k + 2]);
      r[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi));
      r[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi));
    }
  }
  // r[4g + c] now holds, in 128-bit lane k, rows 4g..4g+3 at column 4k + c.
  for (int g = 0; g < 16; g += 8) {
    for (int c = 0; c < 4; ++c) {
      t[g + c] = _mm512_shuffle_f32x4(r[g + c], r[g + c + 4], 0x88);
      t[g + c + 4] = _mm512_shuffle_f32x4(r[g + c], r[g + c + 4], 0xdd);
    }
  }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88);
    r[c + 8] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0xdd);
  }
}

// Dim a is unit-stride in src, dim b (the innermost) unit-stride in dst. Whole 16 x 16 blocks of a
// tile go through registers when both sides can, the rest element by element.
template <typename From, typename To>
void transpose_elements(const typename From::Elem* src, const Shape& src_strides, typename To::Elem* dst,
                        const Shape& dst_strides, const Shape& shape, size_t a) {
  const size_t b = shape.size() - 1;
  const int64_t src_b_stride = src_strides[b], dst_a_stride = dst_strides[a];
  for_each_tile(shape, src_strides, dst_strides, a, b, 32,
                [&](int64_t src_offset, int64_t dst_offset, int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
                  int64_t a_blocks_end = a0, b_blocks_end = b0;
                  if constexpr (From::kVector && To::kVector) {
                    a_blocks_end = a0 + (a1 - a0) / 16 * 16;
                    b_blocks_end = b0 + (b1 - b0) / 16 * 16;
                    for (int64_t i = a0; i < a_blocks_end; i += 16) {
                      for (int64_t j = b0; j < b_blocks_end; j += 16) {
                        __m512 block[16];
                        for (int64_t q = 0; q < 16; ++q)
                          block[q] = From::load(src + src_offset + i + (j + q) * src_b_stride);
                        transpose16x16(block);
                        for (int64_t p = 0; p < 16; ++p)
                          To::store(dst + dst_offset + (i + p) * dst_a_stride + j, block[p]);
                      }
                    }
                  }
                  for (int64_t i = a0; i < a1; ++i) {
                    const typename From::Elem* s = src + src_offset + i;
                    typename To::Elem* t = dst + dst_offset + i * dst_a_stride;
                    for (int64_t j = i < a_blocks_end ? b_blocks_end : b0; j < b1; ++j)
                      t[j] = To::from(s[j * src_b_stride]);
                  }
                });
}

// True when it copied: the layouts are a transposition and the dtype pair has a fast conversion.
bool try_transpose_elements(const Tensor& src, const Tensor& dst, const Shape& shape, const Shape& src_strides,
                            const Shape& dst_strides) {
  const size_t last = shape.size() - 1;
  if (dst_strides[last] != 1 || src_strides[last] == 1) return false;
  size_t a = last;
  for (size_t d = 0; d < last; ++d) {
    if (src_strides[d] == 1) a = d;
  }
  if (a == last) return false;
  const DType from = src.dtype(), to = dst.dtype();
  if (from == to) {
    visit_word(dtype_size(from), [&](auto word) {
      using Word = decltype(word);
      transpose_elements<Words<Word>, Words<Word>>(static_cast<const Word*>(src.raw_data()), src_strides,
                                                   static_cast<Word*>(dst.raw_data()), dst_strides, shape, a);
    });
    return true;
  }
  if (from == DType::BF16 && to == DType::F32) {
    transpose_elements<Bf16Values, F32Values>(src.data<bf16_t>(), src_strides, dst.data<float>(), dst_strides, shape,
                                              a);
    return true;
  }
  if (from == DType::F32 && to == DType::BF16) {
    transpose_elements<F32Values, Bf16Values>(src.data<float>(), src_strides, dst.data<bf16_t>(), dst_strides, shape,
                                              a);
    return true;
  }
  return false;
}

// n elements from src (element stride `stride`) to dense dst.
template <typename Word>
void copy_row(const Word* src, int64_t stride, Word* dst, int64_t n) {
  if (stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(Word));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
  }
}

// Rows of the output shape per thread, at least: keeps small tensors on one thread.
int64_t row_grain(int64_t row_length) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(row_length, 1));
}

}  // namespace

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  if (src.numel() == 0) return;
  Shape shape = src.shape(), src_strides = src.strides(), dst_strides = dst.strides();
  coalesce_dims(shape, {&src_strides, &dst_strides});
  if (try_transpose_elements(src, dst, shape, src_strides, dst_strides)) return;
  strided_copy(src.raw_data(), src.dtype(), src.strides(), dst.raw_data(), dst.dtype(), dst.strides(), src.shape());
}

Tensor CpuBackend::concat(const std::vector<Tensor>& parts, int64_t dim) {
  const Tensor& first = parts.front();
  const int64_t d = dim < 0 ? dim + first.dim() : dim;
  Shape shape = first.shape();
  shape[d] = 0;
  for (const Tensor& part : parts) shape[d] += part.size(d);
  Tensor out = Tensor::empty(shape, first.dtype());
  int64_t offset = 0;
  for (const Tensor& part : parts) {
    if (part.numel() > 0) copy(part, out.narrow(d, offset, part.size(d)));
    offset += part.size(d);
  }
  return out;
}

Tensor CpuBackend::pad(const Tensor& x, const std::vector<int64_t>& pads, float value) {
  const size_t ndim = x.shape().size();
  Shape shape = x.shape();
  std::vector<int64_t> before(ndim, 0);  // output index of input index 0, per dim (negative crops)
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const size_t d = ndim - 1 - i;
    before[d] = pads[2 * i];
    shape[d] += pads[2 * i] + pads[2 * i + 1];
  }
  Tensor out = Tensor::empty(shape, x.dtype());
  if (out.numel() == 0) return out;
  if (ndim == 0) {
    copy(x, out);
    return out;
  }
  const int64_t width = shape.back(), in_width = x.size(-1), left = before.back(), in_stride = x.stride(-1);
  // Output columns [copy_begin, copy_end) come from input columns starting at copy_begin - left.
  const int64_t copy_begin = std::clamp<int64_t>(left, 0, width);
  const int64_t copy_end = std::clamp<int64_t>(left + in_width, copy_begin, width);
  const Shape row_shape(shape.begin(), shape.end() - 1);
  const int64_t rows = out.numel() / width;
  const Shape& in_shape = x.shape();
  const Shape& in_strides = x.strides();

  visit_word(dtype_size(x.dtype()), [&](auto word) {
    using Word = decltype(word);
    Word fill;
    store_from_f32(&fill, x.dtype(), 0, value);
    const Word* in = static_cast<const Word*>(x.raw_data());
    Word* out_data = static_cast<Word*>(out.raw_data());
    parallel_for(rows, row_grain(width), [&](int64_t begin, int64_t end) {
      RowIndex index(row_shape, begin);
      for (int64_t r = begin; r < end; ++r, index.next()) {
        Word* out_row = out_data + r * width;
        bool inside = copy_end > copy_begin;
        int64_t in_offset = 0;
        for (size_t d = 0; d + 1 < ndim && inside; ++d) {
          const int64_t i = index[d] - before[d];
          inside = i >= 0 && i < in_shape[d];
          in_offset += i * in_strides[d];
        }
        if (!inside) {
          std::fill_n(out_row, width, fill);
          continue;
        }
        std::fill_n(out_row, copy_begin, fill);
        copy_row(in + in_offset + (copy_begin - left) * in_stride, in_stride, out_row + copy_begin,
                 copy_end - copy_begin);
        std::fill_n(out_row + copy_end, width - copy_end, fill);
      }
    });
  });
  return out;
}

Tensor CpuBackend::upsample_nearest(const Tensor& x, const std::vector<int64_t>& factors) {
  const size_t ndim = x.shape().size();
  std::vector<int64_t> factor(ndim, 1);
  Shape shape = x.shape();
  for (size_t i = 0; i < factors.size(); ++i) {
    const size_t d = ndim - factors.size() + i;
    factor[d] = factors[i];
    shape[d] *= factors[i];
  }
  Tensor out = Tensor::empty(shape, x.dtype());
  if (out.numel() == 0) return out;
  if (ndim == 0) {
    copy(x, out);
    return out;
  }
  const int64_t width = shape.back(), in_width = x.size(-1), in_stride = x.stride(-1), repeat = factor.back();
  const Shape row_shape(shape.begin(), shape.end() - 1);
  const int64_t rows = out.numel() / width;
  const Shape& in_strides = x.strides();

  visit_word(dtype_size(x.dtype()), [&](auto word) {
    using Word = decltype(word);
    const Word* in = static_cast<const Word*>(x.raw_data());
    Word* out_data = static_cast<Word*>(out.raw_data());
    parallel_for(rows, row_grain(width), [&](int64_t begin, int64_t end) {
      RowIndex index(row_shape, begin);
      int64_t previous_offset = -1;
      for (int64_t r = begin; r < end; ++r, index.next()) {
        Word* out_row = out_data + r * width;
        int64_t in_offset = 0;
        for (size_t d = 0; d + 1 < ndim; ++d) {
          in_offset += index[d] / factor[d] * in_strides[d];
        }
        // Rows repeated along an upsampled outer dim equal the row just written by this thread.
        if (r > begin && in_offset == previous_offset) {
          std::memcpy(out_row, out_row - width, static_cast<size_t>(width) * sizeof(Word));
          continue;
        }
        previous_offset = in_offset;
        const Word* in_row = in + in_offset;
        if (repeat == 1) {
          copy_row(in_row, in_stride, out_row, in_width);
          continue;
        }
        for (int64_t j = 0; j < in_width; ++j) std::fill_n(out_row + j * repeat, repeat, in_row[j * in_stride]);
      }
    });
  });
  return out;
}

}  // namespace xdit
