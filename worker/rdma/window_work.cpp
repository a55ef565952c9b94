#include "worker/rdma/window_work.h"

#include <fmt/format.h>

namespace kvrelay::worker::rdma {

void WindowWork::bind(uint32_t tag, const std::vector<Bind>& binds) {
  if (binds.empty()) return empty_jobs_.push_back(tag);
  for (size_t i = 0; i < binds.size(); ++i)
    waiting_.push_back(Op{tag, i + 1 == binds.size(), true, binds[i], 0});
}

void WindowWork::invalidate(uint32_t tag, const std::vector<uint32_t>& rkeys) {
  if (rkeys.empty()) return empty_jobs_.push_back(tag);
  for (size_t i = 0; i < rkeys.size(); ++i)
    waiting_.push_back(Op{tag, i + 1 == rkeys.size(), false, Bind{}, rkeys[i]});
}

Status WindowWork::post() {
  while (!waiting_.empty() && in_flight_ < slots_) {
    const Op& op = waiting_.front();
    const uint64_t wr_id = next_wr_id_++;
    Status s = op.bind ? qp_.post_bind(*op.what.window, *op.what.region, op.what.address,
                                       op.what.bytes, wr_id, true)
                       : qp_.post_invalidate(op.rkey, wr_id, true);
    if (!s) return s;
    ++in_flight_;
    posted_.push_back(op);
    waiting_.pop_front();
  }
  return {};
}

Status WindowWork::complete(const WorkCompletion& wc, std::vector<uint32_t>& finished) {
  if (posted_.empty())
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("{}: a send completion that no window operation awaits", qp_.name()));
  const Op op = posted_.front();
  posted_.pop_front();
  --in_flight_;
  if (!wc.ok)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("{}: a memory window {} completed with '{}'", qp_.name(),
                                  op.bind ? "bind" : "invalidation", wc.status));
  if (op.last) finished.push_back(op.tag);
  return post();
}

void WindowWork::take_empty(std::vector<uint32_t>& finished) {
  finished.insert(finished.end(), empty_jobs_.begin(), empty_jobs_.end());
  empty_jobs_.clear();
}

}  // namespace kvrelay::worker::rdma
