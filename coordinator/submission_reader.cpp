#include "coordinator/submission_reader.h"

#include <fmt/format.h>

#include "schemas/codec.h"
#include "schemas/records.h"

namespace kvrelay::coordinator {

namespace {

using schema::MessageType;

template <class T, class Fn>
void decode(const MpscRecord& rec, const char* what, TaskTable& table, SubmissionStats& stats,
            uint32_t session, uint64_t now_ns, Fn&& fn) {
  Status s = messages::with_message<T>(rec.payload, [&](typename T::Reader r) -> Status {
    fn(r);
    return {};
  });
  if (!s) {
    ++stats.malformed;
    table.on_malformed(what, s.error().message, now_ns, session);
  }
}

}  // namespace

void dispatch_submission(const MpscRecord& rec, TaskTable& table, EngineSessions& sessions,
                         SubmissionStats& stats, uint64_t now_ns) {
  const uint32_t session = records::session_id(rec.producer, rec.session);
  if (rec.producer < kMpscProducerSlots) sessions.seen(rec.producer, rec.session);
  if (rec.defect != nullptr) {
    ++stats.malformed;
    table.on_malformed(fmt::format("record of type {} and {} bytes", rec.type, rec.payload.size()),
                       rec.defect, now_ns, session);
    return;
  }
  switch (static_cast<MessageType>(rec.type)) {
    case MessageType::SESSION_HELLO:
      // Answered by acknowledging the session, not by a completion.
      decode<schema::SessionHello>(rec, "SessionHello", table, stats, session, now_ns, [&](auto) {
        ++stats.hellos;
        if (rec.producer < kMpscProducerSlots) sessions.hello(rec.producer, rec.session);
      });
      return;
    case MessageType::CACHE_TASK:
      decode<schema::CacheTask>(rec, "CacheTask", table, stats, session, now_ns,
                                [&](auto r) { table.on_cache_task(r, now_ns, session); });
      return;
    case MessageType::CACHE_DEST:
      decode<schema::CacheDest>(rec, "CacheDest", table, stats, session, now_ns,
                                [&](auto r) { table.on_cache_dest(r, now_ns, session); });
      return;
    case MessageType::SWAP_TASK:
      decode<schema::SwapTask>(rec, "SwapTask", table, stats, session, now_ns,
                               [&](auto r) { table.on_swap(r, now_ns, session); });
      return;
    case MessageType::EXPECT_ARRIVAL:
      decode<schema::ExpectArrival>(rec, "ExpectArrival", table, stats, session, now_ns,
                                    [&](auto r) { table.on_expect(r, now_ns, session); });
      return;
    case MessageType::CONNECT_TASK:
      decode<schema::ConnectTask>(rec, "ConnectTask", table, stats, session, now_ns,
                                  [&](auto r) { table.on_connect(r, now_ns, session); });
      return;
    case MessageType::CANCEL:
      decode<schema::Cancel>(rec, "Cancel", table, stats, session, now_ns,
                             [&](auto r) { table.on_cancel(r, now_ns, session); });
      return;
    case MessageType::REGISTER_POOL:
      decode<schema::RegisterPool>(rec, "RegisterPool", table, stats, session, now_ns,
                                   [&](auto r) { table.on_register_pool(r, now_ns, session); });
      return;
    default:
      ++stats.malformed;
      table.on_malformed(fmt::format("record of type {}", rec.type),
                         "not a message an engine may submit", now_ns, session);
  }
}

}  // namespace kvrelay::coordinator
