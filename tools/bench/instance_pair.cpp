#include "instance_pair.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

namespace kvrelay::bench {

Result<std::unique_ptr<InstancePair>> InstancePair::start(const sim::Geometry& g,
                                                          const std::string& tag,
                                                          const std::vector<std::string>& prefill_extra) {
  std::unique_ptr<InstancePair> pair(new InstancePair());
  pair->tp_ = g.tp;
  const std::string prefill_name = fmt::format("bench{}{}p", tag, getpid());
  pair->decode_name_ = fmt::format("bench{}{}d", tag, getpid());
  // Logs go to files: the benchmark's output stays readable.
  const std::string log_dir =
      (std::filesystem::temp_directory_path() / "kvrelay-bench-logs").string();
  if (Status s =
          pair->decode_instance_.start(pair->decode_name_, "decode", g, log_dir, "warn");
      !s)
    return s.error();
  if (Status s =
          pair->prefill_instance_.start(prefill_name, "prefill", g, log_dir, "warn", prefill_extra);
      !s)
    return s.error();
  const Deadline ready_by = Deadline::after(std::chrono::seconds(60));
  auto decode = Client::attach(pair->decode_name_, ready_by);
  if (!decode) return decode.error();
  auto prefill = Client::attach(prefill_name, ready_by);
  if (!prefill) return prefill.error();
  pair->decode_client_ = std::make_unique<Client>(std::move(decode).value());
  pair->prefill_client_ = std::make_unique<Client>(std::move(prefill).value());
  Result<ControlSegment> control = ControlSegment::attach(
      prefill_name, AttachOptions{.access = SegmentAccess::kReadOnly});
  if (!control) return control.error();
  pair->prefill_control_ = std::make_unique<ControlSegment>(std::move(control).value());
  for (uint32_t r = 0; r < g.tp; ++r) {
    auto src = pair->prefill_client_->open_pool(r, PoolTier::kDevice);
    if (!src) return src.error();
    auto dst = pair->decode_client_->open_pool(r, PoolTier::kDevice);
    if (!dst) return dst.error();
    pair->src_.push_back(std::make_unique<PoolView>(std::move(src).value()));
    pair->dst_.push_back(std::make_unique<PoolView>(std::move(dst).value()));
  }
  return pair;
}

InstancePair::~InstancePair() {
  src_.clear();
  dst_.clear();
  prefill_control_.reset();
  prefill_client_.reset();
  decode_client_.reset();
  prefill_instance_.stop();
  decode_instance_.stop();
}

}  // namespace kvrelay::bench
