// Typed access to tokenizer.json fields; errors name the file and the field's path (e.g. "model.merges[3]").
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "xmoe/error.hpp"

namespace xmoe::tokenizer_detail {

using Json = nlohmann::json;

// Where a JSON value sits: "<file>: <path>".
struct JsonPath {
  std::string file;
  std::string path;

  JsonPath operator/(std::string_view key) const {
    return {file, path.empty() ? std::string(key) : path + "." + std::string(key)};
  }
  JsonPath operator[](size_t index) const { return {file, path + "[" + std::to_string(index) + "]"}; }
  std::string str() const { return file + ": " + path; }
};

inline const Json& require(const Json& object, std::string_view key, const JsonPath& at) {
  XMOE_CHECK(object.is_object(), at.str(), ": expected an object");
  auto it = object.find(key);
  XMOE_CHECK(it != object.end(), (at / key).str(), ": missing");
  return *it;
}

inline const Json* optional_field(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

inline std::string require_string(const Json& object, std::string_view key, const JsonPath& at) {
  const Json& value = require(object, key, at);
  XMOE_CHECK(value.is_string(), (at / key).str(), ": expected a string");
  return value.get<std::string>();
}

inline bool bool_or(const Json& object, std::string_view key, bool fallback, const JsonPath& at) {
  const Json* value = optional_field(object, key);
  if (!value) return fallback;
  XMOE_CHECK(value->is_boolean(), (at / key).str(), ": expected true or false");
  return value->get<bool>();
}

inline const Json& require_array(const Json& object, std::string_view key, const JsonPath& at) {
  const Json& value = require(object, key, at);
  XMOE_CHECK(value.is_array(), (at / key).str(), ": expected an array");
  return value;
}

inline int32_t to_id(const Json& value, const JsonPath& at) {
  XMOE_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() <= INT32_MAX,
             at.str(), ": expected a token id (a non-negative 32-bit integer)");
  return static_cast<int32_t>(value.get<int64_t>());
}

}  // namespace xmoe::tokenizer_detail
