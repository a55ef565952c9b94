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

// `kvrelay-dump --clean-stale`: removes this user's segments that provably
// serve nothing, and says why for each: a control segment whose coordinator
// is gone (judged by its owner lock) and the pools of that instance whose
// workers are gone too; and, beside a live instance, the pools of ranks it
// no longer has (restarted at a smaller TP) whose workers are gone. Never a
// live segment, another user's, or one it cannot read. `instance`: only
// that instance's segments (empty: every instance's).
struct Removed {
  std::string name;
  std::string why;
};
std::vector<Removed> clean_stale_segments(const std::string& instance = "");
std::string render_list_text(const std::vector<SegmentEntry>& entries);
nlohmann::json render_list_json(const std::vector<SegmentEntry>& entries);

}  // namespace kvrelay::dump
