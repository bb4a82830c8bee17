// conv2d and causal_conv3d on oneDNN convolution primitives. oneDNN picks the layouts it runs
// fastest (format_tag::any: channels-last activations, blocked weights); the input (any strides)
// and the weight are reordered into them and the result reordered back. The result is contiguous
// NCHW / NCDHW, except that a channels-last input (an NHWC / NDHWC buffer viewed as NCHW / NCDHW)
// gives a channels-last result: a decoder that keeps its activations channels-last then runs
// without any activation reorders. Primitives and reorders are cached per problem.
#include <algorithm>
#include <optional>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/backend/cpu/dnnl_context.h"

namespace xdit {

namespace {

using dnnl::memory;

// A forward convolution of x [N, C, spatial...] with weight [O, C/groups, kernel...] into a
// contiguous [N, O, out spatial...]. Spatial parameters use oneDNN's conventions (dilation 0 is
// a dense kernel; padding may differ on the two sides).
struct ConvProblem {
  DType dtype = DType::F32;
  Shape src_shape, src_strides;
  Shape weight_shape, weight_strides;
  Shape dst_shape, dst_strides;
  int64_t groups = 1;
  bool has_bias = false;
  DType bias_dtype = DType::F32;
  Shape stride, dilation, padding_front, padding_back;
};

struct ConvEntry {
  dnnl::convolution_forward conv;
  memory::desc src, weights, bias, dst, scratchpad;  // the layouts the convolution runs on
  memory::desc user_src, user_weights, user_dst;
  // Reorders between the caller's layouts and the convolution's, absent where they agree.
  std::optional<dnnl::reorder> src_reorder, weights_reorder, dst_reorder;
  memory::desc src_reorder_scratchpad, weights_reorder_scratchpad, dst_reorder_scratchpad;
};

memory::desc any_desc(const Shape& shape, DType dtype) {
  return memory::desc(cpu::dnnl_dims(shape), cpu::dnnl_dtype(dtype), memory::format_tag::any);
}

// The weight as oneDNN expects it: grouped convolutions take [groups, O/groups, C/groups, k...].
memory::desc user_weight_desc(const ConvProblem& p) {
  if (p.groups == 1) return cpu::strided_desc(p.weight_shape, p.weight_strides, p.dtype);
  Shape shape = p.weight_shape, strides = p.weight_strides;
  shape[0] /= p.groups;
  shape.insert(shape.begin(), p.groups);
  strides.insert(strides.begin(), shape[1] * strides[0]);
  return cpu::strided_desc(shape, strides, p.dtype);
}

void add_reorder(const memory::desc& from, const memory::desc& to, std::optional<dnnl::reorder>& reorder,
                 memory::desc& scratchpad) {
  if (from == to) return;
  const dnnl::reorder::primitive_desc pd(cpu::dnnl_engine(), from, cpu::dnnl_engine(), to,
                                         cpu::user_scratchpad_attr());
  scratchpad = pd.scratchpad_desc();
  reorder.emplace(pd);
}

ConvEntry build_conv(const ConvProblem& p) {
  ConvEntry e;
  e.user_src = cpu::strided_desc(p.src_shape, p.src_strides, p.dtype);
  e.user_weights = user_weight_desc(p);
  e.user_dst = cpu::strided_desc(p.dst_shape, p.dst_strides, p.dtype);
  const memory::desc bias = p.has_bias ? cpu::strided_desc({p.dst_shape[1]}, {1}, p.bias_dtype) : memory::desc();

  dnnl::convolution_forward::primitive_desc pd;
  try {
    const dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_desc(p.src_shape, p.dtype),
        memory::desc(e.user_weights.dims(), cpu::dnnl_dtype(p.dtype), memory::format_tag::any), bias,
        any_desc(p.dst_shape, p.dtype), cpu::dnnl_dims(p.stride), cpu::dnnl_dims(p.dilation),
        cpu::dnnl_dims(p.padding_front), cpu::dnnl_dims(p.padding_back));
    pd = dnnl::convolution_forward::primitive_desc(desc, cpu::user_scratchpad_attr(), cpu::dnnl_engine());
  } catch (const dnnl::error& error) {
    fail("oneDNN has no convolution of ", shape_str(p.src_shape), " by ", shape_str(p.weight_shape), " (",
         dtype_name(p.dtype), "): ", error.what());
  }
  e.src = pd.src_desc();
  e.weights = pd.weights_desc();
  e.bias = pd.bias_desc();
  e.dst = pd.dst_desc();
  e.scratchpad = pd.scratchpad_desc();
  e.conv = dnnl::convolution_forward(pd);
  add_reorder(e.user_src, e.src, e.src_reorder, e.src_reorder_scratchpad);
  add_reorder(e.user_weights, e.weights, e.weights_reorder, e.weights_reorder_scratchpad);
  add_reorder(e.dst, e.user_dst, e.dst_reorder, e.dst_reorder_scratchpad);
  return e;
}

cpu::PrimitiveCache<ConvEntry>& conv_cache() {
  static cpu::PrimitiveCache<ConvEntry> cache;
  return cache;
}

// The operand in the convolution's layout: the caller's memory itself, or a reordered copy.
dnnl::memory conv_operand(const memory::desc& user, const memory::desc& conv, const void* data,
                          const std::optional<dnnl::reorder>& reorder, const memory::desc& reorder_scratchpad,
                          std::vector<std::shared_ptr<void>>& keep_alive) {
  const dnnl::memory user_memory = cpu::wrap_memory(user, data);
  if (!reorder) return user_memory;
  cpu::OwnedMemory converted = cpu::allocate_memory(conv);
  cpu::execute(*reorder, reorder_scratchpad, {{DNNL_ARG_FROM, user_memory}, {DNNL_ARG_TO, converted.memory}});
  keep_alive.push_back(std::move(converted.owner));
  return converted.memory;
}

void run_conv(const ConvProblem& p, const void* src, const void* weight, const void* bias, void* dst) {
  cpu::PrimitiveKey key;
  key.add(static_cast<int64_t>(p.dtype))
      .add(p.src_shape)
      .add(p.src_strides)
      .add(p.weight_shape)
      .add(p.weight_strides)
      .add(p.dst_strides)
      .add(p.groups)
      .add(p.has_bias ? 1 + static_cast<int64_t>(p.bias_dtype) : 0)
      .add(p.stride)
      .add(p.dilation)
      .add(p.padding_front)
      .add(p.padding_back);
  const auto e = conv_cache().get(key, [&] { return build_conv(p); });

  std::vector<std::shared_ptr<void>> keep_alive;
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, conv_operand(e->user_src, e->src, src, e->src_reorder, e->src_reorder_scratchpad, keep_alive)},
      {DNNL_ARG_WEIGHTS, conv_operand(e->user_weights, e->weights, weight, e->weights_reorder,
                                      e->weights_reorder_scratchpad, keep_alive)},
  };
  if (p.has_bias) args.emplace(DNNL_ARG_BIAS, cpu::wrap_memory(e->bias, bias));
  const dnnl::memory user_dst = cpu::wrap_memory(e->user_dst, dst);
  if (!e->dst_reorder) {
    args.emplace(DNNL_ARG_DST, user_dst);
    cpu::execute(e->conv, e->scratchpad, std::move(args));
    return;
  }
  const cpu::OwnedMemory conv_dst = cpu::allocate_memory(e->dst);
  args.emplace(DNNL_ARG_DST, conv_dst.memory);
  cpu::execute(e->conv, e->scratchpad, std::move(args));
  cpu::execute(*e->dst_reorder, e->dst_reorder_scratchpad, {{DNNL_ARG_FROM, conv_dst.memory}, {DNNL_ARG_TO, user_dst}});
}

// The dims of an [N, C, spatial...] tensor from outermost to innermost in a channels-last buffer.
std::vector<int64_t> channels_last_order(int64_t dims) {
  std::vector<int64_t> order{0};
  for (int64_t d = 2; d < dims; ++d) order.push_back(d);
  order.push_back(1);
  return order;
}

// True for a view of a dense channels-last buffer that is not also plain contiguous.
bool is_channels_last(const Tensor& x) {
  if (x.is_contiguous()) return false;
  int64_t expected = 1;
  const std::vector<int64_t> order = channels_last_order(x.dim());
  for (size_t i = order.size(); i-- > 0;) {
    const int64_t d = order[i];
    if (x.size(d) != 1 && x.stride(d) != expected) return false;
    expected *= x.size(d);
  }
  return true;
}

// A new [N, C, spatial...] tensor laid out like `like`: channels-last if it is, else contiguous.
Tensor empty_like_layout(const Shape& shape, const Tensor& like) {
  if (!is_channels_last(like)) return Tensor::empty(shape, like.dtype());
  const std::vector<int64_t> order = channels_last_order(static_cast<int64_t>(shape.size()));
  Shape stored;
  for (int64_t d : order) stored.push_back(shape[d]);
  std::vector<int64_t> back(order.size());
  for (size_t i = 0; i < order.size(); ++i) back[order[i]] = static_cast<int64_t>(i);
  return Tensor::empty(stored, like.dtype()).permute(back);
}

int64_t output_size(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, int64_t total_padding) {
  return (in + total_padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// A problem over src and weight as they are stored; the caller adds the groups, the spatial
// parameters and dst_shape.
ConvProblem problem_for(const Tensor& src, const Tensor& weight) {
  ConvProblem p;
  p.dtype = src.dtype();
  p.src_shape = src.shape();
  p.src_strides = src.strides();
  p.weight_shape = weight.shape();
  p.weight_strides = weight.strides();
  return p;
}

// Runs `p` (dst_shape set) on src, weight and bias into a new tensor laid out like `like`.
Tensor run_into_new(ConvProblem& p, const Tensor& src, const Tensor& weight, const Tensor& bias, const Tensor& like) {
  Tensor out = empty_like_layout(p.dst_shape, like);
  if (out.numel() == 0) return out;
  p.dst_strides = out.strides();
  const Tensor dense_bias = bias.defined() ? bias.contiguous() : Tensor();
  p.has_bias = bias.defined();
  if (p.has_bias) p.bias_dtype = bias.dtype();
  run_conv(p, src.raw_data(), weight.raw_data(), p.has_bias ? dense_bias.raw_data() : nullptr, out.raw_data());
  return out;
}

}  // namespace

Tensor CpuBackend::conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  ConvProblem p = problem_for(x, weight);
  p.groups = params.groups;
  p.dst_shape = {x.size(0), weight.size(0), 0, 0};
  for (size_t d = 0; d < 2; ++d) {
    p.dst_shape[2 + d] = output_size(x.size(2 + d), weight.size(2 + d), params.stride[d], params.dilation[d],
                                     2 * params.padding[d]);
    p.stride.push_back(params.stride[d]);
    p.dilation.push_back(params.dilation[d] - 1);
    p.padding_front.push_back(params.padding[d]);
    p.padding_back.push_back(params.padding[d]);
  }
  return run_into_new(p, x, weight, bias, x);
}

Tensor CpuBackend::causal_conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& cache,
                                 const CausalConv3dParams& params) {
  // Cached frames stand in for the last front-padding frames; like Wan's CausalConv3d, only as
  // many as the padding has (none when it is 0) are used, the most recent ones.
  const int64_t time_padding = 2 * params.padding[0];
  const int64_t cached = cache.defined() ? std::min(cache.size(2), time_padding) : 0;
  Tensor input = x;
  if (cached > 0) {
    Shape joined = x.shape();
    joined[2] += cached;
    input = empty_like_layout(joined, x);
    input.narrow(2, 0, cached).copy_from(cache.narrow(2, cache.size(2) - cached, cached));
    input.narrow(2, cached, x.size(2)).copy_from(x);
  }

  ConvProblem p = problem_for(input, weight);
  p.stride = {params.stride[0], params.stride[1], params.stride[2]};
  p.dilation = {0, 0, 0};
  p.padding_front = {time_padding - cached, params.padding[1], params.padding[2]};
  p.padding_back = {0, params.padding[1], params.padding[2]};
  p.dst_shape = {x.size(0), weight.size(0), 0, 0, 0};
  for (size_t d = 0; d < 3; ++d) {
    p.dst_shape[2 + d] = output_size(input.size(2 + d), weight.size(2 + d), p.stride[d], 1,
                                     p.padding_front[d] + p.padding_back[d]);
  }
  return run_into_new(p, input, weight, bias, x);
}

}  // namespace xdit
