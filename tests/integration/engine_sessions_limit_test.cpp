// Engine sessions at the limit: an instance's submit ring has a fixed number
// of producer slots (kMpscProducerSlots), one per attached client. With
// every slot taken, the next engine must be refused at once with an error
// that says why, while every attached engine keeps working; a slot given
// back, cleanly or by a SIGKILLed engine, must serve the next one.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

#include "integration/dump_json.h"
#include "shm/mpsc_ring.h"
#include "support/instance.h"
#include "support/processes.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

// Attaches clients until one is refused (at most `limit`); returns them, and
// the refusal in `refused`.
std::vector<Client> attach_until_refused(const std::string& instance, size_t limit,
                                         std::optional<Error>& refused) {
  std::vector<Client> clients;
  while (clients.size() < limit) {
    Result<Client> c = Client::attach(instance, Deadline::after(30s));
    if (!c) {
      refused = c.error();
      break;
    }
    clients.push_back(std::move(c).value());
  }
  return clients;
}

// A cancel of an unknown id costs nothing and is answered `rejected`: proof
// that a client's session still reaches the coordinator and back.
void expect_round_trip(Client& submitter, Client& reader, const std::string& id) {
  ASSERT_TRUE(submitter.cancel(id, Deadline::after(10s)).ok()) << id;
  const Deadline until = Deadline::after(30s);
  while (!until.passed()) {
    Result<std::optional<Completion>> got = reader.poll();
    ASSERT_TRUE(got.ok()) << got.error().message;
    if (!got->has_value()) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    EXPECT_EQ((*got)->request_id, id);
    EXPECT_EQ((*got)->status, CompletionStatus::kRejected);
    return;
  }
  FAIL() << "no answer to the cancel of '" << id << "'";
}

// A child engine attaches (taking a slot) and is SIGKILLed holding it.
void attach_and_die(const std::string& instance) {
  SharedRegion shared(sizeof(std::atomic<int>));
  auto& attached = *new (shared.data()) std::atomic<int>{0};
  const pid_t engine = fork_child([&] {
    Result<Client> c = Client::attach(instance, Deadline::after(30s));
    if (!c) return 2;
    attached.store(1);
    for (;;)
      pause();
  });
  const Deadline until = Deadline::after(30s);
  while (attached.load() == 0 && !until.passed())
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(attached.load(), 1) << "the child engine attached";
  ASSERT_EQ(kill(engine, SIGKILL), 0);
  const std::optional<ChildExit> exit = wait_child(engine, 10s);
  ASSERT_TRUE(exit.has_value() && exit->signal == SIGKILL);
}

TEST(EngineSessions, EverySlotTakenRefusesTheNextEngineSayingWhyAndAFreedSlotServesAgain) {
  InstanceArgs a;
  a.instance = current_test_instance();
  a.tp = 1;
  auto inst = Instance::start(a);

  std::optional<Error> refused;
  std::vector<Client> clients = attach_until_refused(inst->name(), kMpscProducerSlots + 8, refused);
  ASSERT_TRUE(refused.has_value()) << "more engines attached than the ring has producer slots";
  // The harness's own client (inst->client()) holds one slot; nobody else
  // holds any: every other went to an engine here.
  EXPECT_EQ(clients.size() + 1, kMpscProducerSlots);
  EXPECT_EQ(refused->code, Errc::kBusy);
  EXPECT_NE(refused->message.find("cannot open a session"), std::string::npos) << refused->message;
  EXPECT_NE(refused->message.find(std::to_string(kMpscProducerSlots) + " producer slots"),
            std::string::npos)
      << refused->message;
  EXPECT_NE(refused->message.find("kvrelay-dump lists the sessions"), std::string::npos)
      << refused->message;

  // kvrelay-dump shows every slot held, by this process, and calls it a problem.
  const nlohmann::json full = dump_json(inst->name());
  ASSERT_FALSE(full.is_discarded());
  const nlohmann::json submit = ring_json(full, "submit");
  ASSERT_TRUE(submit.is_object());
  EXPECT_EQ(submit["producer_slots"], kMpscProducerSlots);
  ASSERT_EQ(submit["producer_pids"].size(), kMpscProducerSlots);
  for (const auto& pid : submit["producer_pids"])
    EXPECT_EQ(pid, static_cast<uint32_t>(getpid()));
  const auto& problems = full["problems"];
  EXPECT_TRUE(std::any_of(problems.begin(), problems.end(), [](const nlohmann::json& p) {
    return p.get<std::string>().find("every engine session is taken (128 of 128)") !=
           std::string::npos;
  })) << problems.dump();

  std::string text;
  run_program({Instance::bin("kvrelay-dump"), inst->name()}, &text);
  EXPECT_NE(
      text.find(fmt::format("sessions 128 of 128 engine sessions open: pid {} (x128)", getpid())),
      std::string::npos)
      << text;

  std::string metrics;
  run_program({Instance::bin("kvrelay-dump"), inst->name(), "--prometheus"}, &metrics);
  const size_t sample = metrics.find("\nkvrelay_engine_sessions{");
  ASSERT_NE(sample, std::string::npos) << metrics;
  const std::string line = metrics.substr(sample + 1, metrics.find('\n', sample + 1) - sample - 1);
  EXPECT_NE(line.find(fmt::format("instance=\"{}\"", inst->name())), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with("} 128")) << line;

  // The refusal cost the attached engines nothing: the first and the last
  // still submit, and one of them reads the answers.
  expect_round_trip(clients.front(), clients.front(), "first-engine");
  expect_round_trip(clients.back(), clients.front(), "last-engine");

  // A slot given back cleanly serves the next engine.
  clients.pop_back();
  Result<Client> next = Client::attach(inst->name(), Deadline::after(30s));
  ASSERT_TRUE(next.ok()) << next.error().message;
  expect_round_trip(*next, clients.front(), "after-a-clean-detach");
  clients.push_back(std::move(next).value());
  std::optional<Error> again;
  EXPECT_TRUE(attach_until_refused(inst->name(), 1, again).empty());
  EXPECT_TRUE(again.has_value());

  // And so does one held by an engine that was SIGKILLed: a child takes the
  // last slot and dies holding it.
  clients.pop_back();
  ASSERT_NO_FATAL_FAILURE(attach_and_die(inst->name()));
  Result<Client> successor = Client::attach(inst->name(), Deadline::after(30s));
  ASSERT_TRUE(successor.ok()) << successor.error().message;
  expect_round_trip(*successor, clients.front(), "after-a-killed-engine");

  // A slot whose holder died is not counted as a session.
  clients.erase(clients.begin() + 10, clients.end());
  successor = make_error(Errc::kAborted, "dropped");
  ASSERT_NO_FATAL_FAILURE(attach_and_die(inst->name()));
  const nlohmann::json after = dump_json(inst->name());
  EXPECT_EQ(ring_json(after, "submit")["producer_pids"].size(), 11u)
      << "the ten clients left and the harness's own, not the killed engine's";
  for (const auto& p : after["problems"])
    EXPECT_EQ(p.get<std::string>().find("engine session"), std::string::npos) << p;
}

}  // namespace
}  // namespace kvrelay::testing
