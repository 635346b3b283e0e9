#include "kernels/cpu/decode_pack.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace tost::kernels::cpu {
namespace {

at::ScalarType StoredScalarType(PackedType type) {
  switch (type) {
    case PackedType::kFloat32:
      return at::kFloat;
    case PackedType::kBFloat16:
      return at::kBFloat16;
    case PackedType::kFloat16:
      return at::kHalf;
    case PackedType::kInt8:
      return at::kChar;
  }
  return at::kFloat;
}

}  // namespace

Int8Rows QuantiseInt8PerRow(const at::Tensor& weight) {
  const at::Tensor w = weight.to(at::kFloat);
  Int8Rows q;
  q.scale = w.abs().amax({1}).div_(127).clamp_min_(1e-30).contiguous();
  q.values = w.div(q.scale.unsqueeze(1)).round_().clamp_(-127, 127).to(at::kChar).contiguous();
  return q;
}

PackedWeights PackWeights(const at::Tensor& weight, const at::Tensor& bias, PackedType type,
                          int64_t group) {
  TORCH_CHECK(weight.dim() == 2, "lean decode: expected a weight [out, in], got ", weight.sizes());
  TORCH_CHECK(group == 1 || (group == 2 && type == PackedType::kBFloat16) ||
                  (group == 4 && type == PackedType::kInt8),
              "lean decode: expected input groups of 1, 2 (bfloat16) or 4 (int8), got ", group,
              " for packed type ", static_cast<int>(type));
  PackedWeights p;
  PackedMatrix& m = p.matrix;
  m.type = type;
  m.out = weight.size(0);
  m.in = weight.size(1);
  m.group = group;
  const int64_t padded_out = m.panels() * kPanelWidth, padded_in = m.groups() * group;
  at::Tensor values;
  if (type == PackedType::kInt8) {
    Int8Rows q = QuantiseInt8PerRow(weight);
    values = q.values;
    p.scale = at::constant_pad_nd(q.scale, {0, padded_out - m.out}, 1.0).contiguous();
    m.scale = p.scale.const_data_ptr<float>();
  } else {
    values = weight.to(StoredScalarType(type));
  }
  // Zero rows up to a whole panel and zero columns up to whole groups, then
  // [panels, kPanelWidth, groups, group] → [panels, groups, kPanelWidth, group].
  values = at::constant_pad_nd(values.to(at::kFloat), {0, padded_in - m.in, 0, padded_out - m.out});
  p.data = values.view({m.panels(), kPanelWidth, m.groups(), group})
               .permute({0, 2, 1, 3})
               .contiguous()
               .to(StoredScalarType(type));
  m.data = p.data.const_data_ptr();
  if (type == PackedType::kInt8 && group == 4) {
    p.zero_point_sums = values.sum(1).mul_(128).to(at::kInt).contiguous();
    m.zero_point_sums = p.zero_point_sums.const_data_ptr<int32_t>();
  }
  if (bias.defined()) {
    p.bias = at::constant_pad_nd(bias.to(at::kFloat), {0, padded_out - m.out}).contiguous();
    m.bias = p.bias.const_data_ptr<float>();
  }
  return p;
}

}  // namespace tost::kernels::cpu
