// What lets the coordinator's dispatch path allocate nothing once warm
// (docs/latency.md): the nodes of its maps and the buffers of its messages
// are kept when an entry or a message goes, and given to the next.
//
//   NodePool<Map>   spare nodes of a std::map / unordered_map (C++17 node
//                   handles: a node moves out of the map and back in without
//                   being freed; a std::string key keeps its capacity).
//   MessageCopies   the table's own copies of submitted messages, each in a
//                   zeroed buffer that goes back to the pool with the copy.
//   ScratchMessage  a message to send, built in a zeroed buffer kept between
//                   messages.
//
// A buffer holds a message's first segment: capnp requires it zeroed, and
// MallocMessageBuilder zeroes what it used when it goes, so a buffer can be
// handed on as it is. A message larger than its buffer still works (capnp
// allocates further segments); only then does building it allocate.
//
// Not thread-safe: the coordinator's loop owns them.
#pragma once

#include <capnp/message.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace kvrelay::coordinator {

template <class Map>
class NodePool {
 public:
  using Node = typename Map::node_type;

  // Keeps at most `keep` spare nodes (the rest are freed).
  explicit NodePool(size_t keep) : keep_(keep) {}

  // A spare node, or an empty one when there is none.
  Node take() {
    if (spare_.empty()) return {};
    Node n = std::move(spare_.back());
    spare_.pop_back();
    return n;
  }
  void give(Node node) {
    if (node.empty() || spare_.size() >= keep_) return;  // freed here
    spare_.push_back(std::move(node));
  }
  // Takes `it` out of `map`, keeping its node.
  void erase(Map& map, typename Map::iterator it) { give(map.extract(it)); }
  // Adds key -> value to `map` (a map with unique keys: replaces the value
  // of a key already there), in a spare node when there is one.
  template <class K, class V>
  typename Map::iterator put(Map& map, K&& key, V&& value) {
    Node n = take();
    if (n.empty())
      return map.insert_or_assign(typename Map::key_type(std::forward<K>(key)), std::forward<V>(value))
          .first;
    n.key() = std::forward<K>(key);
    n.mapped() = std::forward<V>(value);
    auto r = map.insert(std::move(n));
    if (!r.inserted) {
      r.position->second = std::move(r.node.mapped());
      give(std::move(r.node));
    }
    return r.position;
  }
  // The same for a multimap (duplicates allowed).
  template <class K, class V>
  typename Map::iterator put_multi(Map& map, K&& key, V&& value) {
    Node n = take();
    if (n.empty()) return map.emplace(std::forward<K>(key), std::forward<V>(value));
    n.key() = std::forward<K>(key);
    n.mapped() = std::forward<V>(value);
    return map.insert(std::move(n));
  }
  size_t spare() const { return spare_.size(); }

 private:
  size_t keep_;
  std::vector<Node> spare_;
};

// A zeroed first segment for a message builder.
class SegmentBuffer {
 public:
  explicit SegmentBuffer(size_t words) : words_(std::max<size_t>(words, 2), 0) {}
  size_t words() const { return words_.size(); }
  // Grows (zeroed) to at least `words`: the one allocation, when a message outgrows it.
  void reserve(size_t words) {
    if (words > words_.size()) words_.assign(words, 0);
  }
  kj::ArrayPtr<capnp::word> segment() {
    return kj::arrayPtr(reinterpret_cast<capnp::word*>(words_.data()), words_.size());
  }

 private:
  std::vector<uint64_t> words_;
};

class MessageCopies {
  struct Buffer {
    explicit Buffer(size_t words) : segment(words) {}
    SegmentBuffer segment;
    std::optional<capnp::MallocMessageBuilder> builder;
  };

 public:
  // A copy of a message; goes back to its pool when it goes.
  class Copy {
   public:
    Copy() = default;
    Copy(Copy&& o) noexcept : pool_(o.pool_), buffer_(std::move(o.buffer_)) {}
    Copy& operator=(Copy&& o) noexcept {
      if (this != &o) {
        release();
        pool_ = o.pool_;
        buffer_ = std::move(o.buffer_);
      }
      return *this;
    }
    ~Copy() { release(); }
    capnp::MessageBuilder& message() { return *buffer_->builder; }

   private:
    friend class MessageCopies;
    Copy(MessageCopies* pool, std::unique_ptr<Buffer> buffer)
        : pool_(pool), buffer_(std::move(buffer)) {}
    void release() {
      if (buffer_) pool_->give(std::move(buffer_));
    }
    MessageCopies* pool_ = nullptr;
    std::unique_ptr<Buffer> buffer_;
  };

  // Keeps at most `keep` spare buffers, none larger than `keep_words`.
  MessageCopies(size_t keep, size_t keep_words) : keep_(keep), keep_words_(keep_words) {}

  // Copies `shared` (a struct reader) into a buffer of its exact size.
  template <class Reader>
  Copy copy(Reader shared) {
    // +1: the root pointer. The cap keeps a hostile size from reserving a
    // huge buffer up front (the traversal limit bounds the copy itself).
    const size_t words =
        static_cast<size_t>(std::min<uint64_t>(shared.totalSize().wordCount + 1, 1U << 20));
    std::unique_ptr<Buffer> b = take(words);
    b->builder.emplace(b->segment.segment());
    Copy c(this, std::move(b));
    c.message().setRoot(shared);
    return c;
  }
  size_t spare() const { return spare_.size(); }

 private:
  std::unique_ptr<Buffer> take(size_t words) {
    std::unique_ptr<Buffer> b;
    if (spare_.empty()) {
      b = std::make_unique<Buffer>(std::max<size_t>(words, kMinWords));
    } else {
      b = std::move(spare_.back());
      spare_.pop_back();
      b->segment.reserve(words);
    }
    return b;
  }
  void give(std::unique_ptr<Buffer> b) {
    b->builder.reset();  // zeroes what the message used
    if (spare_.size() < keep_ && b->segment.words() <= keep_words_) spare_.push_back(std::move(b));
  }
  static constexpr size_t kMinWords = 64;
  size_t keep_;
  size_t keep_words_;
  std::vector<std::unique_ptr<Buffer>> spare_;
};

// A message to send, built in its space's buffer unless another
// ScratchMessage holds it (then in a zeroed buffer of its own).
class ScratchMessage {
 public:
  struct Space {
    explicit Space(size_t words) : buffer(words) {}
    SegmentBuffer buffer;
    bool busy = false;
  };
  explicit ScratchMessage(Space& space)
      : space_(space.busy ? nullptr : &space),
        own_(space_ != nullptr ? nullptr : std::make_unique<uint64_t[]>(space.buffer.words())),
        builder_(space_ != nullptr
                     ? space.buffer.segment()
                     : kj::arrayPtr(reinterpret_cast<capnp::word*>(own_.get()),
                                    space.buffer.words())) {
    if (space_ != nullptr) space_->busy = true;
  }
  ~ScratchMessage() {
    if (space_ != nullptr) space_->busy = false;
  }  // builder_ goes first: it zeroes what the message used
  ScratchMessage(const ScratchMessage&) = delete;
  ScratchMessage& operator=(const ScratchMessage&) = delete;
  capnp::MallocMessageBuilder& operator*() { return builder_; }
  capnp::MallocMessageBuilder* operator->() { return &builder_; }

 private:
  Space* space_;
  std::unique_ptr<uint64_t[]> own_;  // zeroed (value-initialized)
  capnp::MallocMessageBuilder builder_;
};

}  // namespace kvrelay::coordinator
