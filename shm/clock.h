// Monotonic time and deadlines shared between processes: the public types
// (kvrelay/deadline.h), used unchanged inside kvrelay.
#pragma once

#include "kvrelay/deadline.h"
