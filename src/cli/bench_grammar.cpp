// zest bench grammar: the host time of structured output's token masks over a model's whole vocabulary. A JSON
// document that the schema accepts is tokenized with the model's tokenizer and walked token by token, as a guided
// request would write it; at every position the allowed-token mask is computed (the engine does this on its thread
// before each step of a masked row). Twice: over a freshly compiled grammar (every state and transition met for the
// first time) and again over the same one (what later requests with that schema meet: the grammar cache shares it).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/structured_output.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "io/config.h"
#include "text/tokenizer.h"

namespace zest::cli {
namespace {

// An extraction schema of the kind structured output is used for: strings, numbers, an enum, a boolean, an array of
// objects; and a document it accepts, laid out as a model writes JSON (two-space indentation).
constexpr const char* kDefaultSchema = R"json({
  "type": "object",
  "properties": {
    "vendor": {"type": "string"},
    "date": {"type": "string"},
    "currency": {"enum": ["EUR", "USD", "GBP", "JPY"]},
    "items": {"type": "array", "items": {"type": "object", "properties": {
      "name": {"type": "string"}, "quantity": {"type": "integer"}, "price": {"type": "number"}},
      "required": ["name", "quantity", "price"]}},
    "total": {"type": "number"},
    "paid": {"type": "boolean"},
    "note": {"type": ["string", "null"]}
  },
  "required": ["vendor", "date", "currency", "items", "total", "paid"]
})json";
constexpr const char* kDefaultDocument = R"json({
  "vendor": "Corner Bakery & Café, 12 Rue des Lilas",
  "date": "2026-11-28",
  "currency": "EUR",
  "items": [
    {"name": "sourdough loaf", "quantity": 2, "price": 4.5},
    {"name": "croissant", "quantity": 6, "price": 1.35},
    {"name": "coffee beans (250 g)", "quantity": 1, "price": 8.9}
  ],
  "total": 25.99,
  "paid": true,
  "note": "Paid by card; receipt number 000482."
})json";

struct Args {
  std::string model, schema, document;
  int repeat = 5;
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot read '" + path + "'");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

struct PassTimes {
  std::vector<double> us;  // one mask computation per position
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

// One walk over the document's tokens: a mask at every position (and one where only the end may follow).
Result<PassTimes> walk(const std::shared_ptr<grammar::CompiledGrammar>& g, const std::vector<int32_t>& ids) {
  using clock = std::chrono::steady_clock;
  grammar::Matcher m(g);
  PassTimes t;
  for (size_t i = 0; i <= ids.size(); ++i) {
    const auto t0 = clock::now();
    std::shared_ptr<const grammar::TokenMask> mask = m.mask();
    t.us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
    if (!m.status().is_ok()) return m.status();
    if (i == ids.size()) break;
    const int32_t id = ids[i];
    if (!((*mask)[static_cast<size_t>(id) / 32] >> (id % 32) & 1u))
      return invalid_argument("the document's token " + std::to_string(i) + " is not allowed by its mask");
    if (!m.accept(id)) return m.status().with_context("the document's token " + std::to_string(i));
  }
  if (!m.complete()) return invalid_argument("the document ends before the schema allows it to");
  return t;
}

int run_bench(const Args& a) {
  auto cfg = io::load_model_config(a.model);
  if (!cfg.ok()) return fail(cfg.status());
  auto tok = text::Tokenizer::load(a.model);
  if (!tok.ok()) return fail(tok.status());
  std::string schema_text = kDefaultSchema, doc = kDefaultDocument;
  if (!a.schema.empty()) {
    auto s = read_text(a.schema);
    if (!s.ok()) return fail(s.status());
    schema_text = *s;
  }
  if (!a.document.empty()) {
    auto d = read_text(a.document);
    if (!d.ok()) return fail(d.status());
    doc = *d;
  }
  const grammar::Json schema = grammar::Json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return fail(invalid_argument("the schema is not JSON"));

  using clock = std::chrono::steady_clock;
  const int64_t V = cfg->text.vocab_size;
  auto t0 = clock::now();
  std::vector<int32_t> ends;
  for (const char* e : {"<|im_end|>", "<|endoftext|>"})
    if (const int32_t id = tok->token_to_id(e); id >= 0) ends.push_back(id);
  auto vocab = engine::tokenizer_vocab(*tok, V, ends);
  const double vocab_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();

  auto gr = grammar::json_schema_grammar(schema, "schema");
  if (!gr.ok()) return fail(gr.status());
  std::vector<int32_t> ids = tok->encode(doc, /*parse_special=*/false);
  if (!ends.empty()) ids.push_back(ends.front());
  std::printf("vocabulary %lld tokens (trie %zu nodes, built in %.1f ms); document %zu bytes, %zu tokens + end\n",
              static_cast<long long>(V), vocab->byte_.size(), vocab_ms, doc.size(), ids.size() - (ends.empty() ? 0 : 1));
  std::printf("| grammar | masks | mean us | p50 us | p99 us | max us | total ms | states |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int r = 0; r < a.repeat; ++r) {
    t0 = clock::now();
    auto g = grammar::CompiledGrammar::compile(*gr, vocab);
    if (!g.ok()) return fail(g.status());
    const double compile_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    for (const char* pass : {"fresh", "shared"}) {
      auto t = walk(*g, ids);
      if (!t.ok()) return fail(t.status());
      double sum = 0;
      for (double x : t->us) sum += x;
      std::printf("| %s%s | %zu | %.1f | %.1f | %.1f | %.1f | %.2f | %lld |\n", pass,
                  pass[0] == 'f' ? (" (compiled in " + std::to_string(compile_ms).substr(0, 5) + " ms)").c_str() : "",
                  t->us.size(), sum / static_cast<double>(t->us.size()), percentile(t->us, 0.5),
                  percentile(t->us, 0.99), *std::max_element(t->us.begin(), t->us.end()), sum / 1000.0,
                  static_cast<long long>((*g)->states()));
    }
  }
  return 0;
}

}  // namespace

void register_bench_grammar(CLI::App& bench, std::function<int()>& run) {
  auto a = std::make_shared<Args>();
  CLI::App* sub = bench.add_subcommand(
      "grammar", "Host time of structured output's token masks over a model's vocabulary (a JSON document walked "
                 "token by token under its schema)");
  sub->add_option("--model", a->model, "model folder (config.json and the tokenizer are read)")->required();
  sub->add_option("--schema", a->schema, "JSON Schema file (default: an invoice-extraction schema)");
  sub->add_option("--document", a->document, "a JSON document the schema accepts (default: one for the default schema)");
  sub->add_option("--repeat", a->repeat, "grammars compiled and walked (fresh, then shared)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  sub->callback([a, &run] { run = [a] { return run_bench(*a); }; });
}

}  // namespace zest::cli
