// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable() on some non-ASCII text outside strings
// and comments (marzer/tomlplusplus#190, #295): undefined behaviour on a config file. The screen
// that refuses exactly that text before toml++ reads it.
#include <fmt/format.h>

#include <string>
#include <string_view>
#include <vector>

#include "config/config_internal.h"

namespace keel::config_internal {

// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable() when it asks whether some non-ASCII
// characters (U+00A1..U+0499 and others) are whitespace: undefined behaviour on a config file
// (marzer/tomlplusplus#190, #295). It asks outside strings and comments, where TOML allows no
// non-ASCII text anyway, and around a multi-line string's line-ending backslash; keel refuses
// non-ASCII text in exactly those places before toml++ reads the file. Where a string starts
// follows toml++: a quote inside a bare value ("0\"") is read ahead as part of that value.
Status CheckTomlNonAscii(std::string_view text, const std::string& origin) {
  int line = 1;
  size_t line_start = 0;
  auto refuse = [&](size_t at, std::string_view what) {
    return Status::InvalidArgument(
        fmt::format("{}:{}:{}: invalid TOML: {}", origin, line, at - line_start + 1, what));
  };
  auto newline = [&](size_t at) {
    ++line;
    line_start = at + 1;
  };
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
  auto key_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  };
  std::vector<char> nest;  // '[' arrays and '{' inline tables of the value being read
  bool key = true;         // the next token is a key (else a value)
  enum class Bare { kNone, kKey, kValue } bare = Bare::kNone;
  size_t i = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;  // a byte-order mark (toml++ skips it)
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n' || space(c) || c == '#') {
      bare = Bare::kNone;
      if (c == '\n') {
        newline(i);
        if (nest.empty()) key = true;
      } else if (c == '#') {  // a comment runs to the end of the line
        while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      }
      ++i;
      continue;
    }
    if (!ascii(c)) return refuse(i, "a non-ASCII character outside a string or comment");
    if (bare == Bare::kValue && c != ',' && c != ']' && c != '}') {
      ++i;  // toml++ reads a bare value (number, date, ...) ahead up to a terminator
      continue;
    }
    if (bare == Bare::kKey && key_char(c)) {
      ++i;
      continue;
    }
    bare = Bare::kNone;
    if (c == '"' || c == '\'') {
      const std::string_view quotes = c == '"' ? "\"\"\"" : "'''";
      const bool multi = text.substr(i).starts_with(quotes);
      i += multi ? 3 : 1;
      while (i < text.size()) {
        const char d = text[i];
        if (d == '\n') {
          if (!multi) break;  // an unterminated string: toml++ stops here
          newline(i++);
        } else if (d == '\\' && c == '"') {
          ++i;
          if (multi && i < text.size() && (space(text[i]) || !ascii(text[i]))) {
            // A line-ending backslash: toml++ tests each character up to the next text.
            while (i < text.size() && space(text[i])) {
              if (text[i] == '\n') newline(i);
              ++i;
            }
            if (i < text.size() && !ascii(text[i]))
              return refuse(i,
                            "a non-ASCII character right after a line-ending backslash in a "
                            "multi-line string; write it as \\uXXXX");
          } else if (i < text.size() && text[i] != '\n') {
            ++i;  // the escaped character
          }
        } else if (d == c && (!multi || text.substr(i).starts_with(quotes))) {
          i += multi ? 3 : 1;
          // Up to two more quotes end a multi-line string's text ("""a""""" is a"").
          for (int k = 0; multi && k < 2 && i < text.size() && text[i] == c; ++k) ++i;
          break;
        } else {
          ++i;
        }
      }
      continue;
    }
    if (c == '=') {
      key = false;
    } else if (c == '[' && !key) {
      nest.push_back('[');
    } else if (c == '{' && !key) {
      nest.push_back('{');
      key = true;
    } else if (c == ',' && !nest.empty()) {
      key = nest.back() == '{';
    } else if ((c == ']' || c == '}') && !nest.empty() && nest.back() == (c == ']' ? '[' : '{')) {
      nest.pop_back();
      key = false;
    } else if (c != '[' && c != ']' && c != '{' && c != '}' && c != ',' && !(c == '.' && key)) {
      bare = key ? Bare::kKey : Bare::kValue;  // '.' separates the parts of a dotted key
    }
    ++i;
  }
  return Status::OK();
}

}  // namespace keel::config_internal
