#include "model/decoder.h"

#include "model/architecture.h"

namespace zest::model {

Result<DecoderWeights> collect_decoder_weights(const io::SafeTensors& st, const io::ModelConfig& mc) {
  DecoderWeights w;
  w.config = mc.text;
  const io::TextConfig& c = w.config;
  const std::string p = architecture(mc.arch).text_prefix;
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  ZEST_ASSIGN_OR_RETURN(w.embed, st.get(p + "embed_tokens.weight", {c.vocab_size, H}));
  ZEST_ASSIGN_OR_RETURN(w.final_norm, st.get(p + "norm.weight", {H}));
  if (c.tie_word_embeddings && !st.contains("lm_head.weight")) {
    w.lm_head = w.embed;
  } else {
    ZEST_ASSIGN_OR_RETURN(w.lm_head, st.get("lm_head.weight", {c.vocab_size, H}));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string lp = p + "layers." + std::to_string(l) + ".";
    DecoderLayerWeights L;
    ZEST_ASSIGN_OR_RETURN(L.in_norm, st.get(lp + "input_layernorm.weight", {H}));
    ZEST_ASSIGN_OR_RETURN(L.post_norm, st.get(lp + "post_attention_layernorm.weight", {H}));
    ZEST_ASSIGN_OR_RETURN(L.q, st.get(lp + "self_attn.q_proj.weight", {nh * hd, H}));
    ZEST_ASSIGN_OR_RETURN(L.k, st.get(lp + "self_attn.k_proj.weight", {nkv * hd, H}));
    ZEST_ASSIGN_OR_RETURN(L.v, st.get(lp + "self_attn.v_proj.weight", {nkv * hd, H}));
    ZEST_ASSIGN_OR_RETURN(L.o, st.get(lp + "self_attn.o_proj.weight", {H, nh * hd}));
    ZEST_ASSIGN_OR_RETURN(L.q_norm, st.get(lp + "self_attn.q_norm.weight", {hd}));
    ZEST_ASSIGN_OR_RETURN(L.k_norm, st.get(lp + "self_attn.k_norm.weight", {hd}));
    L.moe = mc.is_moe() && c.is_moe_layer(l);
    if (L.moe) {
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      ZEST_ASSIGN_OR_RETURN(L.router, st.get(lp + "mlp.gate.weight", {E, H}));
      if (st.contains(lp + "mlp.experts.gate_up_proj")) {
        ZEST_ASSIGN_OR_RETURN(L.fused_gate_up, st.get(lp + "mlp.experts.gate_up_proj", {E, H, 2 * I}));
        ZEST_ASSIGN_OR_RETURN(L.fused_down, st.get(lp + "mlp.experts.down_proj", {E, I, H}));
      } else {
        for (int64_t e = 0; e < E; ++e) {
          const std::string ep = lp + "mlp.experts." + std::to_string(e) + ".";
          ZEST_ASSIGN_OR_RETURN(io::TensorView g, st.get(ep + "gate_proj.weight", {I, H}));
          ZEST_ASSIGN_OR_RETURN(io::TensorView u, st.get(ep + "up_proj.weight", {I, H}));
          ZEST_ASSIGN_OR_RETURN(io::TensorView d, st.get(ep + "down_proj.weight", {H, I}));
          L.gate.push_back(std::move(g));
          L.up.push_back(std::move(u));
          L.down.push_back(std::move(d));
        }
      }
    } else {
      const int64_t I = c.intermediate_size;
      ZEST_ASSIGN_OR_RETURN(io::TensorView g, st.get(lp + "mlp.gate_proj.weight", {I, H}));
      ZEST_ASSIGN_OR_RETURN(io::TensorView u, st.get(lp + "mlp.up_proj.weight", {I, H}));
      ZEST_ASSIGN_OR_RETURN(io::TensorView d, st.get(lp + "mlp.down_proj.weight", {H, I}));
      L.gate.push_back(std::move(g));
      L.up.push_back(std::move(u));
      L.down.push_back(std::move(d));
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace zest::model
