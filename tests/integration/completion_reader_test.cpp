// One completion reader per instance, enforced: many
// engine processes attached to one instance at once, each submitting and
// trying to read. Exactly one becomes the reader and receives every
// completion whole and once; every other is refused with kBusy naming the
// reader; when the reader goes (cleanly or SIGKILLed), the next one takes
// over and finds exactly what the old one had not read.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "integration/dump_json.h"
#include "support/instance.h"
#include "support/processes.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kEngines = 16;
#else
constexpr int kEngines = 60;
#endif
constexpr int kCancelsEach = 5;

// What the engine processes tell the test.
struct Board {
  std::atomic<int> tried;    // engines that have asked to read
  std::atomic<int> go;       // the reader may read now
  std::atomic<int> done;     // the reader has read (refused engines live until then:
                             // a dead session's completions are dropped, by contract)
  std::atomic<int> readers;  // engines that became the reader
  std::atomic<int> reader_pid;
  char refusal[kEngines][512];  // each refused engine's message
};

std::string id_of(int engine, int k) {
  return "p" + std::to_string(engine) + "-" + std::to_string(k);
}

// Reads until `expected` distinct cancel answers arrived (or 30 s), each
// checked whole: returns the problems found (0: all there, once, intact).
int read_answers(Client& c, const std::set<std::string>& expected) {
  std::set<std::string> seen;
  int problems = 0;
  const Deadline until = Deadline::after(30s);
  while (seen.size() < expected.size() && !until.passed()) {
    Result<Completion> got = c.wait(until);
    if (!got) {
      std::fprintf(stderr, "reader: %s\n", got.error().message.c_str());
      ++problems;
      break;
    }
    const std::string want = "Cancel '" + got->request_id + "': no live request has this id";
    if (got->kind != CompletionKind::kCancel || got->status != CompletionStatus::kRejected ||
        got->message != want || expected.count(got->request_id) == 0 ||
        !seen.insert(got->request_id).second) {
      std::fprintf(stderr, "reader: unexpected completion '%s' (%s): %s\n", got->request_id.c_str(),
                   completion_status_name(got->status), got->message.c_str());
      ++problems;
    }
  }
  if (seen.size() != expected.size()) {
    std::fprintf(stderr, "reader: %zu of %zu completions arrived\n", seen.size(), expected.size());
    ++problems;
  }
  return problems;
}

Status cancel_all(Client& c, const std::set<std::string>& ids) {
  for (const std::string& id : ids)
    if (Status s = c.cancel(id, Deadline::after(10s)); !s) return s;
  return {};
}

TEST(CompletionReader, ManyEnginesAtOnceOneReadsEveryCompletionWholeTheOthersAreToldWho) {
  InstanceArgs a;
  a.instance = current_test_instance();
  a.tp = 2;
  auto inst = Instance::start(a);
  SharedRegion shared(sizeof(Board));
  Board& board = *new (shared.data()) Board{};
  std::set<std::string> all;
  for (int e = 0; e < kEngines; ++e)
    for (int k = 0; k < kCancelsEach; ++k)
      all.insert(id_of(e, k));

  std::vector<pid_t> engines;
  for (int e = 0; e < kEngines; ++e) {
    engines.push_back(fork_child([&, e] {
      Result<Client> c = Client::attach(inst->name(), Deadline::after(60s));
      if (!c) return 2;
      std::set<std::string> mine;
      for (int k = 0; k < kCancelsEach; ++k)
        mine.insert(id_of(e, k));
      if (!cancel_all(*c, mine)) return 3;
      Status own = c->own_completions();
      if (own.ok()) {
        board.readers.fetch_add(1);
        board.reader_pid.store(getpid());
      } else {
        std::strncpy(board.refusal[e], own.error().message.c_str(), sizeof(board.refusal[e]) - 1);
      }
      board.tried.fetch_add(1);
      if (!own) {
        // A refused engine stays refused while the reader lives, whatever it calls.
        Result<std::optional<Completion>> polled = c->poll();
        const Deadline limit = Deadline::after(90s);
        while (board.done.load() == 0 && !limit.passed())
          std::this_thread::sleep_for(5ms);
        return !polled && polled.code() == Errc::kBusy ? 10 : 4;
      }
      while (board.go.load() == 0)
        std::this_thread::sleep_for(1ms);
      const int problems = read_answers(*c, all);
      board.done.store(1);
      return problems == 0 ? 0 : 5;
    }));
  }
  const Deadline until = Deadline::after(120s);
  while (board.tried.load() < kEngines && !until.passed())
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(board.tried.load(), kEngines) << "every engine attached, submitted and asked to read";
  ASSERT_EQ(board.readers.load(), 1) << "exactly one engine reads";
  board.go.store(1);
  const std::string holder = "pid " + std::to_string(board.reader_pid.load());
  int refused = 0;
  for (int e = 0; e < kEngines; ++e) {
    const std::optional<ChildExit> exit = wait_child(engines[e], 60s);
    ASSERT_TRUE(exit.has_value()) << "engine " << e << " hung";
    ASSERT_TRUE(exit->exited) << "engine " << e << " died of signal " << exit->signal;
    if (exit->code == 10) {
      ++refused;
      const std::string why = board.refusal[e];
      EXPECT_NE(why.find("already read"), std::string::npos) << why;
      EXPECT_NE(why.find(holder), std::string::npos) << "names the reader: " << why;
      continue;
    }
    EXPECT_EQ(exit->code, 0) << "engine " << e << ": the reader saw every completion once, whole";
  }
  EXPECT_EQ(refused, kEngines - 1);

  // The reader is gone: the next one takes over, and finds nothing of what
  // the old one read.
  Result<Client> next = Client::attach(inst->name(), Deadline::after(30s));
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(next->own_completions().ok());
  Result<std::optional<Completion>> leftover = next->poll();
  ASSERT_TRUE(leftover.ok());
  EXPECT_FALSE(leftover->has_value()) << "nothing was left behind or delivered twice";
  EXPECT_EQ(inst->stop(), 0);
}

// A reader SIGKILLed with completions unread: its lease ends with its
// process, and the next reader finds exactly those completions, once.
TEST(CompletionReader, AKilledReadersUnreadCompletionsGoToTheNextReader) {
  InstanceArgs a;
  a.instance = current_test_instance();
  auto inst = Instance::start(a);
  ReadyPipe owned;
  const pid_t reader = fork_child([&] {
    Result<Client> c = Client::attach(inst->name(), Deadline::after(30s));
    if (!c || !c->own_completions()) return 2;
    owned.signal();
    for (;;)
      pause();  // reads nothing until killed
  });
  ASSERT_TRUE(owned.wait(30s));
  const nlohmann::json ring = ring_json(dump_json(inst->name()), "completion");
  EXPECT_EQ(ring["reader_pid"], reader) << "kvrelay-dump names the reader";
  Status busy = inst->client().own_completions();
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.code(), Errc::kBusy);
  EXPECT_NE(busy.error().message.find("pid " + std::to_string(reader)), std::string::npos)
      << busy.error().message;
  std::set<std::string> ids;
  for (int k = 0; k < 10; ++k)
    ids.insert("unread-" + std::to_string(k));
  ASSERT_TRUE(cancel_all(inst->client(), ids).ok()) << "any session may submit";
  kill_child(reader);
  ASSERT_TRUE(inst->client().own_completions().ok()) << "the lease went with its process";
  EXPECT_EQ(read_answers(inst->client(), ids), 0);
  Result<std::optional<Completion>> more = inst->client().poll();
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(more->has_value());
  EXPECT_EQ(inst->stop(), 0);
}

}  // namespace
}  // namespace kvrelay::testing
