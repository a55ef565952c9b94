#include "worker/task_dispatch.h"

namespace kvrelay::worker {

using records::ReportKind;

namespace {

// A RegisterPool, answered whether or not the rank had a pool before.
void register_pool(schema::WorkerTask::Reader t, DataPlane& data, ReportOutbox& reports,
                   TaskEffect& effect) {
  const PoolRegistration r = data.register_pool(t.getRegisterPool());
  reports.report(t.getHandle(),
                 r.registered ? ReportKind::kPoolRegistered : ReportKind::kPoolRejected, 0,
                 r.message);
  if (r.broken) effect.broken = r.message;
}

// --pool none before the engine registered a pool: every request fails
// once, saying why, and the registration that ends this is served.
TaskEffect dispatch_without_pool(schema::WorkerTask::Reader t, DataPlane& data,
                                 ReportOutbox& reports) {
  const uint64_t h = t.getHandle();
  TaskEffect effect;
  switch (t.which()) {
    case schema::WorkerTask::BIND:
    case schema::WorkerTask::EXPECT:
    case schema::WorkerTask::SWAP:
      reports.report(h, ReportKind::kFailed, 0, data.no_pool_reason());
      break;
    // A request's second half: its first one already failed it (a second
    // report would be a stray one).
    case schema::WorkerTask::DEST: break;
    case schema::WorkerTask::CONNECT:
      reports.report(h, ReportKind::kConnectFailed, 0, data.no_pool_reason());
      break;
    // Nothing of it ran here: the answer that lets the coordinator settle it.
    case schema::WorkerTask::CANCEL: reports.report(h, ReportKind::kCancelled, 0, ""); break;
    case schema::WorkerTask::REGISTER_POOL:
      register_pool(t, data, reports, effect);
      break;
    case schema::WorkerTask::SHUTDOWN: effect.shutdown = true; break;
    case schema::WorkerTask::SESSION_ENDED: effect.session_ended = t.getSessionEnded(); break;
  }
  return effect;
}

}  // namespace

TaskEffect dispatch_task(schema::WorkerTask::Reader t, uint32_t rank, DataPlane& data,
                         ReportOutbox& reports, const std::function<bool()>& apply_signals,
                         uint64_t read_ns) {
  const uint64_t h = t.getHandle();
  if (!data.serving()) return dispatch_without_pool(t, data, reports);
  SendScheduler& scheduler = data.scheduler();
  Transports& transports = data.transports();
  SwapEngine* swap = data.swap();
  TaskEffect effect;
  switch (t.which()) {
    case schema::WorkerTask::BIND: {
      // Every signal the engine pushed before it submitted this task is in
      // the signal ring by now (the task reached us through the engine's
      // submit, the coordinator and our task ring, each a release/acquire
      // handoff). Apply them first, so that the slot's previous request
      // sees the end of its prefill before the slot changes hands.
      while (apply_signals()) {
      }
      const auto task = t.getBind();
      std::optional<uint64_t> watermark;
      if (task.hasSignalWatermarks() && rank < task.getSignalWatermarks().size())
        watermark = task.getSignalWatermarks()[rank];
      scheduler.on_bind(h, task, watermark);
      break;
    }
    case schema::WorkerTask::DEST: scheduler.on_dest(h, t.getDest(), read_ns); break;
    case schema::WorkerTask::CANCEL:
      if (transports.withdraw(h)) break;  // answered once its writes in progress end
      if (!(swap != nullptr && swap->cancel(h))) scheduler.on_cancel(h);
      break;
    case schema::WorkerTask::EXPECT:
      if (Status s = transports.expect(h, t.getExpect()); !s)
        reports.report(h, ReportKind::kFailed, 0, s.error().message);
      break;
    case schema::WorkerTask::CONNECT: {
      Status s = transports.check_connect(t.getConnect());
      reports.report(h, s ? ReportKind::kConnected : ReportKind::kConnectFailed, 0,
                     s ? "" : s.error().message);
      break;
    }
    case schema::WorkerTask::SWAP:
      if (swap != nullptr) {
        swap->submit(h, t.getSwap(), t.getProgressSlot(), t.getProgressGeneration());
      } else {
        reports.report(h, ReportKind::kFailed, 0,
                       "this instance has no host tier (--num-host-blocks is 0)");
      }
      break;
    case schema::WorkerTask::REGISTER_POOL:
      register_pool(t, data, reports, effect);
      break;
    case schema::WorkerTask::SHUTDOWN: effect.shutdown = true; break;
    case schema::WorkerTask::SESSION_ENDED:
      scheduler.on_session_ended(t.getSessionEnded());
      effect.session_ended = t.getSessionEnded();
      break;
  }
  return effect;
}

}  // namespace kvrelay::worker
