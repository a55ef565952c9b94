#include "instance/control_segment.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <thread>

#include "instance/names.h"
#include "shm/process_identity.h"

namespace kvrelay {

namespace {

std::string recorded_boot_id(const SegmentPreamble& p) {
  const char* end = static_cast<const char*>(std::memchr(p.boot_id, 0, sizeof(p.boot_id)));
  return std::string(p.boot_id, end != nullptr ? end : p.boot_id + sizeof(p.boot_id));
}

// Seconds since the segment's inode last changed (creation or truncation).
double age_seconds(const SharedSegment& seg) {
  struct stat st {};
  if (fstat(seg.fd(), &st) != 0) return 0;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - st.st_ctim.tv_sec);
}

// A segment whose preamble records no creator was either caught in the
// microseconds between creation and the first write, or its creator died
// right there. Give a live creator this long before calling it stale.
constexpr double kUnclaimedGraceSeconds = 2.0;

}  // namespace

std::string CreatorStatus::describe() const {
  if (alive()) return fmt::format("coordinator pid {} is alive", pid);
  switch (liveness) {
    case Liveness::kAlive:
      return fmt::format(
          "coordinator pid {} no longer holds the instance (the pid runs, but "
          "not as its coordinator)",
          pid);
    case Liveness::kGone: return fmt::format("coordinator pid {} is gone", pid);
    case Liveness::kPidReused:
      return fmt::format("coordinator pid {} is gone (the pid now belongs to another process)",
                         pid);
    case Liveness::kOtherBoot: return fmt::format("coordinator pid {} ran in a previous boot", pid);
    case Liveness::kUnverifiable:
      return fmt::format("coordinator pid {} (in another pid namespace) is gone", pid);
  }
  return "unknown";
}

CreatorStatus creator_status(const SegmentPreamble& p, LockSpace owner_lock) {
  CreatorStatus s;
  s.pid = p.creator_pid;
  s.lock = owner_lock.probe(0);
  ProcessIdentity recorded{p.creator_pid, p.creator_start_time, 0};
  std::memcpy(&recorded.pid_ns, p.reserved, sizeof(recorded.pid_ns));
  s.liveness = check_liveness(recorded, recorded_boot_id(p));
  return s;
}

Status validate_control_header(const std::byte* data, size_t size, const std::string& name,
                               bool allow_unpublished) {
  if (Status s = validate_preamble(data, size, name, SegmentKind::kControl, allow_unpublished); !s)
    return s;
  const auto& p = *reinterpret_cast<const SegmentPreamble*>(data);
  if (p.magic.load(std::memory_order_acquire) == 0)
    return {};  // unpublished: nothing more to trust
  if (size < sizeof(SegmentHeader))
    return make_error(
        Errc::kSizeMismatch,
        fmt::format("segment /{} is {} bytes, smaller than a control header ({} bytes)", name, size,
                    sizeof(SegmentHeader)));

  const auto& h = *reinterpret_cast<const SegmentHeader*>(data);
  if (Status s = validate_config(h.config); !s)
    return make_error(Errc::kCorrupt, fmt::format("segment /{}: {}", name, s.error().message));
  const ControlLayout plan = plan_control_layout(h.config);
  if (plan.total_bytes != size)
    return make_error(Errc::kSizeMismatch,
                      fmt::format("segment /{} is {} bytes, its configuration needs {}", name, size,
                                  plan.total_bytes));
  if (h.region_count != plan.regions.size())
    return make_error(Errc::kCorrupt,
                      fmt::format("segment /{} lists {} regions, its configuration has {}", name,
                                  h.region_count, plan.regions.size()));
  for (size_t i = 0; i < plan.regions.size(); ++i) {
    const RegionEntry& got = h.regions[i];
    const RegionEntry& want = plan.regions[i];
    if (std::memcmp(&got, &want, sizeof(RegionEntry)) != 0)
      return make_error(
          Errc::kCorrupt,
          fmt::format("segment /{}: region {} is {}[{}] at offset {} ({} bytes), "
                      "expected {}[{}] at offset {} ({} bytes)",
                      name, i, region_kind_name(got.kind), got.index, got.offset, got.bytes,
                      region_kind_name(want.kind), want.index, want.offset, want.bytes));
  }
  return {};
}

Result<ControlSegment> ControlSegment::create(const InstanceConfig& config,
                                              const SegmentOptions& options) {
  if (Status s = validate_config(config); !s) return s.error();
  const std::string instance = instance_of(config);
  const std::string name = control_segment_name(instance);
  const ControlLayout layout = plan_control_layout(config);

  std::optional<StaleReplacement> replaced;
  for (int attempt = 0; attempt < 4; ++attempt) {
    SegmentOptions owned = options;
    owned.owner_lock = true;
    Result<SharedSegment> created = SharedSegment::create(name, layout.total_bytes, owned);
    if (created.ok()) {
      ControlSegment seg(std::move(created).value());
      seg.replaced_ = replaced;
      seg.adopt(config);
      const uint64_t epoch = replaced ? replaced->old_epoch + 1 : 1;
      if (Status s = seg.initialize(config, layout, epoch); !s) {
        (void)SharedSegment::unlink(name);
        return s.error();
      }
      return seg;
    }
    if (created.code() != Errc::kAlreadyExists) return created.error();

    // The name is taken. Find out by whom.
    Result<SharedSegment> existing = SharedSegment::open(name, SegmentAccess::kReadOnly);
    if (!existing && existing.code() == Errc::kNotReady) {
      // Empty: its creator is between creating and sizing it, or died there.
      struct stat st {};
      const std::string path = "/dev/shm/" + name;
      if (stat(path.c_str(), &st) != 0) continue;  // vanished meanwhile: retry
      timespec now{};
      clock_gettime(CLOCK_REALTIME, &now);
      if (static_cast<double>(now.tv_sec - st.st_ctim.tv_sec) < kUnclaimedGraceSeconds)
        return make_error(Errc::kAlreadyExists,
                          fmt::format("instance '{}' is being created by another process right "
                                      "now",
                                      instance));
      struct stat again {};
      if (stat(path.c_str(), &again) == 0 && again.st_ino == st.st_ino && again.st_size == 0)
        (void)SharedSegment::unlink(name);
      replaced = StaleReplacement{};
      replaced->reason = "it is empty (its creator died before sizing it)";
      continue;
    }
    if (!existing) {
      if (existing.code() == Errc::kNotFound) continue;  // vanished meanwhile: retry
      return make_error(existing.code(),
                        fmt::format("instance '{}' exists and cannot be inspected: {}", instance,
                                    existing.error().message));
    }
    StaleReplacement stale;
    if (existing->size() >= sizeof(SegmentPreamble)) {
      const auto& p = *reinterpret_cast<const SegmentPreamble*>(existing->data());
      // The owner lock decides; the recorded pid is only for the message.
      const CreatorStatus creator = creator_status(p, LockSpace{existing->fd(), 0});
      if (creator.lock == LockState::kHeld) {
        return make_error(Errc::kAlreadyExists,
                          fmt::format("instance '{}' is already served by coordinator pid {} "
                                      "(it holds the instance's owner lock); stop it first or "
                                      "choose another instance name",
                                      instance, p.creator_pid));
      }
      const bool unclaimed = p.creator_pid == 0;
      if (unclaimed && age_seconds(*existing) < kUnclaimedGraceSeconds) {
        return make_error(Errc::kAlreadyExists,
                          fmt::format("instance '{}' is being created by another process right "
                                      "now",
                                      instance));
      }
      if (!unclaimed && creator.alive()) {
        return make_error(Errc::kAlreadyExists,
                          fmt::format("instance '{}' is already served by coordinator pid {}; "
                                      "stop it first or choose another instance name",
                                      instance, p.creator_pid));
      }
      stale.creator_pid = p.creator_pid;
      stale.reason = unclaimed ? "it records no creator (its creator died while creating it)"
                               : creator.describe();
      if (p.magic.load(std::memory_order_acquire) == kSegmentMagic &&
          p.layout_version == kLayoutVersion && existing->size() >= sizeof(SegmentHeader)) {
        stale.old_epoch = reinterpret_cast<const SegmentHeader*>(existing->data())
                              ->epoch.load(std::memory_order_acquire);
      }
    } else {
      stale.reason = fmt::format("it is truncated ({} bytes)", existing->size());
    }
    // Unlink only what we inspected: if the name meanwhile points to a new
    // segment (another coordinator won the race), leave it alone.
    Result<SharedSegment> again = SharedSegment::open(name, SegmentAccess::kReadOnly);
    if (again.ok() && again->inode() == existing->inode()) (void)SharedSegment::unlink(name);
    replaced = stale;
  }
  return make_error(Errc::kAlreadyExists,
                    fmt::format("instance '{}': could not replace its stale segment (another "
                                "process keeps recreating it)",
                                instance));
}

Status ControlSegment::initialize(const InstanceConfig& config, const ControlLayout& layout,
                                  uint64_t epoch) {
  std::byte* base = segment_.data();
  auto* h = new (base) SegmentHeader{};
  // Identity first, so that a crash from here on leaves a segment whose
  // creator can be judged dead.
  write_preamble(h->preamble, SegmentKind::kControl, layout.total_bytes);
  h->epoch.store(epoch, std::memory_order_relaxed);
  h->state.store(static_cast<uint32_t>(InstanceState::kInitialising), std::memory_order_relaxed);
  h->config = config;
  h->region_count = static_cast<uint32_t>(layout.regions.size());
  std::copy(layout.regions.begin(), layout.regions.end(), h->regions);

  for (const RegionEntry& r : layout.regions) {
    std::byte* at = base + r.offset;
    Status s;
    switch (static_cast<RegionKind>(r.kind)) {
      case RegionKind::kLiveness:
        for (uint32_t i = 0; i < 1 + config.tp_size; ++i)
          new (at + i * sizeof(LivenessSlot)) LivenessSlot{};
        break;
      case RegionKind::kCounters:
        for (uint32_t i = 0; i < 2 + config.tp_size; ++i)
          new (at + i * sizeof(CountersBlock)) CountersBlock{};
        break;
      case RegionKind::kBarrier:
        Barrier(*new (at) BarrierState{}).arm(static_cast<uint16_t>(config.tp_size));
        break;
      case RegionKind::kStatus: new (at) InstanceStatus{}; break;
      case RegionKind::kPoolDirectory: new (at) PoolDirectory{}; break;
      case RegionKind::kSwapProgress: new (at) SwapProgressTable{}; break;
      case RegionKind::kRequestStalls: new (at) StallBoard{}; break;
      case RegionKind::kSubmitRing:
        s = MpscRing::initialize(at, r.bytes, config.submit_ring_bytes,
                                 MpscRing::default_max_payload(config.submit_ring_bytes));
        break;
      case RegionKind::kCompletionRing:
        s = MpscRing::initialize(at, r.bytes, config.completion_ring_bytes,
                                 MpscRing::default_max_payload(config.completion_ring_bytes));
        break;
      case RegionKind::kTaskRing:
        s = MpscRing::initialize(at, r.bytes, config.task_ring_bytes,
                                 MpscRing::default_max_payload(config.task_ring_bytes));
        break;
      case RegionKind::kSignalRing:
        s = initialize_spsc_region(at, r.bytes, config.signal_ring_records,
                                   config.signal_record_bytes);
        break;
      case RegionKind::kReportRing:
        s = initialize_spsc_region(at, r.bytes, config.report_ring_records,
                                   config.report_record_bytes);
        break;
      case RegionKind::kClaimTable: initialize_claim_table({at, r.bytes}); break;
      case RegionKind::kLandedRing:
        s = MpscRing::initialize(at, r.bytes, kLandedRingBytes,
                                 MpscRing::default_max_payload(kLandedRingBytes));
        break;
    }
    if (!s) return s;
  }
  h->preamble.magic.store(kSegmentMagic, std::memory_order_release);  // publish
  return {};
}

Result<ControlSegment> ControlSegment::attach_when_published(std::string_view instance,
                                                             Deadline until, bool wait_out_stale) {
  for (;;) {
    Result<ControlSegment> c = attach(instance);
    const bool transient = c.code() == Errc::kNotFound || c.code() == Errc::kNotReady ||
                           (wait_out_stale && c.code() == Errc::kStale);
    if (c || !transient || until.passed()) return c;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Result<ControlSegment> ControlSegment::attach(std::string_view instance,
                                              const AttachOptions& options) {
  if (Status s = validate_instance_name(instance); !s) return s.error();
  const std::string name = control_segment_name(instance);
  Result<SharedSegment> opened = SharedSegment::open(name, options.access);
  if (!opened) {
    if (opened.code() == Errc::kNotFound)
      return make_error(Errc::kNotFound,
                        fmt::format("instance '{}' does not exist (no segment /{}): is its "
                                    "coordinator running?",
                                    instance, name));
    return opened.error();
  }
  ControlSegment seg(std::move(opened).value());
  if (Status s = validate_control_header(seg.segment_.data(), seg.segment_.size(), name,
                                         options.allow_unpublished);
      !s) {
    return s.error();
  }
  const auto& p = *reinterpret_cast<const SegmentPreamble*>(seg.segment_.data());
  if (p.magic.load(std::memory_order_acquire) != 0) {
    // Copy, then validate the copy: the shared header may change under us.
    InstanceConfig copy{};
    std::memcpy(&copy, &seg.header().config, sizeof(copy));
    if (Status s = validate_config(copy); !s)
      return make_error(Errc::kCorrupt, fmt::format("segment /{}: {}", name, s.error().message));
    if (plan_control_layout(copy).total_bytes != seg.segment_.size())
      return make_error(Errc::kSizeMismatch,
                        fmt::format("segment /{} changed size while being attached", name));
    seg.adopt(copy);
  }
  if (!options.allow_stale) {
    const CreatorStatus creator = creator_status(p, seg.locks());
    if (!creator.alive())
      return make_error(Errc::kStale,
                        fmt::format("instance '{}' is stale: {}; start a coordinator to replace "
                                    "it",
                                    instance, creator.describe()));
  }
  return seg;
}

InstanceState ControlSegment::state() const {
  const uint32_t s = header().state.load(std::memory_order_acquire);
  return s <= static_cast<uint32_t>(InstanceState::kDead) ? static_cast<InstanceState>(s)
                                                          : InstanceState::kDead;
}

void ControlSegment::set_state(InstanceState s) const {
  header().state.store(static_cast<uint32_t>(s), std::memory_order_release);
  notify_waiters(status().state_changed);
}

void ControlSegment::adopt(const InstanceConfig& config) {
  config_ = config;
  regions_ = plan_control_layout(config).regions;
}

std::span<std::byte> ControlSegment::region(RegionKind kind, uint32_t index) const {
  for (const RegionEntry& r : regions_) {
    if (r.kind == static_cast<uint32_t>(kind) && r.index == index) {
      if (r.offset > segment_.size() || r.bytes > segment_.size() - r.offset) return {};
      return {segment_.data() + r.offset, r.bytes};
    }
  }
  return {};
}

LockSpace ControlSegment::lock_of(const void* in_segment) const {
  const auto offset =
      static_cast<uint64_t>(static_cast<const std::byte*>(in_segment) - segment_.data());
  return LockSpace{segment_.fd(), offset};
}

bool ControlSegment::lock_rank(uint32_t rank) const {
  return rank < config_.tp_size && lock_of(&worker_slot(rank)).try_lock();
}

LockState ControlSegment::rank_liveness(uint32_t rank) const {
  if (rank >= config_.tp_size) return LockState::kUnknown;
  return lock_of(&worker_slot(rank)).probe();
}

LivenessSlot* ControlSegment::liveness() const {
  return reinterpret_cast<LivenessSlot*>(region(RegionKind::kLiveness).data());
}

CountersBlock& ControlSegment::counters(uint32_t block) const {
  return reinterpret_cast<CountersBlock*>(region(RegionKind::kCounters).data())[block];
}

InstanceStatus& ControlSegment::status() const {
  return *reinterpret_cast<InstanceStatus*>(region(RegionKind::kStatus).data());
}

StallBoard& ControlSegment::request_stalls() const {
  return *reinterpret_cast<StallBoard*>(region(RegionKind::kRequestStalls).data());
}

SwapProgressTable& ControlSegment::swap_progress() const {
  return *reinterpret_cast<SwapProgressTable*>(region(RegionKind::kSwapProgress).data());
}

PoolDirectory& ControlSegment::pool_directory() const {
  return *reinterpret_cast<PoolDirectory*>(region(RegionKind::kPoolDirectory).data());
}

BarrierState& ControlSegment::barrier() const {
  return *reinterpret_cast<BarrierState*>(region(RegionKind::kBarrier).data());
}

Result<MpscRing> ControlSegment::mpsc(RegionKind kind, uint32_t index) const {
  auto r = region(kind, index);
  if (r.empty())
    return make_error(Errc::kNotFound,
                      fmt::format("no {}[{}] in this segment",
                                  region_kind_name(static_cast<uint32_t>(kind)), index));
  return MpscRing::attach(r.data(), r.size(), lock_of(r.data()));
}

Status ControlSegment::unlink() const {
  Result<SharedSegment> current = SharedSegment::open(segment_.name(), SegmentAccess::kReadOnly);
  if (!current) return current.code() == Errc::kNotFound ? Status{} : Status(current.error());
  if (current->inode() != segment_.inode()) return {};  // a successor owns the name now
  return SharedSegment::unlink(segment_.name());
}

}  // namespace kvrelay
