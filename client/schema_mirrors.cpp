// The public enums (kvrelay/client.h, kvrelay/types.h) mirror the schema's
// value for value: the client casts between them. A schema that gains or
// renumbers a value stops this file compiling until the mirror follows.
#include "kvrelay/client.h"
#include "schemas/kvrelay.capnp.h"

namespace kvrelay {
namespace {

template <class Public, class Schema>
constexpr bool same(Public p, Schema s) {
  return static_cast<uint32_t>(p) == static_cast<uint32_t>(s);
}

using S = schema::Completion::Status;
static_assert(same(CompletionStatus::kFinished, S::FINISHED));
static_assert(same(CompletionStatus::kError, S::ERROR));
static_assert(same(CompletionStatus::kCancelled, S::CANCELLED));
static_assert(same(CompletionStatus::kTimeout, S::TIMEOUT));
static_assert(same(CompletionStatus::kRejected, S::REJECTED));

using K = schema::Completion::Kind;
static_assert(same(CompletionKind::kCache, K::CACHE));
static_assert(same(CompletionKind::kSwap, K::SWAP));
static_assert(same(CompletionKind::kConnect, K::CONNECT));
static_assert(same(CompletionKind::kRegisterPool, K::REGISTER_POOL));
static_assert(same(CompletionKind::kOther, K::OTHER));
static_assert(same(CompletionKind::kCancel, K::CANCEL));
static_assert(same(CompletionKind::kArrived, K::ARRIVED));

using P = schema::TransferProtocol;
static_assert(same(Protocol::kIpc, P::IPC));
static_assert(same(Protocol::kTcp, P::TCP));
static_assert(same(Protocol::kRdma, P::RDMA));

using D = schema::CacheDtype;
static_assert(same(CacheDtype::kBf16, D::BFLOAT16));
static_assert(same(CacheDtype::kFp16, D::FLOAT16));
static_assert(same(CacheDtype::kUint8, D::UINT8));
static_assert(same(CacheDtype::kFp8, D::FP8));

using T = schema::PoolDescriptor::Tier;
static_assert(same(PoolTier::kDevice, T::DEVICE));
static_assert(same(PoolTier::kHost, T::HOST));

}  // namespace
}  // namespace kvrelay
