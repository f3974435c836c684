#include "model/weights.h"

namespace zest::model {

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
