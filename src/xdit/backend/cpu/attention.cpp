// CPU scaled dot-product attention: a blocked online-softmax kernel (flash-attention style).
//
// Per (batch, kv head) K and V are packed once into the layouts the micro-kernels stream:
//   K: tiles of 32 keys, [D/g][32 keys][g]  -> 16 keys per zmm for the score tile
//   V: [keys/g][D][g]                       -> 16 head-dim lanes per zmm for the P·V tile
// where g is the number of elements one lane multiplies: 2 for bf16 (vdpbf16ps multiplies
// adjacent pairs), 1 for f32 (vfmadd). Then every task (batch, head, block of query rows) walks
// the key blocks, keeping the running max, running sum and output accumulator in f32 in its
// thread's scratch; the Sq×Skv score matrix never exists, only one [query block × key block]
// tile of it. Scores are kept in base 2 (pre-multiplied by scale·log2 e) so the softmax needs
// only exp2. Head dims are zero-padded to a multiple of 16, so the kernels take any D (the ops
// layer admits 1 to 512).
//
// bf16 follows flash-attention: Q·K^T accumulates in f32, the probabilities are rounded to bf16
// (vcvtne2ps2bf16: nearest-even, subnormal probabilities flushed to 0, i.e. below 1e-38 of the
// row max, which cannot move the result) for the P·V product, which again accumulates in f32.
// The row sums and the LSE use the unrounded f32 probabilities. The output is rounded to bf16
// exactly as xdit::f32_to_bf16 does.
#include "xdit/backend/cpu/attention_simd.h"  // first: it includes <immintrin.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/core/allocator.h"
#include "xdit/core/threading.h"

namespace xdit {
namespace {

constexpr int64_t kKeyTile = 32;       // keys per score micro-tile: two zmm of f32 scores per row
constexpr int64_t kScoreRows = 12;     // query rows per score micro-tile (24 accumulators)
constexpr int64_t kValueRows = 6;      // query rows per P·V micro-tile
constexpr int64_t kValueLanes = 64;    // head-dim lanes per P·V micro-tile (4 zmm, 24 accumulators)
constexpr int64_t kRowGranule = 12;    // query blocks are a multiple of both row counts above
constexpr int64_t kQueryBlock = 96;    // query rows per task
constexpr int64_t kKeyBlock = 256;     // keys per online-softmax step
constexpr int64_t kHeadDimAlign = 16;  // one zmm of f32
// Packed K+V held at once; longer or wider problems are packed a few (batch, kv head) at a time.
constexpr size_t kPackBudgetBytes = size_t{64} << 20;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// vdpbf16ps: each f32 lane accumulates the dot product of one pair of bf16.
struct Bf16Kernel {
  using Elem = bf16_t;
  using Operand = __m512i;
  static constexpr int64_t kGroup = 2;
  static Operand load(const Elem* p) { return _mm512_loadu_si512(p); }
  // 16 units (32 bf16) from p, elements at or past `count` read as zero.
  static __m512i load_units(const Elem* p, int64_t count) {
    const __mmask32 lanes = count >= 32 ? ~__mmask32{0} : count <= 0 ? 0 : (__mmask32{1} << count) - 1;
    return _mm512_maskz_loadu_epi16(lanes, p);
  }
  static Operand broadcast(const Elem* p) {
    int32_t pair;
    std::memcpy(&pair, p, sizeof(pair));
    return _mm512_set1_epi32(pair);
  }
  static __m512 multiply_add(__m512 acc, Operand a, Operand b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  static void store_probabilities(Elem* dst, __m512 lo, __m512 hi) {
    _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
};

struct F32Kernel {
  using Elem = float;
  using Operand = __m512;
  static constexpr int64_t kGroup = 1;
  static Operand load(const Elem* p) { return _mm512_loadu_ps(p); }
  static __m512i load_units(const Elem* p, int64_t count) {
    const __mmask16 lanes = count >= 16 ? 0xffff : count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1u);
    return _mm512_maskz_loadu_epi32(lanes, p);
  }
  static Operand broadcast(const Elem* p) { return _mm512_set1_ps(*p); }
  static __m512 multiply_add(__m512 acc, Operand a, Operand b) { return _mm512_fmadd_ps(a, b, acc); }
  static void store_probabilities(Elem* dst, __m512 lo, __m512 hi) {
    _mm512_storeu_ps(dst, lo);
    _mm512_storeu_ps(dst + 16, hi);
  }
};

// Scores of kRows query rows against one packed tile of 32 keys, times `factor`.
// q_tile: [head_dim/g][kRows][g] (one pointer walks every row); k_tile: [head_dim/g][32][g];
// s: [kRows][s_stride].
template <class Kernel, int kRows>
void score_tile(const typename Kernel::Elem* q_tile, int64_t head_dim, const typename Kernel::Elem* k_tile,
                float factor, float* s, int64_t s_stride) {
  constexpr int64_t g = Kernel::kGroup;
  __m512 acc[kRows][2];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < head_dim / g; ++p) {
    const auto k0 = Kernel::load(k_tile + p * kKeyTile * g);
    const auto k1 = Kernel::load(k_tile + p * kKeyTile * g + 16 * g);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const auto a = Kernel::broadcast(q_tile + (p * kRows + r) * g);
      acc[r][0] = Kernel::multiply_add(acc[r][0], a, k0);
      acc[r][1] = Kernel::multiply_add(acc[r][1], a, k1);
    }
  }
  const __m512 f = _mm512_set1_ps(factor);
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    _mm512_storeu_ps(s + r * s_stride, _mm512_mul_ps(acc[r][0], f));
    _mm512_storeu_ps(s + r * s_stride + 16, _mm512_mul_ps(acc[r][1], f));
  }
}

// o[r][0, 16·kChunks) = alpha[r] · o[r] + probs[r] · V for kRows rows.
// probs: [rows][probs_stride] over `keys` keys; v: packed [keys/g][head_dim][g], already offset
// to the first lane of this tile; o: [rows][head_dim] f32.
template <class Kernel, int kRows, int kChunks>
void value_tile(const typename Kernel::Elem* probs, int64_t probs_stride, const typename Kernel::Elem* v,
                int64_t head_dim, int64_t keys, float* o, const float* alpha) {
  constexpr int64_t g = Kernel::kGroup;
  __m512 acc[kRows][kChunks];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
    for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * head_dim + 16 * c), a);
  }
  for (int64_t p = 0; p < keys / g; ++p) {
    typename Kernel::Operand vc[kChunks];
#pragma GCC unroll 4
    for (int c = 0; c < kChunks; ++c) vc[c] = Kernel::load(v + (p * head_dim + 16 * c) * g);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const auto b = Kernel::broadcast(probs + r * probs_stride + p * g);
#pragma GCC unroll 4
      for (int c = 0; c < kChunks; ++c) acc[r][c] = Kernel::multiply_add(acc[r][c], b, vc[c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < kChunks; ++c) _mm512_storeu_ps(o + r * head_dim + 16 * c, acc[r][c]);
  }
}

// Bit j set when key key0 + j (j < 32) is below `limit`.
uint32_t keys_below(int64_t limit, int64_t key0) {
  const int64_t n = limit - key0;
  if (n >= 32) return ~0u;
  if (n <= 0) return 0u;
  return (1u << n) - 1u;
}

// Online-softmax update of one query row with one key block of scores (base-2 logits).
// Masks the invisible keys, updates the running max and sum, writes the block's probabilities
// (relative to the new max) and returns the factor that rescales the row's accumulator.
template <class Kernel>
float softmax_row(float* s, int64_t keys, int64_t key0, int64_t limit, const uint32_t* attend_bits, float& row_max,
                  float& row_sum, typename Kernel::Elem* probs) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 vmax = neg_inf;
  for (int64_t c = 0; c < keys; c += kKeyTile) {
    uint32_t visible = keys_below(limit, key0 + c);
    if (attend_bits != nullptr) visible &= attend_bits[(key0 + c) / kKeyTile];
    __m512 lo = _mm512_loadu_ps(s + c), hi = _mm512_loadu_ps(s + c + 16);
    if (visible != ~0u) {
      lo = _mm512_mask_mov_ps(neg_inf, static_cast<__mmask16>(visible), lo);
      hi = _mm512_mask_mov_ps(neg_inf, static_cast<__mmask16>(visible >> 16), hi);
      _mm512_storeu_ps(s + c, lo);
      _mm512_storeu_ps(s + c + 16, hi);
    }
    vmax = _mm512_max_ps(vmax, _mm512_max_ps(lo, hi));
  }
  const float new_max = std::max(row_max, _mm512_reduce_max_ps(vmax));
  if (new_max == kNegInf) {  // nothing visible yet: the row stays empty
    std::memset(probs, 0, static_cast<size_t>(keys) * sizeof(*probs));
    return 1.0f;
  }
  const float alpha = std::exp2(row_max - new_max);  // 0 when the row was empty
  const __m512 shift = _mm512_set1_ps(new_max);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c = 0; c < keys; c += kKeyTile) {
    const __m512 lo = cpu::exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + c), shift));
    const __m512 hi = cpu::exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + c + 16), shift));
    sum = _mm512_add_ps(sum, _mm512_add_ps(lo, hi));
    Kernel::store_probabilities(probs + c, lo, hi);
  }
  row_sum = row_sum * alpha + _mm512_reduce_add_ps(sum);
  row_max = new_max;
  return alpha;
}

// dst[0, n) = o[0, n) · factor, rounded to the output dtype (bf16: exactly as xdit::f32_to_bf16).
template <class Elem>
void store_row(const float* o, float factor, int64_t n, Elem* dst) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t d = 0; d < n; d += cpu::kLanes) {
    cpu::store16(dst + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), f), cpu::first_lanes(n - d));
  }
}

// Problem geometry shared by every task of one call.
struct Geometry {
  int64_t batch, q_len, heads, kv_len, kv_heads, head_dim;
  int64_t padded_dim;     // head_dim rounded up to kHeadDimAlign
  int64_t padded_kv_len;  // kv_len rounded up to kKeyTile
  int64_t query_block, key_block;
  int64_t query_blocks, key_blocks;
  float factor;  // scale · log2(e): scores in base 2
  bool causal;
};

template <class Kernel>
struct Views {
  using Elem = typename Kernel::Elem;
  const Elem* q;
  const Elem* k;
  const Elem* v;
  Shape q_strides, k_strides, v_strides;
  Elem* out;   // [B, Sq, H, D] contiguous
  float* lse;  // [B, H, Sq] or null
};

// Transposes a 16 × 16 block of 32-bit units in place: on return r[c] holds column c.
void transpose_16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4n + c], 128-bit lane L: column 4L + c of rows 4n .. 4n+3.
  __m512i u[16];
  for (int n = 0; n < 16; n += 4) {
    u[n] = _mm512_unpacklo_epi64(t[n], t[n + 2]);
    u[n + 1] = _mm512_unpackhi_epi64(t[n], t[n + 2]);
    u[n + 2] = _mm512_unpacklo_epi64(t[n + 1], t[n + 3]);
    u[n + 3] = _mm512_unpackhi_epi64(t[n + 1], t[n + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i rows01_low = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i rows01_high = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i rows23_low = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i rows23_high = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(rows01_low, rows23_low, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(rows01_low, rows23_low, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(rows01_high, rows23_high, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(rows01_high, rows23_high, 0xdd);
  }
}

// Scatters up to 16 rows of head_dim elements into the unit-major layout the score tile reads:
// unit u (a bf16 pair or an f32) of row i goes to dst[u · unit_stride + i] (counted in units),
// for the padded_dim/g units of a row. Missing rows (null) and the head-dim padding are zero;
// `lanes` selects which of the 16 rows are stored.
template <class Kernel>
void pack_units(const typename Kernel::Elem* const rows[16], int64_t head_dim, int64_t padded_dim,
                typename Kernel::Elem* dst, int64_t unit_stride, __mmask16 lanes) {
  constexpr int64_t g = Kernel::kGroup;
  const int64_t units = padded_dim / g;
  for (int64_t u0 = 0; u0 < units; u0 += 16) {
    __m512i block[16];
    for (int i = 0; i < 16; ++i) {
      block[i] = rows[i] != nullptr ? Kernel::load_units(rows[i] + u0 * g, head_dim - u0 * g) : _mm512_setzero_si512();
    }
    transpose_16x16(block);
    for (int64_t c = 0; c < std::min<int64_t>(16, units - u0); ++c) {
      _mm512_mask_storeu_epi32(dst + (u0 + c) * unit_stride * g, lanes, block[c]);
    }
  }
}

// Packs keys [tile·32, tile·32 + 32) of one (batch, kv head) into both packed layouts, zero-filling
// the head-dim padding and the keys past the end. bf16 V interleaves rows j and j+1 lane by lane.
template <class Kernel>
void pack_kv_tile(const Views<Kernel>& in, const Geometry& g, int64_t b, int64_t kv_head, int64_t tile,
                  typename Kernel::Elem* k_packed, typename Kernel::Elem* v_packed) {
  using Elem = typename Kernel::Elem;
  constexpr int64_t group = Kernel::kGroup;
  const int64_t dp = g.padded_dim;
  Elem* k_dst = k_packed + tile * kKeyTile * dp;
  Elem* v_dst = v_packed + tile * kKeyTile * dp;
  std::memset(v_dst, 0, static_cast<size_t>(kKeyTile * dp) * sizeof(Elem));
  const int64_t keys = std::min(kKeyTile, g.kv_len - tile * kKeyTile);
  auto row = [&](const Elem* base, const Shape& strides, int64_t j) {
    return base + b * strides[0] + (tile * kKeyTile + j) * strides[1] + kv_head * strides[2];
  };

  for (int64_t half = 0; half < 2; ++half) {
    const Elem* k_rows[16];
    for (int64_t i = 0; i < 16; ++i)
      k_rows[i] = half * 16 + i < keys ? row(in.k, in.k_strides, half * 16 + i) : nullptr;
    pack_units<Kernel>(k_rows, g.head_dim, dp, k_dst + half * 16 * group, kKeyTile, 0xffff);
  }

  if constexpr (group == 1) {
    for (int64_t j = 0; j < keys; ++j) {
      std::memcpy(v_dst + j * dp, row(in.v, in.v_strides, j), static_cast<size_t>(g.head_dim) * sizeof(Elem));
    }
  } else {
    // Lane i of the result takes element i/2 of row j (i even) or of row j+1 (i odd).
    static constexpr auto interleave = [] {
      std::array<uint16_t, 64> index{};
      for (uint16_t i = 0; i < 32; ++i) {
        index[i] = static_cast<uint16_t>((i % 2) * 32 + i / 2);
        index[32 + i] = static_cast<uint16_t>((i % 2) * 32 + 16 + i / 2);
      }
      return index;
    }();
    const __m512i low_half = _mm512_loadu_si512(interleave.data());
    const __m512i high_half = _mm512_loadu_si512(interleave.data() + 32);
    for (int64_t j = 0; j < keys; j += 2) {
      const Elem* even = row(in.v, in.v_strides, j);
      const Elem* odd = j + 1 < keys ? row(in.v, in.v_strides, j + 1) : nullptr;
      for (int64_t d = 0; d < g.head_dim; d += 32) {
        const __mmask32 lanes = g.head_dim - d >= 32 ? ~0u : (1u << (g.head_dim - d)) - 1u;
        const __m512i a = _mm512_maskz_loadu_epi16(lanes, even + d);
        const __m512i c = odd != nullptr ? _mm512_maskz_loadu_epi16(lanes, odd + d) : _mm512_setzero_si512();
        Elem* dst = v_dst + ((j / 2) * dp + d) * 2;
        _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, low_half, c));
        if (d + 16 < dp) _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(a, high_half, c));
      }
    }
  }
}

// Per-thread scratch of one task.
template <class Kernel>
struct Scratch {
  using Elem = typename Kernel::Elem;
  Elem* q;        // [query_block / kScoreRows][padded_dim / g][kScoreRows][g]
  float* scores;  // [query_block][key_block]
  Elem* probs;    // [query_block][key_block]
  float* acc;     // [query_block][padded_dim]
  float* row_max;
  float* row_sum;
  float* alpha;

  static size_t bytes(const Geometry& g) {
    const size_t qb = static_cast<size_t>(g.query_block);
    return aligned(qb * g.padded_dim * sizeof(Elem)) + aligned(qb * g.key_block * sizeof(float)) +
           aligned(qb * g.key_block * sizeof(Elem)) + aligned(qb * g.padded_dim * sizeof(float)) +
           3 * aligned(qb * sizeof(float));
  }
  static size_t aligned(size_t n) { return (n + kHostAlignment - 1) / kHostAlignment * kHostAlignment; }

  Scratch(char* base, const Geometry& g) {
    const size_t qb = static_cast<size_t>(g.query_block);
    q = take<Elem>(base, qb * g.padded_dim);
    scores = take<float>(base, qb * g.key_block);
    probs = take<Elem>(base, qb * g.key_block);
    acc = take<float>(base, qb * g.padded_dim);
    row_max = take<float>(base, qb);
    row_sum = take<float>(base, qb);
    alpha = take<float>(base, qb);
  }
  template <class T>
  static T* take(char*& base, size_t count) {
    T* p = reinterpret_cast<T*>(base);
    base += aligned(count * sizeof(T));
    return p;
  }
};

// acc = alpha · acc + probs · V for kRows rows over the whole head dim.
template <class Kernel, int kRows>
void value_rows(const Geometry& g, const Scratch<Kernel>& sc, const typename Kernel::Elem* v_block, int64_t keys,
                int64_t row0) {
  const int64_t dp = g.padded_dim;
  const auto* probs = sc.probs + row0 * g.key_block;
  float* acc = sc.acc + row0 * dp;
  const float* alpha = sc.alpha + row0;
  constexpr int64_t group = Kernel::kGroup;
  int64_t d0 = 0;
  for (; d0 + kValueLanes <= dp; d0 += kValueLanes) {
    value_tile<Kernel, kRows, 4>(probs, g.key_block, v_block + d0 * group, dp, keys, acc + d0, alpha);
  }
  const auto* v_rest = v_block + d0 * group;
  switch ((dp - d0) / 16) {  // the last 16, 32 or 48 lanes of the head dim
    case 3:
      value_tile<Kernel, kRows, 3>(probs, g.key_block, v_rest, dp, keys, acc + d0, alpha);
      break;
    case 2:
      value_tile<Kernel, kRows, 2>(probs, g.key_block, v_rest, dp, keys, acc + d0, alpha);
      break;
    case 1:
      value_tile<Kernel, kRows, 1>(probs, g.key_block, v_rest, dp, keys, acc + d0, alpha);
      break;
    default:
      break;
  }
}

// One task: query rows [qb·query_block, +query_block) of head `head` in batch `b`.
template <class Kernel>
void attend_block(const Views<Kernel>& in, const Geometry& g, const Scratch<Kernel>& sc, int64_t b, int64_t head,
                  int64_t qb, const typename Kernel::Elem* k_packed, const typename Kernel::Elem* v_packed,
                  const uint32_t* attend_bits) {
  using Elem = typename Kernel::Elem;
  const int64_t dp = g.padded_dim, rows = g.query_block;
  const int64_t row0 = qb * rows;
  const int64_t valid_rows = std::min(rows, g.q_len - row0);
  const int64_t causal_offset = g.kv_len - g.q_len;

  for (int64_t r0 = 0; r0 < rows; r0 += kScoreRows) {
    const Elem* q_rows[16] = {};
    for (int64_t i = 0; i < kScoreRows && r0 + i < valid_rows; ++i) {
      q_rows[i] = in.q + b * in.q_strides[0] + (row0 + r0 + i) * in.q_strides[1] + head * in.q_strides[2];
    }
    pack_units<Kernel>(q_rows, g.head_dim, dp, sc.q + r0 * dp, kScoreRows, (1u << kScoreRows) - 1u);
  }
  std::fill_n(sc.row_max, rows, kNegInf);
  std::fill_n(sc.row_sum, rows, 0.0f);
  std::memset(sc.acc, 0, static_cast<size_t>(rows * dp) * sizeof(float));

  int64_t key_blocks = g.key_blocks;
  if (g.causal) {
    const int64_t last_key = row0 + valid_rows - 1 + causal_offset;  // the last key any row sees
    key_blocks = last_key < 0 ? 0 : std::min(key_blocks, last_key / g.key_block + 1);
  }
  for (int64_t kb = 0; kb < key_blocks; ++kb) {
    const int64_t key0 = kb * g.key_block;
    const int64_t keys = std::min(g.key_block, g.padded_kv_len - key0);
    if (attend_bits != nullptr && std::none_of(attend_bits + key0 / kKeyTile, attend_bits + (key0 + keys) / kKeyTile,
                                               [](uint32_t bits) { return bits != 0; })) {
      continue;  // every key of this block is padding
    }
    for (int64_t r = 0; r < rows; r += kScoreRows) {
      for (int64_t t = 0; t < keys; t += kKeyTile) {
        score_tile<Kernel, kScoreRows>(sc.q + r * dp, dp, k_packed + (key0 + t) * dp, g.factor,
                                       sc.scores + r * g.key_block + t, g.key_block);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t limit = g.causal ? std::min(g.kv_len, row0 + r + causal_offset + 1) : g.kv_len;
      sc.alpha[r] = softmax_row<Kernel>(sc.scores + r * g.key_block, keys, key0, limit, attend_bits, sc.row_max[r],
                                        sc.row_sum[r], sc.probs + r * g.key_block);
    }
    const Elem* v_block = v_packed + key0 * dp;
    for (int64_t r = 0; r < rows; r += kValueRows) value_rows<Kernel, kValueRows>(g, sc, v_block, keys, r);
  }

  for (int64_t r = 0; r < valid_rows; ++r) {
    const float sum = sc.row_sum[r];
    Elem* dst = in.out + ((b * g.q_len + row0 + r) * g.heads + head) * g.head_dim;
    store_row(sc.acc + r * dp, sum > 0.0f ? 1.0f / sum : 0.0f, g.head_dim, dst);
    if (in.lse != nullptr) {
      in.lse[(b * g.heads + head) * g.q_len + row0 + r] =
          sum > 0.0f ? static_cast<float>((static_cast<double>(sc.row_max[r]) + std::log2(static_cast<double>(sum))) *
                                          std::numbers::ln2)
                     : kNegInf;
    }
  }
}

template <class Kernel>
void run_attention(const Views<Kernel>& in, const Geometry& g, const Tensor& key_padding_mask) {
  using Elem = typename Kernel::Elem;
  // The padding mask as one bit per key, 32 keys a word, bits past Skv clear.
  std::vector<uint32_t> attend_bits;
  const int64_t words = g.padded_kv_len / kKeyTile;
  if (key_padding_mask.defined()) {
    attend_bits.assign(static_cast<size_t>(g.batch * words), 0u);
    const auto* mask = key_padding_mask.data<int32_t>();
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t j = 0; j < g.kv_len; ++j) {
        if (mask[b * key_padding_mask.stride(0) + j * key_padding_mask.stride(1)] != 0)
          attend_bits[b * words + j / kKeyTile] |= 1u << (j % kKeyTile);
      }
    }
  }

  // (batch, kv head) groups are packed and processed in chunks that bound the packed memory.
  const int64_t groups = g.batch * g.kv_heads;
  const int64_t heads_per_group = g.heads / g.kv_heads;
  const size_t group_elems = static_cast<size_t>(g.padded_kv_len * g.padded_dim);
  const size_t group_bytes = std::max<size_t>(1, 2 * group_elems * sizeof(Elem));
  const int64_t chunk = std::clamp<int64_t>(static_cast<int64_t>(kPackBudgetBytes / group_bytes), 1, groups);
  const int64_t tiles = words;

  const int64_t tasks_per_group = heads_per_group * g.query_blocks;
  const int threads = static_cast<int>(std::clamp<int64_t>(chunk * tasks_per_group, 1, num_threads()));
  const size_t scratch_bytes = Scratch<Kernel>::bytes(g);
  const std::shared_ptr<void> scratch_memory = allocate_host(scratch_bytes * static_cast<size_t>(threads));
  const std::shared_ptr<void> packed_memory =
      allocate_host(2 * group_elems * sizeof(Elem) * static_cast<size_t>(chunk));
  Elem* const k_packed = static_cast<Elem*>(packed_memory.get());
  Elem* const v_packed = k_packed + group_elems * static_cast<size_t>(chunk);

#pragma omp parallel num_threads(threads)
  {
    const Scratch<Kernel> sc(static_cast<char*>(scratch_memory.get()) + scratch_bytes * omp_get_thread_num(), g);
    for (int64_t first = 0; first < groups; first += chunk) {
      const int64_t count = std::min(chunk, groups - first);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < count * tiles; ++i) {
        const int64_t local = i / tiles, group = first + local;
        pack_kv_tile(in, g, group / g.kv_heads, group % g.kv_heads, i % tiles, k_packed + local * group_elems,
                     v_packed + local * group_elems);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < count * tasks_per_group; ++task) {
        const int64_t local = task / tasks_per_group, group = first + local;
        const int64_t b = group / g.kv_heads, kv_head = group % g.kv_heads;
        const int64_t head = kv_head * heads_per_group + (task % tasks_per_group) / g.query_blocks;
        // Causal: the last query blocks see the most keys, so they go first to balance the tail.
        const int64_t qb = g.causal ? g.query_blocks - 1 - task % g.query_blocks : task % g.query_blocks;
        attend_block(in, g, sc, b, head, qb, k_packed + local * group_elems, v_packed + local * group_elems,
                     attend_bits.empty() ? nullptr : attend_bits.data() + b * words);
      }
    }
  }
}

template <class Kernel>
void dispatch(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params, const Geometry& g,
              AttentionResult& result) {
  using Elem = typename Kernel::Elem;
  const Views<Kernel> in{q.data<Elem>(),
                         k.data<Elem>(),
                         v.data<Elem>(),
                         q.strides(),
                         k.strides(),
                         v.strides(),
                         result.out.data<Elem>(),
                         result.lse.defined() ? result.lse.data<float>() : nullptr};
  run_attention<Kernel>(in, g, params.key_padding_mask);
}

}  // namespace

AttentionResult CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionParams& params) {
  Geometry g{};
  g.batch = q.size(0);
  g.q_len = q.size(1);
  g.heads = q.size(2);
  g.head_dim = q.size(3);
  g.kv_len = k.size(1);
  g.kv_heads = k.size(2);
  g.padded_dim = round_up(g.head_dim, kHeadDimAlign);
  g.padded_kv_len = round_up(g.kv_len, kKeyTile);
  g.query_block = std::min(kQueryBlock, round_up(std::max<int64_t>(g.q_len, 1), kRowGranule));
  g.key_block = std::min(kKeyBlock, std::max(g.padded_kv_len, kKeyTile));
  g.query_blocks = (g.q_len + g.query_block - 1) / g.query_block;
  g.key_blocks = (g.padded_kv_len + g.key_block - 1) / g.key_block;
  const float scale = params.scale != 0.0f ? params.scale : static_cast<float>(1.0 / std::sqrt(double(g.head_dim)));
  g.factor = static_cast<float>(static_cast<double>(scale) * std::numbers::log2e);
  g.causal = params.causal;

  AttentionResult result;
  result.out = Tensor::empty({g.batch, g.q_len, g.heads, g.head_dim}, q.dtype(), q.device());
  if (params.return_lse) result.lse = Tensor::empty({g.batch, g.heads, g.q_len}, DType::F32, q.device());
  if (g.batch == 0 || g.q_len == 0 || g.heads == 0) return result;

  if (q.dtype() == DType::BF16) {
    dispatch<Bf16Kernel>(q, k, v, params, g, result);
  } else {
    dispatch<F32Kernel>(q, k, v, params, g, result);
  }
  return result;
}

}  // namespace xdit
