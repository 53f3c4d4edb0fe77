// Sentence embedding with a sentence-transformers ONNX export: load, compile,
// run, mean-pool the token embeddings over the attention mask, L2-normalize.
//
//   embed_minilm MODEL.onnx [TOKEN_ID ...]
//
// Token ids come from the model's tokenizer (e.g. [CLS] hello world [SEP] is
// 101 7592 2088 102 for the BERT uncased vocabulary).
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <vector>

#include <mlx/mlx.h>
#include <transmuter/transmuter.h>

namespace mx = mlx::core;
namespace tr = transmuter;

// The token embeddings: the first float output of rank 3, [batch, seq, hidden].
mx::array token_embeddings(const tr::Outputs& outputs) {
  for (const tr::Value& v : outputs.values) {
    if (v.is_tensor() && v.tensor().ndim() == 3 && mx::issubdtype(v.tensor().dtype(), mx::floating)) return v.tensor();
  }
  throw tr::Error("the model has no [batch, seq, hidden] float output");
}

// tokens: [batch, seq, hidden], mask: [batch, seq] -> [batch, hidden]
mx::array mean_pool(const mx::array& tokens, const mx::array& mask) {
  mx::array m = mx::expand_dims(mx::astype(mask, tokens.dtype()), -1);
  mx::array summed = mx::sum(mx::multiply(tokens, m), 1);
  mx::array counts = mx::maximum(mx::sum(m, 1), mx::array(1e-9f));
  return mx::divide(summed, counts);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: embed_minilm MODEL.onnx [TOKEN_ID ...]\n";
    return 2;
  }
  std::vector<int64_t> ids;
  for (int i = 2; i < argc; ++i) ids.push_back(std::atoll(argv[i]));
  if (ids.empty()) ids = {101, 7592, 2088, 102};
  int n = static_cast<int>(ids.size());

  try {
    tr::Model model = tr::load(argv[1]);
    tr::Inputs inputs = {{"input_ids", mx::array(ids.data(), {1, n}, mx::int64)},
                         {"attention_mask", mx::ones({1, n}, mx::int64)}};
    for (const tr::ValueInfo& in : model.inputs()) {
      if (in.name == "token_type_ids") inputs[in.name] = mx::zeros({1, n}, mx::int64);
    }
    tr::CompiledModel embed = tr::compile(model, inputs);
    tr::Outputs outputs = embed(inputs);

    mx::array pooled = mean_pool(token_embeddings(outputs), inputs.at("attention_mask").tensor());
    mx::array embedding = mx::divide(pooled, mx::sqrt(mx::sum(mx::square(pooled), -1, true)));
    mx::eval(embedding);

    std::cout << "embedding: " << embedding.shape(1) << " dims, first 8:";
    const float* e = embedding.data<float>();
    for (int i = 0; i < 8 && i < embedding.shape(1); ++i) std::cout << " " << e[i];
    std::cout << "\nnorm: " << mx::sqrt(mx::sum(mx::square(embedding))).item<float>() << "\n";
  } catch (const tr::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
