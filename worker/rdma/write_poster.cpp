#include "worker/rdma/write_poster.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace kvrelay::worker::rdma {

WritePoster::WritePoster(std::vector<QueuePair*> queue_pairs, uint32_t signal_every)
    : signal_every_(std::max(1U, signal_every)) {
  for (QueuePair* qp : queue_pairs) {
    Lane lane;
    lane.qp = qp;
    lane.capacity = qp->max_send_wr();
    lanes_.push_back(std::move(lane));
  }
}

std::optional<size_t> WritePoster::next_queue_pair() {
  for (size_t tried = 0; tried < lanes_.size(); ++tried) {
    const size_t index = round_robin_++ % lanes_.size();
    if (!lanes_[index].failed) return index;
  }
  return std::nullopt;
}

WritePoster::Lane* WritePoster::next_lane() {
  const std::optional<size_t> index = next_queue_pair();
  return index ? &lanes_[*index] : nullptr;
}

void WritePoster::submit(LayerWrite transfer) {
  Lane* lane = nullptr;
  std::string why;
  if (transfer.writes.empty()) {
    why = "an rdma transfer with nothing to write";
  } else if (transfer.queue_pair) {
    if (*transfer.queue_pair >= lanes_.size())
      why = fmt::format("an rdma transfer for queue pair {} of {}", *transfer.queue_pair,
                        lanes_.size());
    else if (lanes_[*transfer.queue_pair].failed)
      why = fmt::format("{} has failed", lanes_[*transfer.queue_pair].qp->name());
    else
      lane = &lanes_[*transfer.queue_pair];
  } else {
    lane = next_lane();
    if (lane == nullptr) why = "every queue pair to this peer has failed";
  }
  if (lane == nullptr) {
    early_.push_back({transfer.transfer, make_error(Errc::kAborted, why)});
    return;
  }
  lane->waiting.push_back({std::move(transfer), 0});
  post(*lane, early_);
}

void WritePoster::progress(std::vector<TransferDone>& done) {
  done.insert(done.end(), early_.begin(), early_.end());
  early_.clear();
  for (Lane& lane : lanes_) {
    if (lane.failed) continue;
    reap(lane, done);
    if (!lane.failed) post(lane, done);
  }
}

size_t WritePoster::transfers_in_flight() const {
  size_t n = 0;
  for (const Lane& lane : lanes_)
    n += lane.waiting.size() + lane.posted.size();
  return n;
}

void WritePoster::replace(size_t index, QueuePair* queue_pair) {
  Lane fresh;
  fresh.qp = queue_pair;
  fresh.capacity = queue_pair->max_send_wr();
  lanes_[index] = std::move(fresh);
}

void WritePoster::post(Lane& lane, std::vector<TransferDone>& done) {
  uint64_t budget = kMaxPostBytesPerCall;
  while (!lane.waiting.empty() && lane.outstanding < lane.capacity && budget > 0) {
    Waiting& w = lane.waiting.front();
    const std::vector<WriteRequest>& writes = w.transfer.writes;
    const size_t room = lane.capacity - lane.outstanding;
    size_t n = std::min({kMaxChain, room, writes.size() - w.next});
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      bytes += writes[w.next + i].length;
      if (bytes >= budget) {
        n = i + 1;
        break;
      }
    }
    budget -= std::min(budget, bytes);
    chain_.assign(writes.begin() + static_cast<std::ptrdiff_t>(w.next),
                  writes.begin() + static_cast<std::ptrdiff_t>(w.next + n));
    uint32_t since = lane.uncovered;
    for (size_t i = 0; i < n; ++i) {
      WriteRequest& wr = chain_[i];
      wr.wr_id = lane.next_wr_id + i;
      const bool last_of_transfer = w.next + i + 1 == writes.size();
      wr.immediate.reset();
      if (last_of_transfer) wr.immediate = w.transfer.immediate;
      wr.signaled = ++since >= signal_every_ || i + 1 == n || last_of_transfer;
      if (wr.signaled) since = 0;
    }
    Result<size_t> accepted = lane.qp->post_writes(chain_);
    if (!accepted) {
      fail(lane, fmt::format("{}: post failed: {}", lane.qp->name(), accepted.error().message),
           done);
      return;
    }
    const size_t k = std::min(*accepted, n);
    for (size_t i = 0; i < k; ++i) {
      ++lane.uncovered;
      if (chain_[i].signaled) {
        lane.signals.emplace_back(chain_[i].wr_id, lane.uncovered);
        lane.uncovered = 0;
      }
    }
    lane.outstanding += static_cast<uint32_t>(k);
    lane.next_wr_id += k;
    w.next += k;
    if (w.next == writes.size()) {
      lane.posted.push_back({w.transfer.transfer, chain_[k - 1].wr_id});
      lane.waiting.pop_front();
    }
    if (k < n) {
      // The device has fewer slots than it said: use what it took as the limit.
      lane.capacity = lane.outstanding;
      if (lane.signals.empty()) {
        fail(lane,
             fmt::format("{}: the send queue is full with no signaled write outstanding",
                         lane.qp->name()),
             done);
      }
      return;
    }
  }
}

void WritePoster::reap(Lane& lane, std::vector<TransferDone>& done) {
  std::array<WorkCompletion, 64> wcs;
  for (;;) {
    const size_t n = lane.qp->poll_send(wcs);
    for (size_t i = 0; i < n; ++i) {
      const WorkCompletion& wc = wcs[i];
      if (!wc.ok) {
        fail(lane, fmt::format("{}: a write completed with '{}'", lane.qp->name(), wc.status),
             done);
        return;
      }
      // Every write up to this one is done.
      while (!lane.signals.empty() && lane.signals.front().first <= wc.wr_id) {
        lane.outstanding -= lane.signals.front().second;
        lane.signals.pop_front();
      }
      while (!lane.posted.empty() && lane.posted.front().last_wr_id <= wc.wr_id) {
        done.push_back({lane.posted.front().transfer, {}});
        lane.posted.pop_front();
      }
    }
    if (n < wcs.size()) return;
  }
}

void WritePoster::fail(Lane& lane, const std::string& why, std::vector<TransferDone>& done) {
  lane.failed = true;
  for (const Posted& p : lane.posted)
    done.push_back({p.transfer, make_error(Errc::kAborted, why)});
  lane.posted.clear();
  // Started transfers fail with it; those not started go to a lane that works.
  std::deque<Waiting> waiting = std::move(lane.waiting);
  lane.waiting.clear();
  for (Waiting& w : waiting) {
    Lane* other = w.next == 0 && !w.transfer.queue_pair ? next_lane() : nullptr;
    if (other == nullptr) {
      done.push_back({w.transfer.transfer, make_error(Errc::kAborted, why)});
      continue;
    }
    other->waiting.push_back(std::move(w));
  }
  lane.signals.clear();
  lane.outstanding = 0;
  lane.uncovered = 0;
}

}  // namespace kvrelay::worker::rdma
