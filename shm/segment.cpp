#include "shm/segment.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/exceptions.hpp>
#include <cerrno>
#include <vector>

#include "shm/owner_lock.h"

namespace kvrelay {

namespace bip = boost::interprocess;

namespace {

Error from_boost(const std::string& what, const bip::interprocess_exception& e) {
  const int err = e.get_native_error();
  switch (e.get_error_code()) {
    case bip::already_exists_error:
      return make_error(Errc::kAlreadyExists, fmt::format("{}: segment already exists", what));
    case bip::not_found_error:
      return make_error(Errc::kNotFound, fmt::format("{}: no such segment", what));
    case bip::security_error:
      return make_error(
          Errc::kPermissionDenied,
          fmt::format("{}: permission denied (kvrelay segments are private to the user "
                      "that created them, mode 0600, unless created with group access)",
                      what));
    default:
      return err != 0 ? system_error(what, err)
                      : make_error(Errc::kSystem, fmt::format("{}: {}", what, e.what()));
  }
}

// Another user may attach only to a segment created with group access
// (mode 0660), and only as a member of the segment's group.
bool group_may_attach(const struct stat& st) {
  if ((st.st_mode & 0060) != 0060) return false;
  if (getegid() == st.st_gid) return true;
  const int n = getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (getgroups(n, groups.data()) != n) return false;
  return std::find(groups.begin(), groups.end(), st.st_gid) != groups.end();
}

}  // namespace

Result<SharedSegment> SharedSegment::create(const std::string& name, size_t bytes,
                                            const SegmentOptions& options) {
  if (bytes == 0) return make_error(Errc::kInvalidArgument, "segment size must be positive");
  const mode_t mode = options.group_access ? 0660 : 0600;
  SharedSegment seg;
  seg.name_ = name;
  try {
    bip::permissions perm(static_cast<int>(mode));
    seg.shm_ = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write, perm);
    if (options.owner_lock && !LockSpace{seg.fd(), 0}.try_lock(0)) {
      bip::shared_memory_object::remove(name.c_str());
      return make_error(Errc::kSystem, fmt::format("create /{}: cannot take its owner lock", name));
    }
    seg.shm_.truncate(static_cast<bip::offset_t>(bytes));  // tmpfs zero-fills
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() != bip::already_exists_error)
      bip::shared_memory_object::remove(name.c_str());
    return from_boost(fmt::format("create /{}", name), e);
  }
  // Boost fchmods after creation; do it again so that the umask can never
  // widen or narrow what was asked for.
  if (fchmod(seg.fd(), mode) != 0) {
    const int err = errno;
    bip::shared_memory_object::remove(name.c_str());
    return system_error(fmt::format("fchmod /{}", name), err);
  }
  if (Status s = seg.map(SegmentAccess::kReadWrite); !s) {
    bip::shared_memory_object::remove(name.c_str());
    return s.error();
  }
  return seg;
}

Result<SharedSegment> SharedSegment::open(const std::string& name, SegmentAccess access) {
  SharedSegment seg;
  seg.name_ = name;
  try {
    seg.shm_ = bip::shared_memory_object(
        bip::open_only, name.c_str(),
        access == SegmentAccess::kReadOnly ? bip::read_only : bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return from_boost(fmt::format("open /{}", name), e);
  }
  if (Status s = seg.map(access); !s) return s.error();
  return seg;
}

// Checks ownership and size through the descriptor, then maps.
Status SharedSegment::map(SegmentAccess access) {
  struct stat st {};
  if (fstat(fd(), &st) != 0) return system_error(fmt::format("fstat /{}", name_), errno);
  inode_ = st.st_ino;
  owner_uid_ = st.st_uid;
  mode_ = st.st_mode & 07777;
  if (st.st_uid != geteuid() && !group_may_attach(st)) {
    return make_error(
        Errc::kPermissionDenied,
        fmt::format("segment /{} belongs to uid {}, this process runs as uid {}; "
                    "kvrelay does not attach to other users' segments (unless the "
                    "instance was started with --group-access and we share its group)",
                    name_, st.st_uid, geteuid()));
  }
  // Its creator makes it (O_EXCL) and sizes it in two steps: empty, it is
  // not ready yet (or its creator died in between; creating it again
  // replaces it).
  if (st.st_size <= 0)
    return make_error(Errc::kNotReady,
                      fmt::format("segment /{} is empty: its creator has not sized it yet", name_));
  try {
    region_ = bip::mapped_region(
        shm_, access == SegmentAccess::kReadOnly ? bip::read_only : bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return from_boost(fmt::format("map /{}", name_), e);
  }
  guard_.handle = TruncationGuard::watch(region_.get_address(), region_.get_size());
  // Before the first touch, so that pages the kernel gives huge are
  // allocated huge (huge_pages.h: only where /dev/shm is mounted for it).
  advise_huge_pages(region_.get_address(), region_.get_size());
  // Writers (a pool's worker, an instance's processes) copy into the
  // segment: it is populated now. A read-only mapping is an observer's
  // (kvrelay-dump, a creator checking a leftover segment) that reads a
  // header or a ring: populating would walk, and for a segment its creator
  // never filled allocate, every page of pools of many GiB.
  if (access == SegmentAccess::kReadWrite) populate();
  if (truncated())
    return make_error(Errc::kSizeMismatch,
                      fmt::format("segment /{} was truncated while it was being mapped", name_));
  return {};
}

// Maps every page now. A first touch of a shared page costs a fault, and
// copies must not pay it on the hot path: a 256 KiB block copy into a fresh
// mapping took 865 us instead of 8 on the project's machines. There the
// hypervisor also maps pages lazily per process, behind the guest's page
// tables, so MADV_POPULATE_WRITE alone still left 562 us: each page is also
// touched once, by an atomic add of zero (a write access that cannot lose a
// concurrent writer's data).
void SharedSegment::populate() {
  auto* base = static_cast<std::byte*>(region_.get_address());
  const size_t size = region_.get_size();
#ifdef MADV_POPULATE_WRITE
  (void)madvise(base, size, MADV_POPULATE_WRITE);
#endif
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t off = 0; off < size; off += page)
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(base + off), 0, __ATOMIC_RELAXED);
}

Status SharedSegment::unlink(const std::string& name) {
  if (!bip::shared_memory_object::remove(name.c_str())) {
    return errno == ENOENT
               ? Status(make_error(Errc::kNotFound, fmt::format("/{}: no such segment", name)))
               : Status(system_error(fmt::format("unlink /{}", name), errno));
  }
  return {};
}

}  // namespace kvrelay
