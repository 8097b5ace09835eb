// Flag validators with messages that say what is expected (CLI11's range checks print the type's whole
// range).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace xmoe::app {

inline CLI::Validator positive_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(s, &used);
          if (used == s.size() && v > 0) return {};
        } catch (const std::exception&) {
        }
        return "must be a positive integer, got '" + s + "'";
      },
      "POSITIVE");
}

inline CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(s, &used);
          if (used == s.size() && v >= 0) return {};
        } catch (const std::exception&) {
        }
        return "must be an integer >= 0, got '" + s + "'";
      },
      "NONNEGATIVE");
}

inline CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(s, &used);
          if (used == s.size() && v >= 0) return {};
        } catch (const std::exception&) {
        }
        return "must be a number >= 0, got '" + s + "'";
      },
      "NONNEGATIVE");
}

}  // namespace xmoe::app
