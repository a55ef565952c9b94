// kvrelay-dump's JSON for an instance, as the integration tests read it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "support/instance.h"

namespace kvrelay::testing {

// The parsed `kvrelay-dump <instance> --json`; discarded when it is not JSON.
inline nlohmann::json dump_json(const std::string& instance) {
  std::string out;
  run_program({Instance::bin("kvrelay-dump"), instance, "--json"}, &out);
  return nlohmann::json::parse(out, nullptr, false);
}

// One ring's entry in a dump (empty when there is no ring of that name).
inline nlohmann::json ring_json(const nlohmann::json& dump, const std::string& name) {
  for (const auto& r : dump["rings"])
    if (r["name"] == name) return r;
  return {};
}

}  // namespace kvrelay::testing
