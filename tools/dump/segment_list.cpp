#include "segment_list.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

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
