// Hash and equality for maps keyed by std::string that are looked up by
// std::string_view (C++20 heterogeneous lookup): a lookup by a view into a
// message builds no string, so it allocates nothing.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvrelay {

struct StringKeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

template <class V>
using StringKeyMap = std::unordered_map<std::string, V, StringKeyHash, std::equal_to<>>;

}  // namespace kvrelay
