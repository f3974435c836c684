// A JSON text's nesting depth, checked without parsing it.
#pragma once
#include <cstdint>
#include <string_view>

namespace zest {

// Whether a JSON text nests arrays and objects deeper than `max_depth`: one pass over the bytes (strings
// skipped), no recursion and no allocation, so a hostile text is refused before a recursive consumer (a
// parser, a copy, a dump, the chat template) sees it.
bool json_deeper_than(std::string_view text, int64_t max_depth);

}  // namespace zest
