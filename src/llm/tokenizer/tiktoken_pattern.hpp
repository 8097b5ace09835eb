// tiktoken's pre-tokenizer patterns run on the Rust regex crate; we run them on Oniguruma, whose syntax
// agrees for these patterns (classes with `&&`, \p{...}, (?i:...), lookahead) but whose Unicode tables are of
// an older Unicode version. The properties tiktoken patterns use are therefore replaced by explicit classes
// of the code points tiktoken itself matches (tiktoken_unicode_tables.hpp).
#pragma once
#include <string>
#include <string_view>

namespace xmoe::tokenizer_detail {

// `pattern` with each \p{X} / \P{X} of a tabled property (L, Lu, Ll, Lt, Lm, Lo, M, N, Han) replaced by a
// bracketed class [..] / [^..]: Oniguruma reads a class nested in a class as a union, so the replacement is
// right inside and outside brackets alike. Escaped backslashes and other escapes are kept as written.
std::string expand_unicode_properties(std::string_view pattern);

}  // namespace xmoe::tokenizer_detail
