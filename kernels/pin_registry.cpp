#include "kernels/pin_registry.h"

#include <fmt/format.h>

namespace kvrelay::kernels {

Result<PinRegistry::Pages> PinRegistry::pin(uintptr_t start, uintptr_t end, bool mapped,
                                            int device) {
  std::lock_guard<std::mutex> lock(mu_);
  // The pinned range that starts last at or before `end`: any range that
  // overlaps [start, end) and starts before it is the one just before it.
  auto it = pinned_.lower_bound(end);
  if (it != pinned_.begin()) {
    Entry& e = std::prev(it)->second;
    if (e.pages.end > start) {  // overlaps
      if (e.pages.start <= start && end <= e.pages.end && (e.pages.mapped || !mapped)) {
        ++e.users;
        return e.pages;
      }
      return make_error(
          Errc::kBusy,
          fmt::format("cannot pin host pages [{:#x}, {:#x}){}: they overlap pages [{:#x}, {:#x}) "
                      "this process pinned {}, with {} user(s), and CUDA registers a page once",
                      start, end, mapped ? " with a device mapping" : "", e.pages.start,
                      e.pages.end, e.pages.mapped ? "with a device mapping" : "without one",
                      e.users));
    }
  }
  Pages p{start, end, mapped, device, 0};
  if (Status s = register_(p); !s) return s.error();
  pinned_[start] = Entry{p, 1};
  return p;
}

void PinRegistry::release(uintptr_t start) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pinned_.find(start);
  if (it == pinned_.end()) return;
  if (--it->second.users > 0) return;
  unregister_(it->second.pages);
  pinned_.erase(it);
}

size_t PinRegistry::ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_.size();
}

size_t PinRegistry::users() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [start, e] : pinned_) n += e.users;
  return n;
}

}  // namespace kvrelay::kernels
