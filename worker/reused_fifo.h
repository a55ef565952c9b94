// A FIFO queue that keeps its memory: std::deque allocates and frees a chunk
// every few elements as items pass through it, which the hot paths must not
// (docs/latency.md). Items live in one vector; popping advances a head, and
// the vector is emptied (its capacity kept) whenever the queue drains, or
// compacted once the popped prefix outgrows the live part.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace kvrelay::worker {

template <class T>
class ReusedFifo {
 public:
  bool empty() const { return head_ == items_.size(); }
  size_t size() const { return items_.size() - head_; }
  T& front() { return items_[head_]; }
  void push_back(T item) {
    if (head_ != 0 && head_ >= items_.size() / 2) compact();
    items_.push_back(std::move(item));
  }
  void pop_front() {
    items_[head_] = T{};  // drop what it holds now, not when the slot is reused
    if (++head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    }
  }
  std::span<T> live() { return std::span<T>(items_).subspan(head_); }

 private:
  void compact() {
    // Moves within the vector's capacity: no allocation.
    size_t out = 0;
    for (size_t i = head_; i < items_.size(); ++i)
      items_[out++] = std::move(items_[i]);
    items_.resize(out);
    head_ = 0;
  }
  std::vector<T> items_;
  size_t head_ = 0;
};

}  // namespace kvrelay::worker
