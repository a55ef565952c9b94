// `kvrelay-dump --list`: every kvrelay segment in /dev/shm and what it is.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvrelay::dump {

struct SegmentEntry {
  std::string name;  // without the leading '/'
  uint64_t bytes = 0;
  uint32_t owner_uid = 0;
  std::string kind;    // control, pool, unknown
  std::string status;  // live, stale, foreign, invalid
  std::string detail;  // e.g. "coordinator pid 123 is gone"
};

std::vector<SegmentEntry> list_segments();
std::string render_list_text(const std::vector<SegmentEntry>& entries);
nlohmann::json render_list_json(const std::vector<SegmentEntry>& entries);

}  // namespace kvrelay::dump
