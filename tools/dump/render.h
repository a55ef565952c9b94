// Rendering a snapshot: text for people (with --help explaining every
// column) and JSON for scripts (schema "kvrelay-dump/1", documented in the
// docs/operating.md; fields are only ever added, never renamed).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "instance_view.h"

namespace kvrelay::dump {

// `rates`: optional per-rank copy throughput over the last refresh (GB/s),
// shown in --watch mode.
std::string render_text(const InstanceView& v, const std::vector<double>* rates = nullptr);
nlohmann::json render_json(const InstanceView& v);

extern const char* const kColumnHelp;

}  // namespace kvrelay::dump
