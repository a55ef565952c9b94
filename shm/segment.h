// A named POSIX shared-memory segment, created or opened through
// Boost.Interprocess and mapped into this process.
//
// Rules (DESIGN.md section 3): creation is exclusive (O_EXCL); the mode is
// 0600 unless group access is asked for explicitly; opening a segment owned
// by another uid is refused before a single byte of it is read. Every page of
// a read-write mapping is mapped when the segment is (see populate()): copies
// never fault. A read-only mapping (an observer's) faults in what it reads.
// Segments of 2 MiB or more ask for huge pages (huge_pages.h).
#pragma once

#include <sys/types.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstddef>
#include <string>
#include <utility>

#include "shm/huge_pages.h"
#include "shm/result.h"
#include "shm/truncation_guard.h"

namespace kvrelay {

struct SegmentOptions {
  bool group_access = false;  // 0660 instead of 0600
  // Take the owner lock on byte 0 (owner_lock.h) the moment the file exists,
  // before it has a size: from then on nobody can judge its creator dead.
  bool owner_lock = false;
};

enum class SegmentAccess { kReadWrite, kReadOnly };

class SharedSegment {
 public:
  // Creates `name` with `bytes` zeroed bytes. kAlreadyExists when it exists.
  static Result<SharedSegment> create(const std::string& name, size_t bytes,
                                      const SegmentOptions& options = {});
  // Opens and maps an existing segment. kNotFound when missing,
  // kPermissionDenied when it belongs to another uid.
  static Result<SharedSegment> open(const std::string& name,
                                    SegmentAccess access = SegmentAccess::kReadWrite);
  // Removes the name; mappings stay valid until unmapped. kNotFound if absent.
  static Status unlink(const std::string& name);

  SharedSegment(SharedSegment&&) noexcept = default;
  SharedSegment& operator=(SharedSegment&&) noexcept = default;

  const std::string& name() const { return name_; }
  std::byte* data() const { return static_cast<std::byte*>(region_.get_address()); }
  size_t size() const { return region_.get_size(); }
  int fd() const { return static_cast<int>(shm_.get_mapping_handle().handle); }
  ino_t inode() const { return inode_; }
  uid_t owner_uid() const { return owner_uid_; }
  mode_t mode() const { return mode_; }
  // Whether another process truncated the segment under our mapping (the
  // mapping then reads zeros; see truncation_guard.h).
  bool truncated() const { return TruncationGuard::truncated(guard_.handle); }
  // Bytes of this mapping on huge pages (0 where /dev/shm gives none).
  uint64_t huge_page_bytes() const { return huge_page_mapped_bytes(data()); }

 private:
  SharedSegment() = default;
  Status map(SegmentAccess access);
  void populate();

  // Unregisters the mapping before it is unmapped (it is declared after
  // region_, so it is destroyed first).
  struct Guard {
    int handle = -1;
    Guard() = default;
    Guard(Guard&& o) noexcept : handle(std::exchange(o.handle, -1)) {}
    Guard& operator=(Guard&& o) noexcept {
      if (this != &o) {
        TruncationGuard::release(handle);
        handle = std::exchange(o.handle, -1);
      }
      return *this;
    }
    ~Guard() { TruncationGuard::release(handle); }
  };

  std::string name_;
  boost::interprocess::shared_memory_object shm_;
  boost::interprocess::mapped_region region_;
  Guard guard_;
  ino_t inode_ = 0;
  uid_t owner_uid_ = 0;
  mode_t mode_ = 0;
};

}  // namespace kvrelay
