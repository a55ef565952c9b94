// Messages as ring records: the one place where the codec (codec.h, which
// knows nothing of rings) meets the MPSC ring (shm/mpsc_ring.h, which knows
// nothing of capnp). The client library, the coordinator and the workers
// write their messages through it.
#pragma once

#include <capnp/message.h>

#include "schemas/codec.h"
#include "shm/clock.h"
#include "shm/mpsc_ring.h"
#include "shm/result.h"

namespace kvrelay::messages {

// Serializes `message` as one ring record of type `type`. kFull/kTimeout when
// the ring has no room (nothing written), kTooLarge when the message exceeds
// the ring's record limit (the error names both sizes).
Status write_message(MpscProducer& producer, schema::MessageType type,
                     capnp::MessageBuilder& message, Deadline deadline);

}  // namespace kvrelay::messages
