// What this process enqueued on streams it does not own (an engine's), and
// whether that work is done yet, without ever touching those streams again.
//
// The client enqueues layer-signal kernels and stream waits on the engine's
// streams, and before its teardown frees what they point at (signal words,
// step bases, pinned pages) it must know they have run. Asking the stream
// (cudaStreamQuery) is not safe: an engine may destroy its stream before
// the client, and a destroyed stream's handle is a dangling pointer inside
// the driver (the first GPU run crashed there: cuStreamQuery in teardown,
// after the test had destroyed its stream). So every enqueue is followed by
// a record of an event this object owns; teardown queries the events, which
// live as long as this object does, whatever became of the streams.
//
// Work enqueued while a stream is being captured into a graph is not
// marked: a record there would become a node of the engine's graph. A graph
// replayed after the client is gone is the engine's error (kvrelay/client.h
// says graphs are re-captured with a new client); one replayed before it
// ends is seen through its completions.
#pragma once

#include <chrono>
#include <mutex>
#include <vector>

#include "shm/result.h"

namespace kvrelay::kernels {

class StreamMarks {
 public:
  StreamMarks() = default;
  ~StreamMarks();  // destroys the events (their work done or not: a record keeps no memory)
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;

  // After enqueueing on `stream`: everything on it so far is marked. Not
  // marked (and not an error) while the stream is being captured.
  Status mark(void* stream);
  // Whether every marked piece of work is done within `wait` (polled).
  bool done_within(std::chrono::milliseconds wait);
  // Streams marked so far (tests, logs).
  size_t streams() const;

 private:
  struct Mark {
    void* stream = nullptr;  // only a key: never used as a stream again
    void* event = nullptr;   // cudaEvent_t, owned
    int device = 0;          // the device whose context created the event
  };
  mutable std::mutex mu_;
  std::vector<Mark> marks_;
};

}  // namespace kvrelay::kernels
