#include "model/weights.h"

namespace zest::model {

Result<Tensor> load_f32(const io::SafeTensors& st, const std::string& name, const std::vector<int64_t>& shape) {
  ZEST_ASSIGN_OR_RETURN(io::TensorView v, st.get(name, shape));
  return v.to_f32();
}

Tensor transpose_2d(const Tensor& m) {
  const int64_t r = m.dim(0), c = m.dim(1);
  Tensor t = Tensor::empty({c, r});
  const float* s = m.data<float>();
  float* d = t.data<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) d[j * r + i] = s[i * c + j];
  return t;
}

}  // namespace zest::model
