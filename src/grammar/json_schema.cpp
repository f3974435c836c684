#include "grammar/json_schema.h"

#include <algorithm>
#include <set>

namespace zest::grammar {
namespace {

using json = Json;

constexpr int kMaxSchemaDepth = 64;
constexpr int32_t kMaxRules = 200000;
constexpr int64_t kMaxIntDigits = 18, kMaxFracDigits = 18, kMaxExpDigits = 2;

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples",  "$schema",
                                          "$id",      "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs",    "definitions", "$anchor"};
  return k;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> k = {"type",     "enum",     "const",     "properties", "required",
                                          "additionalProperties", "items",     "minItems",   "maxItems",
                                          "minLength", "maxLength", "anyOf",    "oneOf",      "allOf",
                                          "$ref",     "uniqueItems"};
  return k;
}

const char* kSupportedList =
    "type, enum, const, properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength, "
    "anyOf, oneOf, allOf (one schema), $ref, and annotations";

std::string at(const std::string& path) { return "'" + path + "'"; }

Status only_annotations(const json& s, const char* keyword, const std::string& path) {
  for (const auto& [k, v] : s.items())
    if (k != keyword && !annotations().count(k))
      return invalid_argument(at(path) + ": '" + k + "' next to '" + keyword +
                              "' is not supported by zest's structured output (put it inside the alternatives)");
  return Status::ok();
}

Status bound(const json& s, const char* key, const std::string& path, int64_t& out) {
  auto it = s.find(key);
  if (it == s.end()) return Status::ok();
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    return invalid_argument(at(path + "/" + key) + " must be a non-negative integer");
  if (it->get<int64_t>() > Grammar::kMaxRepeat)
    return invalid_argument(at(path + "/" + key) + " above " + std::to_string(Grammar::kMaxRepeat) +
                            " is not supported by zest's structured output");
  out = it->get<int64_t>();
  return Status::ok();
}

bool type_matches(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

}  // namespace

JsonRules::JsonRules(Grammar& g, JsonOptions opts) : g_(g), opts_(opts) {}

int32_t JsonRules::ws() {
  if (ws_ >= 0) return ws_;
  const int32_t indent = g_.repeat("ws_indent", {g_.bytes(byte_set(" \t"))}, 0, opts_.max_indent);
  ws_ = g_.rule_of("ws", {{}, g_.text(" "), cat({g_.text("\n"), {Grammar::ref(indent)}})});
  return ws_;
}

int32_t JsonRules::json_char() {
  if (char_ >= 0) return char_;
  const Sym cont = g_.bytes(byte_range(0x80, 0xBF));
  ByteSet ascii = byte_range(0x20, 0x7F);
  ascii.reset('"');
  ascii.reset('\\');
  const Sym hex = g_.bytes(byte_set("0123456789abcdefABCDEF"));
  const Sym d = g_.bytes(byte_set("dD"));
  const int32_t hex4 = g_.rule_of(
      "json_hex4", {{g_.bytes(byte_set("0123456789abcABCefEF")), hex, hex, hex}, {d, g_.bytes(byte_range('0', '7')), hex, hex}});
  ByteSet e1 = byte_range(0xE1, 0xEC);
  e1 |= byte_range(0xEE, 0xEF);
  char_ = g_.rule_of(
      "json_char",
      {{g_.bytes(ascii)},
       {g_.bytes(byte_range(0xC2, 0xDF)), cont},
       {g_.byte(0xE0), g_.bytes(byte_range(0xA0, 0xBF)), cont},
       {g_.bytes(e1), cont, cont},
       {g_.byte(0xED), g_.bytes(byte_range(0x80, 0x9F)), cont},
       {g_.byte(0xF0), g_.bytes(byte_range(0x90, 0xBF)), cont, cont},
       {g_.bytes(byte_range(0xF1, 0xF3)), cont, cont, cont},
       {g_.byte(0xF4), g_.bytes(byte_range(0x80, 0x8F)), cont, cont},
       {g_.byte('\\'), g_.bytes(byte_set("\"\\/bfnrt"))},
       cat({g_.text("\\u"), {Grammar::ref(hex4)}}),
       cat({g_.text("\\u"), {d, g_.bytes(byte_set("89abAB")), hex, hex}, g_.text("\\u"),
            {d, g_.bytes(byte_set("cdefCDEF")), hex, hex}})});
  return char_;
}

int32_t JsonRules::string(int64_t min_len, int64_t max_len) {
  auto it = strings_.find({min_len, max_len});
  if (it != strings_.end()) return it->second;
  const std::string name = "json_string" + (min_len == 0 && max_len < 0 ? std::string()
                                                                        : "_" + std::to_string(min_len) + "_" + std::to_string(max_len));
  const int32_t chars = g_.repeat(name + "_chars", {Grammar::ref(json_char())}, min_len, max_len);
  const int32_t r = g_.rule_of(name, {cat({g_.text("\""), {Grammar::ref(chars)}, g_.text("\"")})});
  strings_[{min_len, max_len}] = r;
  return r;
}

int32_t JsonRules::integer() {
  if (integer_ >= 0) return integer_;
  const int32_t digits = g_.repeat("json_int_digits", {g_.bytes(byte_range('0', '9'))}, 0, kMaxIntDigits - 1);
  const int32_t mag = g_.rule_of("json_int_magnitude",
                                 {g_.text("0"), {g_.bytes(byte_range('1', '9')), Grammar::ref(digits)}});
  integer_ = g_.rule_of("json_integer", {{Grammar::ref(mag)}, cat({g_.text("-"), {Grammar::ref(mag)}})});
  return integer_;
}

int32_t JsonRules::number() {
  if (number_ >= 0) return number_;
  const Sym digit = g_.bytes(byte_range('0', '9'));
  const int32_t frac_digits = g_.repeat("json_frac_digits", {digit}, 1, kMaxFracDigits);
  const int32_t frac = g_.rule_of("json_frac", {{}, cat({g_.text("."), {Grammar::ref(frac_digits)}})});
  const int32_t exp_digits = g_.repeat("json_exp_digits", {digit}, 1, kMaxExpDigits);
  const int32_t sign = g_.rule_of("json_exp_sign", {{}, g_.text("+"), g_.text("-")});
  const int32_t exp =
      g_.rule_of("json_exp", {{}, {g_.bytes(byte_set("eE")), Grammar::ref(sign), Grammar::ref(exp_digits)}});
  number_ = g_.rule_of("json_number", {{Grammar::ref(integer()), Grammar::ref(frac), Grammar::ref(exp)}});
  return number_;
}

int32_t JsonRules::any_value() {
  if (value_ >= 0) return value_;
  value_ = g_.add_rule("json_value");
  const Sym w = Grammar::ref(ws());
  const Seq comma = cat({{w}, g_.text(","), {w}});
  const int32_t member = g_.rule_of(
      "json_member", {cat({{Grammar::ref(string())}, {w}, g_.text(":"), {w}, {Grammar::ref(value_)}})});
  const int32_t members = g_.repeat("json_members", {Grammar::ref(member)}, 1, -1, comma);
  object_ = g_.rule_of("json_object", {cat({g_.text("{"), {w}, g_.text("}")}),
                                       cat({g_.text("{"), {w}, {Grammar::ref(members)}, {w}, g_.text("}")})});
  const int32_t elems = g_.repeat("json_elements", {Grammar::ref(value_)}, 1, -1, comma);
  array_ = g_.rule_of("json_array", {cat({g_.text("["), {w}, g_.text("]")}),
                                     cat({g_.text("["), {w}, {Grammar::ref(elems)}, {w}, g_.text("]")})});
  for (int32_t r : {object_, array_, string(), number()}) g_.add_alt(value_, {Grammar::ref(r)});
  for (const char* lit : {"true", "false", "null"}) g_.add_alt(value_, g_.text(lit));
  return value_;
}

int32_t JsonRules::any_object() {
  any_value();
  return object_;
}

Seq JsonRules::literal(const json& value) { return g_.text(value.dump()); }

Result<int32_t> JsonRules::schema(const json& schema, const std::string& where) {
  root_ = &schema;
  where_ = where;
  refs_.clear();
  ZEST_ASSIGN_OR_RETURN(int32_t r, compile(schema, where, 0));
  if (g_.num_rules() > kMaxRules)
    return invalid_argument(at(where) + ": the schema needs more than " + std::to_string(kMaxRules) +
                            " grammar rules (lower maxLength / maxItems bounds)");
  return r;
}

Result<int32_t> JsonRules::compile_ref(const std::string& ref, const std::string& path, int depth) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  if (ref.empty() || ref[0] != '#')
    return invalid_argument(at(path) + ": '$ref' '" + ref.substr(0, 64) +
                            "' is not supported by zest's structured output (only references into the schema itself, "
                            "\"#...\")");
  const json* target = nullptr;
  try {
    const json::json_pointer ptr(ref.substr(1));
    if (root_->contains(ptr)) target = &root_->at(ptr);
  } catch (const json::exception&) {
  }
  if (!target) return invalid_argument(at(path) + ": '$ref' '" + ref.substr(0, 64) + "' does not resolve in the schema");
  // The rule exists before its body: a schema may refer to itself.
  const int32_t r = g_.add_rule("ref:" + ref);
  refs_[ref] = r;
  ZEST_ASSIGN_OR_RETURN(int32_t body, compile(*target, where_ + ref.substr(1), depth + 1));
  g_.add_alt(r, {Grammar::ref(body)});
  return r;
}

Result<int32_t> JsonRules::compile(const json& s, const std::string& path, int depth) {
  if (depth > kMaxSchemaDepth) return invalid_argument(at(path) + ": the schema nests too deep");
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    return invalid_argument(at(path) + ": the schema false matches nothing");
  }
  if (!s.is_object()) return invalid_argument(at(path) + " must be a JSON schema (an object or a boolean)");
  for (const auto& [k, v] : s.items()) {
    if (annotations().count(k)) continue;
    if (!supported().count(k))
      return invalid_argument(at(path) + ": the JSON-schema keyword '" + k +
                              "' is not supported by zest's structured output (supported: " + kSupportedList + ")");
    if (k == "uniqueItems" && !(v.is_boolean() && !v.get<bool>()))
      return invalid_argument(at(path) + ": the JSON-schema keyword 'uniqueItems' (true) is not supported by zest's "
                              "structured output");
  }
  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) return invalid_argument(at(path + "/$ref") + " must be a string");
    ZEST_RETURN_IF_ERROR(only_annotations(s, "$ref", path));
    return compile_ref(it->get<std::string>(), path + "/$ref", depth);
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    auto it = s.find(key);
    if (it == s.end()) continue;
    ZEST_RETURN_IF_ERROR(only_annotations(s, key, path));
    if (!it->is_array() || it->empty())
      return invalid_argument(at(path + "/" + key) + " must be a non-empty array of schemas");
    if (std::string(key) == "allOf") {
      if (it->size() != 1)
        return invalid_argument(at(path + "/allOf") + ": 'allOf' with more than one schema is not supported by "
                                "zest's structured output");
      return compile((*it)[0], path + "/allOf/0", depth + 1);
    }
    const int32_t r = g_.add_rule(path + "/" + key);
    for (size_t i = 0; i < it->size(); ++i) {
      ZEST_ASSIGN_OR_RETURN(int32_t sub, compile((*it)[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
      g_.add_alt(r, {Grammar::ref(sub)});
    }
    return r;
  }
  // The types: given, or what the keywords imply.
  std::vector<std::string> types;
  if (auto it = s.find("type"); it != s.end()) {
    if (it->is_string()) types.push_back(*it);
    else if (it->is_array() && !it->empty() &&
             std::all_of(it->begin(), it->end(), [](const json& t) { return t.is_string(); }))
      for (const json& t : *it) types.push_back(t);
    else return invalid_argument(at(path + "/type") + " must be a type name or a non-empty array of them");
    for (const std::string& t : types)
      if (t != "object" && t != "array" && t != "string" && t != "number" && t != "integer" && t != "boolean" &&
          t != "null")
        return invalid_argument(at(path + "/type") + ": unknown type '" + t.substr(0, 32) + "'");
  }
  if (s.contains("const") || s.contains("enum")) {
    std::vector<json> values;
    if (auto c = s.find("const"); c != s.end()) values.push_back(*c);
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) return invalid_argument(at(path + "/enum") + " must be a non-empty array");
      if (s.contains("const")) {
        // Both: the const, if the enum has it.
        if (std::find(e->begin(), e->end(), values[0]) == e->end()) values.clear();
      } else {
        values.assign(e->begin(), e->end());
      }
    }
    if (!types.empty())
      values.erase(std::remove_if(values.begin(), values.end(),
                                  [&](const json& v) {
                                    return std::none_of(types.begin(), types.end(),
                                                        [&](const std::string& t) { return type_matches(v, t); });
                                  }),
                   values.end());
    if (values.empty()) return invalid_argument(at(path) + ": no value of 'enum' / 'const' fits the schema");
    const int32_t r = g_.add_rule(path + "/enum");
    for (const json& v : values) g_.add_alt(r, literal(v));
    return r;
  }
  if (types.empty()) {
    const bool obj = s.contains("properties") || s.contains("required") || s.contains("additionalProperties");
    const bool arr = s.contains("items") || s.contains("minItems") || s.contains("maxItems");
    const bool str = s.contains("minLength") || s.contains("maxLength");
    if (obj + arr + str > 1)
      return invalid_argument(at(path) + ": give 'type' (the keywords belong to several types)");
    if (obj) types.push_back("object");
    else if (arr) types.push_back("array");
    else if (str) types.push_back("string");
    else return any_value();
  }
  const int32_t r = g_.add_rule(path);
  for (const std::string& t : types) {
    int32_t sub = -1;
    if (t == "object") {
      ZEST_ASSIGN_OR_RETURN(sub, compile_object(s, path, depth));
    } else if (t == "array") {
      ZEST_ASSIGN_OR_RETURN(sub, compile_array(s, path, depth));
    } else if (t == "string") {
      int64_t lo = 0, hi = -1;
      ZEST_RETURN_IF_ERROR(bound(s, "minLength", path, lo));
      ZEST_RETURN_IF_ERROR(bound(s, "maxLength", path, hi));
      if (hi >= 0 && hi < lo) return invalid_argument(at(path) + ": 'maxLength' is below 'minLength'");
      sub = string(lo, hi);
    } else if (t == "number") {
      sub = number();
    } else if (t == "integer") {
      sub = integer();
    } else if (t == "boolean") {
      g_.add_alt(r, g_.text("true"));
      g_.add_alt(r, g_.text("false"));
    } else {
      g_.add_alt(r, g_.text("null"));
    }
    if (sub >= 0) g_.add_alt(r, {Grammar::ref(sub)});
  }
  return r;
}

Result<int32_t> JsonRules::compile_object(const json& s, const std::string& path, int depth) {
  const json* props = nullptr;
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) return invalid_argument(at(path + "/properties") + " must be an object");
    props = &*it;
  }
  std::set<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) return invalid_argument(at(path + "/required") + " must be an array of names");
    for (const json& n : *it) {
      if (!n.is_string()) return invalid_argument(at(path + "/required") + " must be an array of names");
      if (!props || !props->contains(n.get<std::string>()))
        return invalid_argument(at(path + "/required") + " names '" + n.get<std::string>().substr(0, 64) +
                                "', which is not in 'properties' (zest's structured output writes only the listed "
                                "properties)");
      required.insert(n.get<std::string>());
    }
  }
  // Extra members: a schema for their values, or none.
  int32_t extra = -1;
  if (auto it = s.find("additionalProperties"); it != s.end()) {
    if (it->is_boolean()) {
      if (it->get<bool>()) extra = any_value();
    } else {
      ZEST_ASSIGN_OR_RETURN(extra, compile(*it, path + "/additionalProperties", depth + 1));
    }
  } else if (!props) {
    extra = any_value();
  }
  const Sym w = Grammar::ref(ws());
  const Seq comma = cat({{w}, g_.text(","), {w}});
  const Seq colon = cat({{w}, g_.text(":"), {w}});
  std::vector<std::pair<std::string, int32_t>> members;  // name, value rule
  if (props)
    for (const auto& [name, sub] : props->items()) {
      ZEST_ASSIGN_OR_RETURN(int32_t v, compile(sub, path + "/properties/" + name, depth + 1));
      members.emplace_back(name, v);
    }
  // F_i: the members from i on when none was written yet (at least one follows); A_i: the same after one was.
  const size_t n = members.size();
  std::vector<int32_t> F(n + 1), A(n + 1);
  F[n] = g_.add_rule(path + "/F" + std::to_string(n));
  A[n] = g_.add_rule(path + "/A" + std::to_string(n));
  g_.add_alt(A[n], {});
  if (extra >= 0) {
    const int32_t x = g_.rule_of(path + "/extra", {cat({{Grammar::ref(string())}, colon, {Grammar::ref(extra)}})});
    g_.add_alt(F[n], {Grammar::ref(x), Grammar::ref(A[n])});
    g_.add_alt(A[n], cat({comma, {Grammar::ref(x)}, {Grammar::ref(A[n])}}));
  }
  bool any_required = false;
  for (size_t i = n; i-- > 0;) {
    const bool req = required.count(members[i].first) > 0;
    any_required = any_required || req;
    const Seq kv = cat({literal(json(members[i].first)), colon, {Grammar::ref(members[i].second)}});
    F[i] = g_.add_rule(path + "/F" + std::to_string(i));
    A[i] = g_.add_rule(path + "/A" + std::to_string(i));
    g_.add_alt(F[i], cat({kv, {Grammar::ref(A[i + 1])}}));
    g_.add_alt(A[i], cat({comma, kv, {Grammar::ref(A[i + 1])}}));
    if (!req) {
      g_.add_alt(F[i], {Grammar::ref(F[i + 1])});
      g_.add_alt(A[i], {Grammar::ref(A[i + 1])});
    }
  }
  const int32_t r = g_.add_rule(path + "/object");
  if (!any_required) g_.add_alt(r, cat({g_.text("{"), {w}, g_.text("}")}));
  g_.add_alt(r, cat({g_.text("{"), {w}, {Grammar::ref(F[0])}, {w}, g_.text("}")}));
  return r;
}

Result<int32_t> JsonRules::compile_array(const json& s, const std::string& path, int depth) {
  int32_t item = -1;
  if (auto it = s.find("items"); it != s.end()) {
    ZEST_ASSIGN_OR_RETURN(item, compile(*it, path + "/items", depth + 1));
  } else {
    item = any_value();
  }
  int64_t lo = 0, hi = -1;
  ZEST_RETURN_IF_ERROR(bound(s, "minItems", path, lo));
  ZEST_RETURN_IF_ERROR(bound(s, "maxItems", path, hi));
  if (hi >= 0 && hi < lo) return invalid_argument(at(path) + ": 'maxItems' is below 'minItems'");
  const Sym w = Grammar::ref(ws());
  const int32_t r = g_.add_rule(path + "/array");
  if (lo == 0) g_.add_alt(r, cat({g_.text("["), {w}, g_.text("]")}));
  if (hi != 0) {
    const int32_t list =
        g_.repeat(path + "/items", {Grammar::ref(item)}, std::max<int64_t>(lo, 1), hi, cat({{w}, g_.text(","), {w}}));
    g_.add_alt(r, cat({g_.text("["), {w}, {Grammar::ref(list)}, {w}, g_.text("]")}));
  }
  return r;
}

namespace {

// root ::= ws VALUE ws
void json_text_root(Grammar& g, JsonRules& j, int32_t value) {
  const Sym w = Grammar::ref(j.ws());
  g.set_root(g.rule_of("root", {{w, Grammar::ref(value), w}}));
}

}  // namespace

Result<Grammar> json_schema_grammar(const json& schema, const std::string& where, JsonOptions opts) {
  Grammar g;
  JsonRules j(g, opts);
  ZEST_ASSIGN_OR_RETURN(int32_t v, j.schema(schema, where));
  json_text_root(g, j, v);
  return g;
}

Grammar json_object_grammar(JsonOptions opts) {
  Grammar g;
  JsonRules j(g, opts);
  json_text_root(g, j, j.any_object());
  return g;
}

Result<Grammar> tool_call_grammar(const std::vector<ToolSpec>& tools, bool parallel, const std::string& where,
                                  JsonOptions opts) {
  if (tools.empty()) return invalid_argument(at(where) + ": no tools to call");
  Grammar g;
  JsonRules j(g, opts);
  const int32_t body = g.add_rule("tool_call_body");
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolSpec& t = tools[i];
    int32_t args = -1;
    if (t.parameters.is_null()) {
      ZEST_ASSIGN_OR_RETURN(args, j.schema(json{{"type", "object"}, {"properties", json::object()}}, where));
    } else {
      ZEST_ASSIGN_OR_RETURN(args, j.schema(t.parameters, where + "[" + std::to_string(i) + "].function.parameters"));
    }
    g.add_alt(body, cat({g.text(t.name), g.text("\", \"arguments\": "), {Grammar::ref(args)}}));
  }
  const int32_t call = g.rule_of(
      "tool_call", {cat({g.text("<tool_call>\n{\"name\": \""), {Grammar::ref(body)}, g.text("}\n</tool_call>")})});
  g.set_root(parallel ? g.repeat("tool_calls", {Grammar::ref(call)}, 1, -1, g.text("\n")) : call);
  return g;
}

Grammar choice_grammar(const std::vector<std::string>& choices) {
  Grammar g;
  const int32_t r = g.add_rule("choice");
  for (const std::string& c : choices) g.add_alt(r, g.text(c));
  g.set_root(r);
  return g;
}

int32_t until_rule(Grammar& g, const std::string& name, const std::string& terminator) {
  const int m = static_cast<int>(terminator.size());
  if (m == 0) return g.rule_of(name, {{}});
  // KMP failure function, then the automaton: delta(k, b) = the longest prefix of the terminator that is a suffix of
  // (its first k bytes + b).
  std::vector<int> fail(static_cast<size_t>(m) + 1, 0);
  for (int i = 1, k = 0; i < m; ++i) {
    while (k > 0 && terminator[i] != terminator[k]) k = fail[k];
    if (terminator[i] == terminator[k]) ++k;
    fail[i + 1] = k;
  }
  auto delta = [&](int k, uint8_t b) {
    while (k > 0 && static_cast<uint8_t>(terminator[k]) != b) k = fail[k];
    return static_cast<uint8_t>(terminator[k]) == b ? k + 1 : 0;
  };
  std::vector<int32_t> state(static_cast<size_t>(m));
  for (int k = 0; k < m; ++k) state[k] = g.add_rule(name + "_" + std::to_string(k));
  for (int k = 0; k < m; ++k) {
    std::vector<ByteSet> to(static_cast<size_t>(m) + 1);
    for (int b = 0; b < 256; ++b) to[delta(k, static_cast<uint8_t>(b))].set(b);
    for (int j = 0; j < m; ++j)
      if (to[j].any()) g.add_alt(state[k], {g.bytes(to[j]), Grammar::ref(state[j])});
    if (to[m].any()) g.add_alt(state[k], {g.bytes(to[m])});
  }
  return state[0];
}

void add_think_prefix(Grammar& g, ThinkPrefix mode) {
  if (mode == ThinkPrefix::kNone) return;
  const int32_t body = g.root();
  const int32_t rest = until_rule(g, "think", "</think>");
  const int32_t space = g.repeat("think_space", {g.bytes(byte_set(" \t\n"))}, 0, 8);
  const Seq after = {Grammar::ref(rest), Grammar::ref(space), Grammar::ref(body)};
  const int32_t root = g.add_rule("think_root");
  if (mode == ThinkPrefix::kOptional) {
    g.add_alt(root, {Grammar::ref(body)});
    g.add_alt(root, cat({g.text("<think>"), after}));
  } else {
    g.add_alt(root, after);
  }
  g.set_root(root);
}

}  // namespace zest::grammar
