#include "segment_list.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "instance/control_segment.h"
#include "instance/names.h"
#include "shm/process_identity.h"

namespace kvrelay::dump {

std::vector<SegmentEntry> list_segments() {
  std::vector<SegmentEntry> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kSegmentPrefix, 0) != 0) continue;
    SegmentEntry s;
    s.name = name;
    struct stat st {};
    if (stat(e.path().c_str(), &st) == 0) {
      s.bytes = static_cast<uint64_t>(st.st_size);
      s.owner_uid = st.st_uid;
    }
    if (s.owner_uid != geteuid()) {
      s.kind = "unknown";
      s.status = "foreign";
      s.detail = fmt::format("owned by uid {}", s.owner_uid);
      out.push_back(s);
      continue;
    }
    Result<SharedSegment> seg = SharedSegment::open(name, SegmentAccess::kReadOnly);
    if (!seg) {
      s.kind = "unknown";
      s.status = "invalid";
      s.detail = seg.error().message;
      out.push_back(s);
      continue;
    }
    if (seg->size() < sizeof(SegmentPreamble)) {
      s.kind = "unknown";
      s.status = "invalid";
      s.detail = "truncated";
      out.push_back(s);
      continue;
    }
    const auto& p = *reinterpret_cast<const SegmentPreamble*>(seg->data());
    s.kind = p.kind == static_cast<uint32_t>(SegmentKind::kControl) ? "control"
             : p.kind == static_cast<uint32_t>(SegmentKind::kPool)  ? "pool"
                                                                    : "unknown";
    const SegmentKind kind = s.kind == "pool" ? SegmentKind::kPool : SegmentKind::kControl;
    if (Status v = validate_preamble(seg->data(), seg->size(), name, kind, false); !v) {
      s.status = "invalid";
      s.detail = v.error().message;
      out.push_back(s);
      continue;
    }
    const CreatorStatus creator = creator_status(p, LockSpace{seg->fd(), 0});
    s.status = creator.alive() ? "live" : "stale";
    s.detail = s.kind == "control" ? creator.describe()
                                   : fmt::format("created by pid {} ({})", p.creator_pid,
                                                 liveness_name(creator.liveness));
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(),
            [](const SegmentEntry& a, const SegmentEntry& b) { return a.name < b.name; });
  return out;
}

namespace {

// "kvrelay-<instance>-(pool|host)-r<rank>" -> (instance, rank).
bool parse_pool_name(const std::string& name, std::string& instance, uint32_t& rank) {
  for (const char* tag : {"-pool-r", "-host-r"}) {
    const size_t at = name.rfind(tag);
    if (at == std::string::npos || at <= kSegmentPrefix.size()) continue;
    const std::string digits = name.substr(at + std::strlen(tag));
    if (digits.empty() || digits.size() > 4 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    instance = name.substr(kSegmentPrefix.size(), at - kSegmentPrefix.size());
    rank = static_cast<uint32_t>(std::stoul(digits));
    return true;
  }
  return false;
}

}  // namespace

std::vector<Removed> clean_stale_segments(const std::string& only) {
  std::vector<SegmentEntry> entries = list_segments();
  if (!only.empty()) {
    const std::string control = control_segment_name(only);
    std::erase_if(entries, [&](const SegmentEntry& e) {
      return e.name != control && e.name.rfind(control + "-", 0) != 0;
    });
  }
  std::map<std::string, const SegmentEntry*> by_name;
  for (const SegmentEntry& e : entries) by_name[e.name] = &e;
  std::vector<Removed> removed;
  auto remove = [&](const SegmentEntry& e, std::string why) {
    if (SharedSegment::unlink(e.name).ok()) removed.push_back({e.name, std::move(why)});
  };
  for (const SegmentEntry& e : entries) {
    if (e.status != "stale") continue;  // live, foreign and unreadable ones stay
    if (e.kind == "control") {
      remove(e, fmt::format("its coordinator is gone ({})", e.detail));
      continue;
    }
    std::string instance;
    uint32_t rank = 0;
    if (e.kind != "pool" || !parse_pool_name(e.name, instance, rank)) continue;
    const auto control = by_name.find(control_segment_name(instance));
    if (control == by_name.end() || control->second->status == "stale") {
      remove(e, fmt::format("its worker and its instance '{}' are gone", instance));
      continue;
    }
    if (control->second->status != "live") continue;
    // Beside a live instance: only the pools of ranks it no longer has.
    Result<ControlSegment> c = ControlSegment::attach(
        instance, AttachOptions{.access = SegmentAccess::kReadOnly, .allow_stale = true});
    if (c && rank >= c->config().tp_size)
      remove(e, fmt::format("instance '{}' runs {} ranks now, and this rank's worker is gone",
                            instance, c->config().tp_size));
  }
  return removed;
}

std::string render_list_text(const std::vector<SegmentEntry>& entries) {
  std::string out = fmt::format("{:<48} {:<8} {:<8} {:>12}  {}\n", "segment", "kind", "status",
                                "bytes", "detail");
  for (const SegmentEntry& e : entries)
    out += fmt::format("{:<48} {:<8} {:<8} {:>12}  {}\n", "/" + e.name, e.kind, e.status, e.bytes,
                       e.detail);
  if (entries.empty()) out += "(no kvrelay segments)\n";
  return out;
}

nlohmann::json render_list_json(const std::vector<SegmentEntry>& entries) {
  nlohmann::json j;
  j["schema"] = "kvrelay-dump-list/1";
  j["segments"] = nlohmann::json::array();
  for (const SegmentEntry& e : entries)
    j["segments"].push_back({{"name", e.name},
                             {"bytes", e.bytes},
                             {"owner_uid", e.owner_uid},
                             {"kind", e.kind},
                             {"status", e.status},
                             {"detail", e.detail}});
  return j;
}

}  // namespace kvrelay::dump
